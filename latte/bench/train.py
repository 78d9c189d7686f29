"""`latte bench train`: training throughput per mixer, at the Table 6 preset
or at the research-sweep size.

One optimizer step = zero_grad + forward with labels + backward + AdamW step
(lr 5e-4, weight decay 0.01, the paper's recipe; dropout 0.1 as in the
preset, model in train mode). Tokens/s = batch * sequence / median step time.
The batch is `--tokens-per-step // sequence` (at least 1), so that one step
takes seconds on a 2-core CPU; the batch used is recorded.

`--preset sweep` is the size of an MQAR-like research sweep (dim 64, two
layers of two heads, 64 latents, window 16, vocabulary 8192, T 64, batch
64), where per-op overhead rather than arithmetic sets the step time.
A mixer may name its qk mixer (`latte:none`). `--compile` also times each
variant under torch.compile(model) and reports eager / compiled step time.

    python -m latte.bench.train [--quick] [--preset sweep] [--compile] [--threads 2] [--out bench-results]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from . import common
from .device import DTYPES, add_device_args, check_device, device_info, resolve_device_args, synced

MIXERS = ("latte", "macchiato", "softmax", "linear", "swa")
FULL_SEQS, QUICK_SEQS, SWEEP_SEQS = [512, 4096], [32, 64], [64]
PRESETS = ("table6", "sweep")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="latte bench train", description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--mixers", default=",".join(MIXERS), help="comma-separated LatteConfig mixers")
    p.add_argument("--seqs", default=None, help="comma-separated sequence lengths (default 512,4096)")
    p.add_argument("--tokens-per-step", type=int, default=None, help="batch = this // sequence (default 4096)")
    p.add_argument("--preset", choices=PRESETS, default="table6",
                   help="model size: the paper's Table 6 (default) or the research-sweep size (T 64, batch 64)")
    p.add_argument("--compile", action="store_true", help="also time every variant under torch.compile(model)")
    add_device_args(p)
    p.add_argument("--backends", default=None,
                   help="latte.ops backends for the latte and macchiato mixers (default: torch on CPU, torch,fla on CUDA)")
    args = p.parse_args(argv)
    resolve_device_args(p, args)
    args.backends = (args.backends or ("torch" if args.device == "cpu" else "torch,fla")).split(",")
    args.mixers = [m for m in args.mixers.split(",") if m]
    default_seqs = QUICK_SEQS if args.quick else SWEEP_SEQS if args.preset == "sweep" else FULL_SEQS
    args.seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else default_seqs
    args.tokens_per_step = args.tokens_per_step or (128 if args.quick else 4096)
    return args


def make_config(spec: str, quick: bool, seq: int, preset: str = "table6"):
    """spec: a LatteConfig mixer, optionally with its qk mixer ("latte:none")."""
    from latte.models import LatteConfig

    mixer, _, qk = spec.partition(":")
    extra = {"qk_mixer": qk} if qk else {}
    if quick:
        return LatteConfig.tiny(mixer=mixer, max_position_embeddings=max(4096, seq), **extra)
    if preset == "sweep":
        return LatteConfig(vocab_size=8192, dim=64, num_layers=2, num_heads=2, num_latents=64, window_size=16,
                           mixer=mixer, max_position_embeddings=max(64, seq), **extra)
    # learned positions sized to the sequence (the table's 512 covers only the shorter one)
    return LatteConfig.paper_table6(mixer=mixer, max_position_embeddings=max(512, seq), **extra)


def build_point(spec: str, seq: int, args, backend: str = "torch", compiled: bool = False) -> dict:
    """A model, optimizer and batch for one variant and sequence, and two calls:
    one training step, and forward+backward of the first attention layer alone
    on a batch of the same shape (times num_layers: the step's attention share).
    On CUDA the calls synchronise and run under autocast to --dtype; `backend`
    (latte.ops.set_backend) is set by each call, so points can interleave.
    compiled: the model (and the layer) under torch.compile."""
    from latte.models import LatteForCausalLM
    from latte.ops import set_backend

    cfg = make_config(spec, args.quick, seq, args.preset)
    torch.manual_seed(0)
    dev = args.device
    model = LatteForCausalLM(cfg).train().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    batch = max(1, args.tokens_per_step // seq)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
    x = torch.randn(batch, seq, cfg.dim, generator=g).to(dev).requires_grad_(True)
    layer = model.model.blocks[0].mixer
    forward, layer_fwd = (torch.compile(model), torch.compile(layer)) if compiled else (model, layer)
    amp = dev == "cuda" and args.dtype != "float32"

    def step():
        set_backend(backend)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, DTYPES[args.dtype], enabled=amp):
            loss = forward(ids, labels=ids).loss  # train mode: the fused head + loss
        loss.backward()
        opt.step()

    def attention():
        set_backend(backend)
        with torch.autocast(dev, DTYPES[args.dtype], enabled=amp):
            y, _ = layer_fwd(x)
        y.float().sum().backward()

    return {"mixer": label_of(spec, backend, compiled), "seq": seq, "batch": batch, "tokens_per_step": batch * seq,
            "num_layers": cfg.num_layers, "params": sum(p.numel() for p in model.parameters()),
            "compiled": compiled, "step": synced(step, dev), "attention": synced(attention, dev)}


def label_of(spec: str, backend: str, compiled: bool) -> str:
    return spec + ("" if backend == "torch" else f"[{backend}]") + (" compiled" if compiled else "")


def variants(args) -> list[tuple[str, str, bool]]:
    """(mixer spec, backend, compiled): backends matter only where latents run."""
    latent = lambda spec: spec.partition(":")[0] in ("latte", "macchiato")  # noqa: E731
    return [(m, b, c) for m in args.mixers for b in (args.backends if latent(m) else ["torch"])
            for c in ((False, True) if args.compile else (False,))]


def bench_seq(seq: int, args) -> list[dict]:
    """All mixers at one sequence length, timed in interleaved rounds."""
    points, rows, compile_s = {}, [], {}
    for spec, backend, compiled in variants(args):
        label = label_of(spec, backend, compiled)
        try:
            point = build_point(spec, seq, args, backend, compiled)
            t0 = time.perf_counter()
            point["step"]()  # a first call: what cannot run (a backend, memory) fails here
            point["attention"]()
            if compiled:
                compile_s[label] = time.perf_counter() - t0  # the compiles
            points[label] = point
        except (ImportError, ValueError, RuntimeError) as e:  # model code missing, OOM, backend unusable
            rows.append({"mixer": label, "seq": seq, **common.skipped(f"unavailable: {type(e).__name__}: {e}")})
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
            **({"compile_s": compile_s[m]} if m in compile_s else {}),
        })
        print(f"  {m:22s} seq={seq:5d} batch={p['batch']:3d} {t['median_ms'] / 1e3:7.2f} s/step "
              f"{rows[-1]['tokens_per_s']:9.0f} tok/s  attention layers {attn_ms / 1e3:6.2f} s", flush=True)
    points.clear()
    return rows


def _model_dict(args) -> dict | None:
    """The resolved config of the first mixer at the longest sequence."""
    try:
        return make_config(args.mixers[0], args.quick, max(args.seqs), args.preset).to_dict()
    except (ImportError, ValueError, IndexError):
        return None


def run(args) -> dict:
    from latte.ops import set_backend

    check_device(args.device)
    common.set_threads(args.threads)
    info = {**common.machine_info(), **device_info(args.device)}
    rows = []
    try:
        for seq in args.seqs:
            rows += bench_seq(seq, args)
    finally:
        set_backend(None)
    labels = [label_of(*v) for v in variants(args)]
    status = {m: next((r["reason"] for r in rows if r["mixer"] == m and r.get("skipped")), "ok")
              for m in labels}
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    res = {
        "benchmark": "train", "machine": info,
        "config": {
            "threads": args.threads, "device": args.device, "dtype": args.dtype, "quick": args.quick,
            "preset": args.preset, "compile": args.compile, "seqs": args.seqs, "mixers": labels,
            "backends": args.backends, "tokens_per_step": args.tokens_per_step, "repeats": args.repeats,
            "warmup": args.warmup, "optimizer": "AdamW(lr=5e-4, weight_decay=0.01)",
            "model": _model_dict(args),
            "timing": "wall clock of zero_grad + forward(labels) + backward + AdamW.step; mixers "
                      "interleaved round by round; attention = first mixer layer fwd+bwd x num_layers",
        },
        "mixers": status, "results": rows,
    }
    res["ratios"] = step_ratios(res)
    return res


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


def step_ratios(res: dict) -> dict:
    """Per sequence, each variant's step time over softmax's (eager over
    eager, compiled over compiled) and, with --compile, eager over compiled."""
    cell = {(r["mixer"], r["seq"]): r["median_ms"] for r in res["results"] if not r.get("skipped")}
    out = {"over_softmax": {}, "eager_over_compiled": {}}
    for (label, seq), ms in cell.items():
        compiled = label.endswith(" compiled")
        base = cell.get(("softmax compiled" if compiled else "softmax", seq))
        if base:
            out["over_softmax"].setdefault(str(seq), {})[label] = ms / base
        if compiled and (label[: -len(" compiled")], seq) in cell:
            out["eager_over_compiled"].setdefault(str(seq), {})[label[: -len(" compiled")]] = \
                cell[(label[: -len(" compiled")], seq)] / ms
    return out


def _ratio_table(ratios: dict, seqs: list, labels: list) -> list[str]:
    if not ratios["over_softmax"]:
        return []
    hdr = ["mixer"] + [f"seq {s}: step / softmax's" for s in seqs]
    plain = [m for m in labels if not m.endswith(" compiled")]
    if ratios["eager_over_compiled"]:
        hdr += [f"seq {s}: eager / compiled" for s in seqs]
    rows = []
    for m in labels:
        row = [m] + [ratios["over_softmax"].get(str(s), {}).get(m, "-") for s in seqs]
        if ratios["eager_over_compiled"]:
            row += [ratios["eager_over_compiled"].get(str(s), {}).get(m, "-") if m in plain else "" for s in seqs]
        rows.append(row)
    return ["", "Ratios from the same run (step time over softmax's, eager with eager and compiled with "
            "compiled; eager over compiled step time per mixer):", "",
            common.md_table(hdr, [[c if isinstance(c, str) else f"{c:.2f}" for c in r] for r in rows])]


def where(machine: dict) -> str:
    return machine.get("gpu") or f"{machine['cpu_model']}, {machine['threads']} threads"


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["mixer"], r["seq"]): r for r in res["results"]}
    hdr = ["mixer", "params (M)"] + [f"seq {s}: batch / s per step / tok/s / attention share" for s in cfg["seqs"]]
    rows = []
    for mx in cfg["mixers"]:
        ok = [cell[(mx, s)] for s in cfg["seqs"] if not cell.get((mx, s), {"skipped": True}).get("skipped")]
        row = [mx, f"{ok[0]['params'] / 1e6:.3f}" if ok else "-"]
        for s in cfg["seqs"]:
            r = cell.get((mx, s))
            row.append("skip" if r is None or r.get("skipped") else
                       f"{r['batch']} / {r['median_ms'] / 1e3:.2f} / {r['tokens_per_s']:,.0f} / "
                       f"{r.get('attention_share', float('nan')):.0%}")
        rows.append(row)
    size = "quick, tiny model" if cfg["quick"] else ("research-sweep size" if cfg.get("preset") == "sweep"
                                                     else "Table 6 preset")
    out = [f"# latte bench train ({size})", "",
           f"{where(m)}, torch {m['torch']}, {cfg.get('dtype', 'float32')}; one AdamW step (fused LM "
           f"head + loss), median of {cfg['repeats']} steps, mixers interleaved round by round. Attention "
           f"share = forward+backward of one mixer layer alone x layers / step time.", "",
           common.md_table(hdr, rows)]
    out += _ratio_table(res.get("ratios") or step_ratios(res), cfg["seqs"], cfg["mixers"])
    notes = _ratio_notes(cell, cfg["seqs"])
    skips = [f"- {r['mixer']} @ {r['seq']}: {r['reason']}" for r in res["results"] if r.get("skipped")]
    return "\n".join(out + ([""] + notes if notes else []) + ([""] + skips if skips else [])) + "\n"


def plot(res: dict, path) -> bool:
    series = {}
    for mx in res["config"]["mixers"]:
        pts = [(r["seq"], r["tokens_per_s"]) for r in res["results"] if r["mixer"] == mx and not r.get("skipped")]
        series[mx] = ([s for s, _ in pts], [v for _, v in pts])
    m = res["machine"]
    return common.plot_loglog(path, {"training throughput": series}, xlabel="sequence length",
                              ylabel="tokens / s", title=f"latte bench train: {where(m)}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    res = run(args)
    common.write_outputs(args, "train" if args.device == "cpu" else f"train-{args.device}", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
