"""`python -m benchmarks.train`: training throughput per mixer, at the Table 6 preset
or at the research-sweep size.

One optimizer step = zero_grad + forward with labels + backward + AdamW step
(lr 5e-4, weight decay 0.01, the paper's recipe; dropout 0.1 as in the
preset, model in train mode). Tokens/s = batch * sequence / median step time.
The batch is `--tokens-per-step // sequence` (at least 1), so that one step
takes seconds on a 2-core CPU (4,096 tokens); on CUDA the default is
65,536 tokens a step (batch 16 at T = 4K), so that arithmetic rather than
kernel launches bounds the step, and AdamW runs its fused kernels; the
batch used is recorded.

`--preset sweep` is the size of an MQAR-like research sweep (dim 64, two
layers of two heads, 64 latents, window 16, T 64, batch 64), where per-op
overhead rather than arithmetic sets the step time, in two sizes side by
side (`--sizes`): vocabulary 8192 (mlp_ratio 4) and vocabulary 256 with
mlp_ratio 1 (issue 25's measurement, where the attention layers dominate;
labelled "@v256"). `--batch 64 --seqs 64,256` times the layers and steps at
batch 64 for both sequence lengths.
A mixer may name its qk mixer (`latte:none`). The latent mixers are also
timed with sharper key logits (`--dists`, as training makes them).
`--compile` also times each variant under torch.compile(model) and reports
eager / compiled step time; the report is written by train_report.py.

    python -m benchmarks.train [--quick] [--preset sweep] [--compile] [--threads 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import torch

from benchmarks import RESULTS
from latte import bench as common
from latte import reporting
from latte.arguments import int_at_least, int_list, name_list
from latte.bench import DTYPES, QK_MIXERS, add_device_args, check_device, device_info, resolve_device_args, synced
from latte.models import MIXERS as CONFIG_MIXERS
from latte.models import LatteConfig, LatteForCausalLM
from latte.ops import distributions as dists
from latte.ops import get_backend, set_backend

from .step_profile import profile_step
from .train_report import markdown, output_name, plot, step_ratios

MIXERS = ("latte", "macchiato", "softmax", "linear", "swa")
LATENT = ("latte", "macchiato")  # mixers with key logits: also timed on the other --dists
FULL_SEQS, QUICK_SEQS, SWEEP_SEQS = [512, 4096], [32, 64], [64]
PRESETS = ("table6", "sweep")
CPU_TOKENS, CUDA_TOKENS = 4096, 65536  # default tokens a step (--tokens-per-step)
# the research-sweep sizes (--preset sweep): LatteConfig fields over the common ones
SWEEP_SIZES = {"v8192": {"vocab_size": 8192}, "v256": {"vocab_size": 256, "mlp_ratio": 1.0}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.train", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    p.add_argument(
        "--mixers",
        default=",".join(MIXERS),
        type=_mixer_specs,
        help="comma-separated LatteConfig mixers, each optionally with its qk mixer (latte:none)",
    )
    _add_shape_args(p)
    p.add_argument(
        "--sizes",
        default=",".join(SWEEP_SIZES),
        help=f"--preset sweep: model sizes side by side, of {list(SWEEP_SIZES)} (default both)",
    )
    p.add_argument(
        "--dists",
        default="std1,std10",
        help="key-logit distributions of the latent mixers, side by side (std<N>: the key projection "
        "scaled so that the key logits have std N on the batch, as in a trained model)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sequence lengths of an earlier train.json in --out (a full run split "
        "into shorter ones, e.g. one quiet window per sequence length)",
    )
    p.add_argument(
        "--preset",
        choices=PRESETS,
        default="table6",
        help="model size: the paper's Table 6 (default) or the research-sweep size (T 64, batch 64)",
    )
    p.add_argument("--compile", action="store_true", help="also time every variant under torch.compile(model)")
    p.add_argument(
        "--tag",
        default=None,
        type=_tag,
        help="a word appended to the output name (train-sweep-TAG), for a run beside the usual one "
        "with other settings, e.g. --tag 1thread with --threads 1",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile a few steps of every eager variant (op counts, top ops)",
    )
    add_device_args(p)
    p.add_argument(
        "--backends",
        default=None,
        help="latte.ops backends for the latte and macchiato mixers (default: torch on CPU, torch,fla on CUDA)",
    )
    return _resolved(p, p.parse_args(argv))


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    """The sequence lengths and batches timed (parse_args)."""
    p.add_argument(
        "--seqs", default=None, type=int_list(low=1), help="comma-separated sequence lengths (default 512,4096)"
    )
    p.add_argument(
        "--tokens-per-step",
        type=int_at_least(1),
        default=None,
        help=f"batch = this // sequence (default {CPU_TOKENS} on the CPU, {CUDA_TOKENS} on CUDA)",
    )
    p.add_argument(
        "--batch", type=int_at_least(1), default=None, help="one batch for every sequence (default: --tokens-per-step)"
    )


def _resolved(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The parsed arguments checked and their defaults filled in (parse_args)."""
    resolve_device_args(p, args)
    args.dists = [d for d in args.dists.split(",") if d]
    if not args.dists or any(not d.startswith("std") or d not in dists.DISTRIBUTIONS for d in args.dists):
        p.error(f"--dists: expected std distributions of {list(dists.DISTRIBUTIONS)}, got {args.dists}")
    args.backends = (args.backends or ("torch" if args.device == "cpu" else "torch,fla")).split(",")
    args.mixers = list(args.mixers)
    default_seqs = QUICK_SEQS if args.quick else SWEEP_SEQS if args.preset == "sweep" else FULL_SEQS
    args.seqs = list(args.seqs or default_seqs)
    args.tokens_per_step = args.tokens_per_step or (
        128 if args.quick else CUDA_TOKENS if args.device == "cuda" else CPU_TOKENS
    )
    args.sizes = [z for z in args.sizes.split(",") if z] if args.preset == "sweep" and not args.quick else [""]
    if any(z and z not in SWEEP_SIZES for z in args.sizes) or not args.sizes:
        p.error(f"--sizes: expected some of {list(SWEEP_SIZES)}, got {args.sizes}")
    return args


def fused_optimizer(device: str) -> bool | None:
    """AdamW's fused kernels on CUDA (one launch for every parameter); its default elsewhere."""
    return True if device == "cuda" else None


def _tag(text: str) -> str:
    """--tag: lowercase letters, digits and inner hyphens (it names files and a README section)."""
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", text):
        raise argparse.ArgumentTypeError(
            f"expected lowercase letters, digits and inner hyphens (it names files), got {text!r}"
        )
    return text


def _mixer_specs(text: str) -> tuple[str, ...]:
    """--mixers "latte:none,softmax": LatteConfig mixers, each with an optional qk mixer."""
    specs = name_list([*CONFIG_MIXERS, *(f"{m}:{q}" for m in LATENT for q in QK_MIXERS)])
    try:
        return specs(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (a latent mixer may name its qk mixer: latte:none)") from None


def make_config(spec: str, quick: bool, seq: int, preset: str = "table6", size: str = "v8192"):
    """spec: a LatteConfig mixer, optionally with its qk mixer ("latte:none");
    size: one of SWEEP_SIZES (the sweep preset)."""

    mixer, _, qk = spec.partition(":")
    extra = {"qk_mixer": qk} if qk else {}
    if quick:
        return LatteConfig.tiny(mixer=mixer, max_position_embeddings=max(4096, seq), **extra)
    if preset == "sweep":
        return LatteConfig(
            **SWEEP_SIZES[size or "v8192"],
            dim=64,
            num_layers=2,
            num_heads=2,
            latents_per_head=32,  # 64 over the 2 heads
            window_size=16,
            mixer=mixer,
            max_position_embeddings=max(64, seq),
            **extra,
        )
    # learned positions sized to the sequence (the table's 512 covers only the shorter one)
    return LatteConfig.paper_table6(mixer=mixer, max_position_embeddings=max(512, seq), **extra)


def sharpen_key_logits(model, ids, std: float) -> None:
    """Scale every latent layer's key projection (b_proj) so that its key
    logits on this batch have standard deviation `std` (dropout off), as
    training makes them (they start near 1). Layer by layer: scaling one
    changes what the later ones see. Runs where the model is (the CPU, before
    build_point moves it) on the project's torch kernels, whatever backend a
    previous point's calls left set; that default is restored after."""
    layers = [m for m in model.modules() if isinstance(getattr(m, "b_proj", None), torch.nn.Linear)]
    was_training, backend = model.training, get_backend()
    set_backend("torch")
    model.eval()
    for m in layers:
        seen = []
        hook = m.b_proj.register_forward_hook(
            lambda mod, inp, out, seen=seen: seen.append(out.detach().std())
        )  # -> None: output kept
        with torch.no_grad():
            model(ids)
            hook.remove()
            factor = std / seen[0].clamp_min(1e-12)
            m.b_proj.weight.mul_(factor)
            if m.b_proj.bias is not None:
                m.b_proj.bias.mul_(factor)
    model.train(was_training)
    set_backend(backend)


def build_point(
    spec: str, seq: int, args, dist: str = "std1", backend: str = "torch", compiled: bool = False, size: str = ""
) -> dict:
    """A model, optimizer and batch for one variant (mixer spec, key-logit
    distribution, backend, compiled) and sequence, and two calls: one training
    step, and forward+backward of the first attention layer alone on a batch
    of the same shape (times num_layers: the step's attention share). On CUDA
    the calls synchronise and run under autocast to --dtype; `backend`
    (latte.ops.set_backend) is set by each call, so points can interleave."""

    cfg = make_config(spec, args.quick, seq, args.preset, size)
    torch.manual_seed(0)
    dev = args.device
    model = LatteForCausalLM(cfg).train()
    batch = args.batch or max(1, args.tokens_per_step // seq)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    if dist != "std1":
        sharpen_key_logits(model, ids, dists.scale(dist))
    model, ids = model.to(dev), ids.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01, fused=fused_optimizer(dev))
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

    return {
        "mixer": spec,
        "dist": dist,
        "backend": backend,
        "compiled": compiled,
        "size": size,
        "label": label_of(spec, dist, args.dists, backend, compiled, size),
        "seq": seq,
        "batch": batch,
        "tokens_per_step": batch * seq,
        "num_layers": cfg.num_layers,
        "params": sum(p.numel() for p in model.parameters()),
        "step": synced(step, dev),
        "attention": synced(attention, dev),
    }


def label_of(
    spec: str, dist: str, all_dists: list[str], backend: str = "torch", compiled: bool = False, size: str = ""
) -> str:
    return (
        spec
        + ("" if backend == "torch" else f"[{backend}]")
        + ("" if dist == all_dists[0] else f" (b {dist})")
        + ("" if size in ("", "v8192") else f" @{size}")
        + (" compiled" if compiled else "")
    )


def variants(args) -> list[tuple[str, str, str, bool, str]]:
    """(mixer spec, dist, backend, compiled, size): every mixer on the first
    distribution and the torch backend, the latent ones on all of them, in
    every size."""
    latent = lambda spec: spec.partition(":")[0] in LATENT  # noqa: E731
    return [
        (m, d, b, c, z)
        for z in args.sizes
        for m in args.mixers
        for d in (args.dists if latent(m) else args.dists[:1])
        for b in (args.backends if latent(m) else ["torch"])
        for c in ((False, True) if args.compile else (False,))
    ]


def _first_calls(point: dict) -> float:
    """One step and one layer call: what cannot run (a backend, memory) fails
    here, and a compiled variant compiles here. Returns the seconds taken."""
    t0 = time.perf_counter()
    point["step"]()
    point["attention"]()
    return time.perf_counter() - t0


def bench_seq(seq: int, args) -> list[dict]:
    """All variants at one sequence length, timed in interleaved rounds."""
    points, rows, compile_s = {}, [], {}
    for spec, dist, backend, compiled, size in variants(args):
        name = label_of(spec, dist, args.dists, backend, compiled, size)
        try:
            point = build_point(spec, seq, args, dist, backend, compiled, size)
            first_s = _first_calls(point)
            if compiled:
                compile_s[name] = first_s
            points[name] = point
        except (ImportError, ValueError, RuntimeError) as e:  # model code missing, OOM, backend unusable
            rows.append(
                {
                    "mixer": spec,
                    "dist": dist,
                    "size": size,
                    "label": name,
                    "seq": seq,
                    **common.skipped(f"unavailable: {type(e).__name__}: {e}"),
                }
            )
    steps = common.time_interleaved({m: p["step"] for m, p in points.items()}, repeats=args.repeats, warmup=args.warmup)
    layers = common.time_interleaved(
        {m: p["attention"] for m, p in points.items()}, repeats=args.repeats, warmup=args.warmup
    )
    profiles = {m: profile_step(p["step"]) for m, p in points.items() if args.profile and not p["compiled"]}
    for m, p in points.items():
        t = steps[m]
        attn_ms = layers[m]["median_ms"] * p["num_layers"]
        rows.append(
            {
                **{k: v for k, v in p.items() if k not in ("step", "attention")},
                **t,
                "tokens_per_s": p["tokens_per_step"] / (t["median_ms"] / 1e3),
                "attention_layer_ms": layers[m]["median_ms"],
                "attention_ms": attn_ms,
                "attention_share": attn_ms / t["median_ms"],
                **({"compile_s": compile_s[m]} if m in compile_s else {}),
                **({"profile": profiles[m]} if m in profiles else {}),
            }
        )
        print(
            f"  {m:28s} seq={seq:5d} batch={p['batch']:3d} {t['median_ms'] / 1e3:7.3f} s/step "
            f"{rows[-1]['tokens_per_s']:9.0f} tok/s  attention layers {attn_ms / 1e3:6.3f} s",
            flush=True,
        )
    points.clear()
    return rows


def _model_dict(args) -> dict | None:
    """The resolved config of the first mixer at the longest sequence."""
    try:
        return make_config(args.mixers[0], args.quick, max(args.seqs), args.preset).to_dict()
    except (ImportError, ValueError, IndexError):
        return None


def run(args) -> dict:
    check_device(args.device)
    common.set_threads(args.threads)
    info = {**reporting.machine_info(), **device_info(args.device)}
    rows = []
    try:
        for seq in args.seqs:
            rows += bench_seq(seq, args)
    finally:
        set_backend(None)
    labels = [label_of(m, d, args.dists, b, c, z) for m, d, b, c, z in variants(args)]
    status = {m: next((r["reason"] for r in rows if r["label"] == m and r.get("skipped")), "ok") for m in labels}
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "train",
        "machine": info,
        "config": {
            "threads": args.threads,
            "device": args.device,
            "dtype": args.dtype,
            "quick": args.quick,
            "preset": args.preset,
            "compile": args.compile,
            "tag": args.tag,
            "profile": args.profile,
            "seqs": args.seqs,
            "mixers": args.mixers,
            "dists": args.dists,
            "backends": args.backends,
            "variants": labels,
            "key_logits": "std<N>: every latent layer's b_proj scaled so its key logits have std N on the batch",
            "tokens_per_step": args.tokens_per_step,
            "batch": args.batch,
            "sizes": {z: SWEEP_SIZES[z] for z in args.sizes if z},
            "repeats": args.repeats,
            "warmup": args.warmup,
            "optimizer": f"AdamW(lr=5e-4, weight_decay=0.01, fused={fused_optimizer(args.device)})",
            "model": _model_dict(args),
            "timing": "wall clock of zero_grad + forward(labels) + backward + AdamW.step; mixers "
            "interleaved round by round; attention = first mixer layer fwd+bwd x num_layers",
        },
        "mixers": status,
        "results": rows,
    }


def merge_earlier(res: dict, path) -> dict:
    """res with the rows of the earlier run at `path` for sequence lengths it
    did not measure itself (same variants required)."""
    prev = json.loads(path.read_text())
    same = {"variants": None, "quick": None, "preset": "table6", "device": "cpu", "dtype": "float32"}  # key: default
    if any(prev["config"].get(k, d) != res["config"].get(k, d) for k, d in same.items()):
        raise ValueError(f"--merge: {path} differs in one of {list(same)}; run without --merge")
    seqs = res["config"]["seqs"]
    kept = [r for r in prev["results"] if r["seq"] not in seqs]
    res["results"] = kept + res["results"]
    res["config"]["seqs"] = sorted(set(seqs) | {r["seq"] for r in kept})
    res["merged"] = {"from": str(path), "seqs": sorted({r["seq"] for r in kept}), "machine": prev["machine"]}
    return res


def main(argv=None) -> dict:
    args = parse_args(argv)
    # the folder and --readme now; its files (named by the results) when written
    common.claim_outputs(args, "train", sections=[output_name(vars(args))])
    res = run(args)
    name = output_name(res["config"])
    if args.merge and (args.out / f"{name}.json").exists():
        res = merge_earlier(res, args.out / f"{name}.json")
    res["ratios"] = step_ratios(res)
    common.write_outputs(args, name, res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.train", main, sys.argv[1:]))
