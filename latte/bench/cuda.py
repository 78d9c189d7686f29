"""`latte bench ops --device cuda`: the attention ops on a GPU.

Providers (docs/evaluation.md §1 shapes as on CPU: B=1, H=8, Lh=32, dv=64, W=128):
  latte          latte_causal on the project's torch kernels (backend "torch")
  latte-fla      latte_causal on fla-core's chunk_gla (backend "fla"): the q/k/g
                 construction (softmax, logcumsumexp, exp) plus the kernel
  fla-gla        fla-core's chunk_gla alone on ready q, k, g of the same shapes:
                 latte-fla minus this is the construction's cost
  macchiato      macchiato on the torch kernels
  macchiato-fla  macchiato with backend "fla": latents on fla, window on flex_attention
  sdpa           torch's causal scaled_dot_product_attention over the whole
                 context (FlashAttention in bfloat16/float16)
Each point is timed with a CUDA synchronize after every call, providers in
interleaved rounds; peak memory is torch.cuda.max_memory_allocated over one
call. Not measured on a GPU by this project yet (docs/gpu.md §5).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import common
from . import providers as P
from .device import DTYPES, cuda_peak_mb, device_info, synced

PROVIDERS = ("latte", "latte-fla", "fla-gla", "macchiato", "macchiato-fla", "sdpa")
DEVICE = "cuda"  # the tests run this module's plumbing on "cpu"
FULL_T = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_T = [64, 256]
MODES = ("fwd", "fwdbwd")


def make_inputs(provider: str, T: int, dtype, B: int = 1, seed: int = 0):
    """(inputs on CUDA, fn) for one provider, as providers.make_inputs on CPU."""
    from latte.ops import latte_causal, macchiato

    g = torch.Generator().manual_seed(seed)
    H, L, D = P.HEADS, P.LATENTS // P.HEADS, P.DV

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(DEVICE, dt)

    if provider in ("latte", "latte-fla"):
        backend = "fla" if provider == "latte-fla" else "torch"
        return [r(B, T, H, L), r(B, T, H, L), r(B, T, H, D)], lambda a, b, v: latte_causal(
            a, b, v, chunk_size=P.CHUNK, backend=backend
        )[0]
    if provider == "fla-gla":
        from fla.ops.gla import chunk_gla

        q, k = torch.softmax(r(B, T, H, L), -1), torch.sigmoid(r(B, T, H, L))
        log_decay = F.logsigmoid(r(B, T, H, L, dt=torch.float32))
        return [q, k, r(B, T, H, D), log_decay], lambda q, k, v, g_: chunk_gla(q, k, v, g_, scale=1.0)[0]
    if provider in ("macchiato", "macchiato-fla"):
        backend = "fla" if provider == "macchiato-fla" else "torch"
        return [
            r(B, T, H, L),
            r(B, T, H, L),
            r(B, T, H, D),
            r(B, T, H, D),
            r(B, T, H, D),
        ], lambda a, b, v, q, k: macchiato(a, b, v, q, k, window_size=P.WINDOW, chunk_size=P.CHUNK, backend=backend)[0]
    if provider == "sdpa":
        return [r(B, H, T, D), r(B, H, T, D), r(B, H, T, D)], lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True
        )
    raise ValueError(f"provider: expected one of {PROVIDERS}, got {provider!r}")


def _point(ps, T, mode, args):
    """All providers at one (T, mode): interleaved times, then peak memory one by one."""
    fns, rows = {}, {}
    for p in ps:
        try:
            inputs, fn = make_inputs(p, T, DTYPES[args.dtype])
            fns[p] = synced(P.as_call(fn, inputs, mode), DEVICE)
            fns[p]()  # a first call: kernels compile and autotune here, and what cannot run fails here
        except (ImportError, RuntimeError, ValueError) as e:  # fla missing, out of memory
            fns.pop(p, None)
            rows[p] = common.skipped(f"unavailable: {type(e).__name__}: {str(e)[:200]}")
    times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup) if fns else {}
    for p, t in times.items():
        rows[p] = {**t, "peak_mb": cuda_peak_mb(fns[p]) if DEVICE == "cuda" else None}
    fns.clear()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def run_ops(args) -> dict:
    torch.manual_seed(0)
    info = {**common.machine_info(), **device_info(DEVICE)}
    Ts = QUICK_T if args.quick else FULL_T
    results = []
    for T in Ts:
        for mode in MODES:
            for p, t in _point(args.providers, T, mode, args).items():
                results.append({"provider": p, "T": T, "mode": mode, **t})
                print(
                    f"  {p:14s} T={T:6d} {mode:7s} "
                    + (
                        f"skipped: {t['reason']}"
                        if t.get("skipped")
                        else f"{t['median_ms']:9.3f} ms {common.fmt(t['peak_mb'])} MiB"
                    ),
                    flush=True,
                )
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "ops-cuda",
        "machine": info,
        "config": {
            "device": DEVICE,
            "dtype": args.dtype,
            "quick": args.quick,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "providers": args.providers,
            "T": Ts,
            "shapes": {
                "B": 1,
                "H": P.HEADS,
                "Lh": P.LATENTS // P.HEADS,
                "Dv": P.DV,
                "chunk_size": P.CHUNK,
                "window_size": P.WINDOW,
            },
            "timing": "wall clock with torch.cuda.synchronize after each call; providers interleaved",
            "memory": "torch.cuda.max_memory_allocated over one call minus memory allocated before it",
        },
        "results": results,
    }


def markdown_ops(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}

    def val(p, T, mode, key):
        r = cell.get((p, T, mode))
        return "-" if r is None else "skip" if r.get("skipped") else r[key]

    out = [
        f"# latte bench ops --device cuda{' (quick)' if cfg['quick'] else ''}",
        "",
        f"{m.get('gpu', m['cpu_model'])}, CUDA {m.get('cuda')}, torch {m['torch']}, fla-core {m.get('fla_core')}, "
        f"triton {m.get('triton')}, {cfg['dtype']}, B=1 H=8 Lh=32 dv=64 W=128; median of {cfg['repeats']} "
        f"synchronised calls, providers interleaved. TRITON_F32_DEFAULT={m.get('TRITON_F32_DEFAULT')}.",
    ]
    for mode in MODES:
        for title, key in (("median ms", "median_ms"), ("peak extra MiB", "peak_mb")):
            rows = [[str(T)] + [val(p, T, mode, key) for p in cfg["providers"]] for T in cfg["T"]]
            out += [
                "",
                f"## {'forward' if mode == 'fwd' else 'forward+backward'}: {title}",
                "",
                common.md_table(["T"] + list(cfg["providers"]), rows),
            ]
    skips = sorted({f"- {r['provider']}: {r['reason']}" for r in res["results"] if r.get("skipped")})
    return "\n".join(out + ([""] + skips if skips else [])) + "\n"


def plot_ops(res: dict, path) -> bool:
    panels = {}
    for mode in MODES:
        panels["forward" if mode == "fwd" else "forward+backward"] = {
            p: (
                [r["T"] for r in res["results"] if (r["provider"], r["mode"]) == (p, mode) and not r.get("skipped")],
                [
                    r["median_ms"]
                    for r in res["results"]
                    if (r["provider"], r["mode"]) == (p, mode) and not r.get("skipped")
                ],
            )
            for p in res["config"]["providers"]
        }
    return common.plot_loglog(
        path,
        panels,
        xlabel="T (tokens)",
        ylabel="median time (ms)",
        title=f"latte bench ops --device cuda: {res['machine'].get('gpu')}",
    )


def main_ops(args) -> dict:
    res = run_ops(args)
    common.write_outputs(args, "ops-cuda", res, markdown_ops(res), plot_ops, image_in_readme=False)
    return res
