"""Tables at fixed shapes for `latte bench ops`, by input distribution.

- latte_causal forward+backward at three shapes (a research-sweep model
  B=64 T=64 H=2 Lh=32 Dv=32; the paper's training length B=8 T=512 H=8
  Lh=32 Dv=64; a long sequence B=1 T=4096) for key logits of std 1, 10, 20,
  100, the distributions of a row in interleaved rounds;
- every provider at the research-sweep model's shape, on every --dists.

Legend: B batch, T time, H heads, Lh latents per head, Dv value width.
"""

from __future__ import annotations

import torch

from latte import reporting
from latte.ops import distributions as dists
from latte.ops import latte_causal

from . import common
from . import providers as P
from .providers import MODE_NAME, MODES, as_call

RULE = 1.3  # the audit's rule: the slowest distribution at most RULE x the fastest (benchmarks/audit.py)


def seeded_randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def timing_row(name: str, t: dict) -> dict:
    med = {d: r["median_ms"] for d, r in t.items()}
    ratio = max(med.values()) / min(med.values())
    return {"name": name, "median_ms": med, "times": t, "max_over_min": ratio, "within_rule": ratio <= RULE}


def timing_line(row: dict) -> str:
    return " ".join(f"{d} {v:.1f} ms" for d, v in row["median_ms"].items()) + f"  max/min {row['max_over_min']:.2f}"


CAUSAL_SHAPES = {  # name: (B, T, H, Lh, Dv)
    "sweep B=64 T=64 H=2 Lh=32 Dv=32": (64, 64, 2, 32, 32),
    "paper B=8 T=512 H=8 Lh=32 Dv=64": (8, 512, 8, 32, 64),
    "long B=1 T=4096 H=8 Lh=32 Dv=64": (1, 4096, 8, 32, 64),
}
QUICK_CAUSAL_SHAPES = {"quick B=2 T=64 H=2 Lh=8 Dv=8": (2, 64, 2, 8, 8)}
CAUSAL_DISTS = ("std1", "std10", "std20", "std100")


def causal_call(shape, dist):
    B, T, H, L, D = shape
    args = [
        seeded_randn(B, T, H, L, seed=1),
        dists.logits(seeded_randn(B, T, H, L, seed=2), dist),
        seeded_randn(B, T, H, D, seed=3),
    ]
    return as_call(lambda a, b, v: latte_causal(a, b, v)[0], args, "fwdbwd")


def causal_table(args) -> list[dict]:
    """latte_causal forward+backward by key-logit distribution at CAUSAL_SHAPES."""
    rows = []
    for name, shape in (QUICK_CAUSAL_SHAPES if args.quick else CAUSAL_SHAPES).items():
        t = common.time_interleaved(
            {d: causal_call(shape, d) for d in CAUSAL_DISTS}, repeats=args.repeats, warmup=args.warmup
        )
        rows.append(timing_row(name, t))
        print(f"  latte_causal {name}: " + timing_line(rows[-1]), flush=True)
    return rows


def causal_markdown(rows: list[dict]) -> list[str]:
    hdr = ["shape"] + [f"b {d}" for d in CAUSAL_DISTS] + ["max/min"]
    return [
        "",
        "## latte_causal forward+backward by key-logit distribution (median ms)",
        "",
        "Key logits b ~ N(0, std^2); query logits and values N(0, 1); default chunk_size. "
        "The distributions of a row are timed in interleaved rounds.",
        "",
        reporting.md_table(
            hdr, [[r["name"]] + [r["median_ms"][d] for d in CAUSAL_DISTS] + [f"{r['max_over_min']:.2f}"] for r in rows]
        ),
    ]


# A research-sweep model's attention (2 heads, 32 latents and 32 channels per head)
SWEEP_SHAPE = {"B": 64, "T": 64, "heads": 2, "latents": 32, "dv": 32}
SWEEP_PROVIDERS = ("latte", "macchiato", "sdpa", "naive-softmax", "linear")


def sweep_shape(args) -> list[dict]:
    """Every provider at SWEEP_SHAPE on every --dists, both modes: one
    interleaved timing per mode."""
    B, T = (4, 32) if args.quick else (SWEEP_SHAPE["B"], SWEEP_SHAPE["T"])
    shape = {k: SWEEP_SHAPE[k] for k in ("heads", "latents", "dv")}
    rows = []
    for mode in MODES:
        fns = {(p, d): P.build(p, T, mode, B=B, dist=d, **shape) for p in SWEEP_PROVIDERS for d in args.dists}
        times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
        rows += [{"provider": p, "dist": d, "mode": mode, "B": B, "T": T, **shape, **t} for (p, d), t in times.items()]
        print(
            f"  sweep shape {mode}: " + " ".join(f"{p}/{d} {t['median_ms']:.1f}" for (p, d), t in times.items()),
            flush=True,
        )
    return rows


def sweep_shape_table(res: dict) -> list[str]:
    rows, ds = res.get("sweep_shape"), res["config"]["dists"]
    if not rows:
        return []
    r0 = rows[0]
    med = {(r["provider"], r["dist"], r["mode"]): r["median_ms"] for r in rows}
    hdr = ["mode"] + [f"{p} {d}" for p in SWEEP_PROVIDERS for d in ds]
    body = [[MODE_NAME[m]] + [med[(p, d, m)] for p in SWEEP_PROVIDERS for d in ds] for m in MODES]
    return [
        "",
        f"## A research-sweep model's attention: B={r0['B']} T={r0['T']} H={r0['heads']} "
        f"Lh={r0['latents']} Dv=E={r0['dv']} (median ms)",
        "",
        reporting.md_table(hdr, body),
    ]
