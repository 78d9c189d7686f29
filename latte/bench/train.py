"""`latte bench train`: training throughput of the Table 6 preset per mixer.

One optimizer step = zero_grad + forward with labels + backward + AdamW step
(lr 5e-4, weight decay 0.01, the paper's recipe; dropout 0.1 as in the
preset, model in train mode). Tokens/s = batch * sequence / median step time.
The batch is `--tokens-per-step // sequence` (at least 1), so that one step
takes seconds on a 2-core CPU; the batch used is recorded.

    python -m latte.bench.train [--quick] [--threads 2] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from . import common
from . import inputs as dists

MIXERS = ("latte", "macchiato", "softmax", "linear", "swa")
LATENT = ("latte", "macchiato")  # mixers with key logits: also timed on the other --dists
FULL_SEQS, QUICK_SEQS = [512, 4096], [32, 64]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="latte bench train", description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated LatteConfig mixers")
    p.add_argument("--seqs", default=None, help="comma-separated sequence lengths (default 512,4096)")
    p.add_argument("--tokens-per-step", type=int, default=None, help="batch = this // sequence (default 4096)")
    p.add_argument("--dists", default="std1,std10",
                   help="key-logit distributions of the latent mixers, side by side (std<N>: the key projection "
                        "scaled so that the key logits have std N on the batch, as in a trained model)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other sequence lengths of an earlier train.json in --out (a full run split "
                        "into shorter ones, e.g. one quiet window per sequence length)")
    args = p.parse_args(argv)
    args.dists = [d for d in args.dists.split(",") if d]
    if not args.dists or any(not d.startswith("std") or d not in dists.DISTRIBUTIONS for d in args.dists):
        p.error(f"--dists: expected std distributions of {list(dists.DISTRIBUTIONS)}, got {args.dists}")
    args.mixers = [m for m in args.mixers.split(",") if m]
    args.seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else (QUICK_SEQS if args.quick else FULL_SEQS)
    args.tokens_per_step = args.tokens_per_step or (128 if args.quick else 4096)
    return args


def make_config(mixer: str, quick: bool, seq: int):
    from latte.models import LatteConfig

    if quick:
        return LatteConfig.tiny(mixer=mixer, max_position_embeddings=max(4096, seq))
    # learned positions sized to the sequence (the table's 512 covers only the shorter one)
    return LatteConfig.paper_table6(mixer=mixer, max_position_embeddings=max(512, seq))


def sharpen_key_logits(model, ids, std: float) -> None:
    """Scale every latent layer's key projection (b_proj) so that its key
    logits on this batch have standard deviation `std` (dropout off), as
    training makes them (they start near 1). Layer by layer: scaling one
    changes what the later ones see."""
    layers = [m for m in model.modules() if isinstance(getattr(m, "b_proj", None), torch.nn.Linear)]
    was_training = model.training
    model.eval()
    for m in layers:
        seen = []
        hook = m.b_proj.register_forward_hook(lambda mod, inp, out: seen.append(out.detach().std()))  # -> None: output kept
        with torch.no_grad():
            model(ids)
            hook.remove()
            factor = std / seen[0].clamp_min(1e-12)
            m.b_proj.weight.mul_(factor)
            if m.b_proj.bias is not None:
                m.b_proj.bias.mul_(factor)
    model.train(was_training)


def build_point(mixer: str, seq: int, args, dist: str = "std1") -> dict:
    """A model, optimizer and batch for one (mixer, sequence, key-logit
    distribution), and two calls: one training step, and forward+backward of
    the first attention layer alone on a batch of the same shape (times
    num_layers: the step's attention share)."""
    from latte.models import LatteForCausalLM

    cfg = make_config(mixer, args.quick, seq)
    torch.manual_seed(0)
    model = LatteForCausalLM(cfg).train()
    batch = max(1, args.tokens_per_step // seq)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    if dist != "std1":
        sharpen_key_logits(model, ids, dists.scale(dist))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    x = torch.randn(batch, seq, cfg.dim, generator=g, requires_grad=True)
    layer = model.model.blocks[0].mixer

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss  # train mode: the fused head + loss
        loss.backward()
        opt.step()

    def attention():
        y, _ = layer(x)
        y.sum().backward()

    return {"mixer": mixer, "dist": dist, "label": label(mixer, dist, args.dists),
            "seq": seq, "batch": batch, "tokens_per_step": batch * seq,
            "num_layers": cfg.num_layers, "params": sum(p.numel() for p in model.parameters()),
            "step": step, "attention": attention}


def label(mixer: str, dist: str, all_dists: list[str]) -> str:
    return mixer if dist == all_dists[0] else f"{mixer} (b {dist})"


def variants(args) -> list[tuple[str, str]]:
    """(mixer, dist): every mixer on the first distribution, the latent ones on all."""
    return [(m, d) for m in args.mixers for d in (args.dists if m in LATENT else args.dists[:1])]


def bench_seq(seq: int, args) -> list[dict]:
    """All mixers (and key-logit distributions) at one sequence length, timed
    in interleaved rounds."""
    points, rows = {}, []
    for m, d in variants(args):
        name = label(m, d, args.dists)
        try:
            points[name] = build_point(m, seq, args, d)
        except (ImportError, ValueError, RuntimeError) as e:  # model code missing, OOM
            rows.append({"mixer": m, "dist": d, "label": name, "seq": seq,
                         **common.skipped(f"unavailable: {type(e).__name__}: {e}")})
    steps = common.time_interleaved({m: p["step"] for m, p in points.items()},
                                    repeats=args.repeats, warmup=args.warmup)
    layers = common.time_interleaved({m: p["attention"] for m, p in points.items()},
                                     repeats=args.repeats, warmup=args.warmup)
    for m, p in points.items():
        t = steps[m]
        attn_ms = layers[m]["median_ms"] * p["num_layers"]
        rows.append({
            **{k: v for k, v in p.items() if k not in ("step", "attention")}, **t,
            "tokens_per_s": p["tokens_per_step"] / (t["median_ms"] / 1e3),
            "attention_layer_ms": layers[m]["median_ms"], "attention_ms": attn_ms,
            "attention_share": attn_ms / t["median_ms"],
        })
        print(f"  {m:18s} seq={seq:5d} batch={p['batch']:3d} {t['median_ms'] / 1e3:7.2f} s/step "
              f"{rows[-1]['tokens_per_s']:9.0f} tok/s  attention layers {attn_ms / 1e3:6.2f} s", flush=True)
    points.clear()
    return rows


def _model_dict(args) -> dict | None:
    """The resolved config of the first mixer at the longest sequence."""
    try:
        return make_config(args.mixers[0], args.quick, max(args.seqs)).to_dict()
    except (ImportError, ValueError, IndexError):
        return None


def run(args) -> dict:
    common.set_threads(args.threads)
    info = common.machine_info()
    rows = []
    for seq in args.seqs:
        rows += bench_seq(seq, args)
    status = {label(m, d, args.dists): next((r["reason"] for r in rows if r["label"] == label(m, d, args.dists)
                                              and r.get("skipped")), "ok") for m, d in variants(args)}
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "train", "machine": info,
        "config": {
            "threads": args.threads, "dtype": "float32", "quick": args.quick, "seqs": args.seqs,
            "mixers": args.mixers, "dists": args.dists, "variants": [label(m, d, args.dists) for m, d in variants(args)],
            "key_logits": "std<N>: every latent layer's b_proj scaled so its key logits have std N on the batch",
            "tokens_per_step": args.tokens_per_step, "repeats": args.repeats,
            "warmup": args.warmup, "optimizer": "AdamW(lr=5e-4, weight_decay=0.01)",
            "model": _model_dict(args),
            "timing": "wall clock of zero_grad + forward(labels) + backward + AdamW.step; mixers "
                      "interleaved round by round; attention = first mixer layer fwd+bwd x num_layers",
        },
        "mixers": status, "results": rows,
    }


def _ratio_notes(cell: dict, seqs: list, mixer: str = "macchiato", base: str = "softmax") -> list[str]:
    """mixer / base throughput per sequence, and the most it could be if the
    mixer's attention layers cost nothing (everything else unchanged)."""
    notes = []
    for s in seqs:
        a, b = cell.get((mixer, s)), cell.get((base, s))
        if not a or not b or a.get("skipped") or b.get("skipped"):
            continue
        rest = max(a["median_ms"] - a["attention_ms"], 1e-9)
        notes.append(f"- seq {s}: {mixer} / {base} tokens/s = {b['median_ms'] / a['median_ms']:.2f}x. "
                     f"Attention layers are {a['attention_share']:.0%} of the {mixer} step and "
                     f"{b['attention_share']:.0%} of the {base} step; with zero-cost attention layers "
                     f"{mixer} could reach at most {b['median_ms'] / rest:.2f}x.")
    return notes


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["label"], r["seq"]): r for r in res["results"]}
    hdr = ["mixer", "params (M)"] + [f"seq {s}: batch / s per step / tok/s / attention share" for s in cfg["seqs"]]
    rows = []
    for mx in cfg["variants"]:
        ok = [cell[(mx, s)] for s in cfg["seqs"] if not cell.get((mx, s), {"skipped": True}).get("skipped")]
        row = [mx, f"{ok[0]['params'] / 1e6:.3f}" if ok else "-"]
        for s in cfg["seqs"]:
            r = cell.get((mx, s))
            row.append("skip" if r is None or r.get("skipped") else
                       f"{r['batch']} / {r['median_ms'] / 1e3:.2f} / {r['tokens_per_s']:,.0f} / "
                       f"{r.get('attention_share', float('nan')):.0%}")
        rows.append(row)
    out = [f"# latte bench train ({'quick, tiny model' if cfg['quick'] else 'Table 6 preset'})", "",
           f"{m['cpu_model']}, torch {m['torch']}, {m['threads']} threads, fp32; one AdamW step (fused LM "
           f"head + loss), median of {cfg['repeats']} steps, mixers interleaved round by round. Attention "
           f"share = forward+backward of one mixer layer alone x layers / step time. \"(b stdN)\": the latent "
           f"layers' key projections scaled so their key logits have std N, as in a trained model.", "",
           common.md_table(hdr, rows)]
    if res.get("merged"):
        pm = res["merged"]["machine"]
        out += ["", f"Sequence length(s) {res['merged']['seqs']} from an earlier run ({pm['time_utc']}, load avg "
                    f"{pm['loadavg_start'][0]:.1f} at its start); the rest from this one ({m['time_utc']})."]
    notes = _ratio_notes(cell, cfg["seqs"])
    skips = [f"- {r['label']} @ {r['seq']}: {r['reason']}" for r in res["results"] if r.get("skipped")]
    return "\n".join(out + ([""] + notes if notes else []) + ([""] + skips if skips else [])) + "\n"


def plot(res: dict, path) -> bool:
    series = {}
    for mx in res["config"]["variants"]:
        pts = [(r["seq"], r["tokens_per_s"]) for r in res["results"] if r["label"] == mx and not r.get("skipped")]
        series[mx] = ([s for s, _ in pts], [v for _, v in pts])
    m = res["machine"]
    return common.plot_loglog(path, {"training throughput": series}, xlabel="sequence length",
                              ylabel="tokens / s", title=f"latte bench train: {m['cpu_model']}, {m['threads']} threads")


def merge_earlier(res: dict, path) -> dict:
    """res with the rows of the earlier run at `path` for sequence lengths it
    did not measure itself (same mixers and distributions required)."""
    prev = json.loads(path.read_text())
    if prev["config"]["variants"] != res["config"]["variants"] or prev["config"]["quick"] != res["config"]["quick"]:
        raise ValueError(f"--merge: {path} has other mixers / distributions / --quick; run without --merge")
    seqs = res["config"]["seqs"]
    kept = [r for r in prev["results"] if r["seq"] not in seqs]
    res["results"] = kept + res["results"]
    res["config"]["seqs"] = sorted(set(seqs) | {r["seq"] for r in kept})
    res["merged"] = {"from": str(path), "seqs": sorted({r["seq"] for r in kept}), "machine": prev["machine"]}
    return res


def main(argv=None) -> dict:
    args = parse_args(argv)
    res = run(args)
    if args.merge and (args.out / "train.json").exists():
        res = merge_earlier(res, args.out / "train.json")
    common.write_outputs(args, "train", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
