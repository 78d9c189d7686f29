"""`latte bench ops --device cuda`: the attention ops on a GPU (docs/evaluation.md §1.2).

Shapes: batch x T constant (`--tokens`, default 131072, so T = 1K .. 128K
with B = 128 .. 1), H = 16 heads, Lh = 128 latents per head, Dv = 128 (the
head width FlashAttention and fla's GLA kernels are tuned for), window 128,
chunk 64; `--heads/--latents/--dv` change them.

Providers:
  latte          latte_causal on the project's torch kernels (backend "torch")
  latte-fla      latte_causal on fla-core's chunk_gla (backend "fla"): the q/k/g
                 construction (softmax, logcumsumexp, exp) plus the kernel; the
                 "eager" construction whatever LATTE_FLA_CONSTRUCTION says
  latte-fla-compiled
                 latte-fla with the "compiled" construction (backend.set_fla_construction):
                 q, k, g built by one torch.compile'd function, compiled at its first call
  latte-fla-fused
                 latte-fla with the "fused" construction: softmax, fla's gate, chunk_gla
                 (docs/gpu.md §2.3)
  fla-gla        fla-core's chunk_gla alone on ready q, k, g of the same shapes:
                 latte-fla / fla-gla is the construction's cost
  fla-gate       fla-core's gate fused_additive_gate alone on the key logits (k, g
                 in float32 and z; its scan is serial in T), beside fla-gla
  macchiato      macchiato on the torch kernels
  macchiato-fla  macchiato with backend "fla": latents on fla, window on flex_attention
                 (compiled once per shape, ~30 s each: only at `--macchiato-seqs`, 4K and 64K)
  macchiato-window-mix, macchiato-fla-window-mix
                 Macchiato's window and mix phases alone on the latent phase's output
                 (providers.macchiato_window_mix; the fla one's window on flex_attention,
                 at `--macchiato-seqs` only): a Macchiato layer's cost beyond latte's
  sdpa           torch's causal scaled_dot_product_attention over the whole
                 context, restricted to the FlashAttention kernel in bfloat16/float16
                 (float32 has no flash kernel: torch's default choice, recorded)
Each point is timed with a CUDA synchronize after every call, providers in
interleaved rounds; peak memory is torch.cuda.max_memory_allocated over one
call. A provider is skipped at a T whose predicted time exceeds `--point-cap`
and every point after `--time-budget` seconds, with the reason recorded; the
files are rewritten after every T, so a run cut short keeps what it measured.
Its first-run subset ran once, on an H200 (benchmarks/cuda/, docs/gpu.md §5).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.nn.functional as F

from latte import reporting
from latte.ops import latte_causal, macchiato
from latte.ops.backend import using_fla_construction

from . import common
from .cuda_report import markdown_ops, ops_ratios, plot_ops
from .device import DTYPES, cuda_peak_mb, device_info, synced
from .providers import as_call, macchiato_window_mix

PROVIDERS = (
    "latte",
    "latte-fla",
    "latte-fla-compiled",
    "latte-fla-fused",
    "fla-gla",
    "fla-gate",
    "macchiato",
    "macchiato-fla",
    "macchiato-window-mix",
    "macchiato-fla-window-mix",
    "sdpa",
)
FLEX = ("macchiato-fla", "macchiato-fla-window-mix")  # one flex_attention compile per shape: --macchiato-seqs only
LATTE_FLA = {"latte-fla": "eager", "latte-fla-compiled": "compiled", "latte-fla-fused": "fused"}
DEVICE = "cuda"  # the tests run this module's plumbing on "cpu"
FULL_T = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
QUICK_T = [64, 256]
MACCHIATO_T, QUICK_MACCHIATO_T = [4096, 65536], [256]
TOKENS, QUICK_TOKENS = 131072, 512
HEADS, LATENTS, DV, WINDOW, CHUNK = 16, 128, 128, 128, 64
MODES = ("fwd", "fwdbwd")
QUADRATIC = ("sdpa",)  # cost per token grows with T at a constant number of tokens
CUDA_ONLY = ("seqs", "tokens", "heads", "latents", "dv", "macchiato_seqs", "point_cap", "time_budget")


def add_args(p) -> None:
    """The options of `latte bench ops --device cuda` (rejected on the CPU run)."""
    g = p.add_argument_group("--device cuda only")
    g.add_argument("--seqs", default=None, help="comma-separated T (default 1K..128K; quick 64,256)")
    g.add_argument("--tokens", type=int, default=None, help="batch x T of every point (default 131072)")
    g.add_argument("--heads", type=int, default=None, help=f"heads (default {HEADS})")
    g.add_argument("--latents", type=int, default=None, help=f"latents per head, Lh (default {LATENTS})")
    g.add_argument("--dv", type=int, default=None, help=f"value width per head (default {DV})")
    g.add_argument("--macchiato-seqs", default=None, help="T of macchiato-fla (one flex compile each)")
    g.add_argument("--point-cap", type=float, default=None, help="skip a point predicted to take longer (s)")
    g.add_argument("--time-budget", type=float, default=None, help="start no point after this many seconds")


def _ints(p, flag: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x]
    except ValueError:
        p.error(f"{flag}: expected comma-separated positive integers, got {text!r}")
    if not out or min(out) < 1:
        p.error(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return out


def resolve_args(p, args) -> None:
    """Fill the defaults of the CUDA options (or reject them on the CPU run)."""
    if args.device != "cuda":
        given = [f"--{k.replace('_', '-')}" for k in CUDA_ONLY if getattr(args, k) is not None]
        if given:
            p.error(f"{', '.join(given)}: only with --device cuda")
        return
    args.seqs = _ints(p, "--seqs", args.seqs) if args.seqs else (QUICK_T if args.quick else FULL_T)
    ms = args.macchiato_seqs
    args.macchiato_seqs = _ints(p, "--macchiato-seqs", ms) if ms else (QUICK_MACCHIATO_T if args.quick else MACCHIATO_T)
    defaults = (QUICK_TOKENS, 2, 16, 16) if args.quick else (TOKENS, HEADS, LATENTS, DV)
    for key, default in zip(("tokens", "heads", "latents", "dv"), defaults):
        setattr(args, key, default if getattr(args, key) is None else getattr(args, key))
    for flag, x in (("--tokens", args.tokens), ("--heads", args.heads), ("--latents", args.latents), ("--dv", args.dv)):
        if x < 1:
            p.error(f"{flag}: expected a positive integer, got {x}")
    args.point_cap = 60.0 if args.point_cap is None else args.point_cap
    if args.point_cap <= 0 or (args.time_budget is not None and args.time_budget <= 0):
        p.error("--point-cap / --time-budget: expected seconds > 0")


def plan(args) -> list[dict]:
    """Every (T, batch, mode, provider) the run measures, in order."""
    points = []
    for T in args.seqs:
        for mode in MODES:
            for p in args.providers:
                if p not in FLEX or T in args.macchiato_seqs:
                    points.append({"T": T, "B": max(1, args.tokens // T), "mode": mode, "provider": p})
    return points


def _sdpa_context(dtype):
    """Only the FlashAttention kernel in half precision (an error, not a slower kernel, if it cannot run)."""
    if DEVICE != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def make_inputs(provider: str, T: int, dtype, B: int = 1, shape=(HEADS, LATENTS, DV), seed: int = 0):
    """(inputs on DEVICE, fn) for one provider; shape = (H, Lh, Dv)."""

    g = torch.Generator().manual_seed(seed)
    H, L, D = shape

    def r(*size, dt=dtype):
        return torch.randn(*size, generator=g).to(DEVICE, dt)

    if provider == "latte" or provider in LATTE_FLA:
        backend = "torch" if provider == "latte" else "fla"
        # each fla provider pins its construction (latte-fla: "eager") so that their ratios compare
        # the constructions whatever LATTE_FLA_CONSTRUCTION says; the torch backend builds no kernel inputs
        construction = LATTE_FLA.get(provider)

        def latte(a, b, v):
            with using_fla_construction(construction) if construction else contextlib.nullcontext():
                return latte_causal(a, b, v, chunk_size=CHUNK, backend=backend)[0]

        return [r(B, T, H, L), r(B, T, H, L), r(B, T, H, D)], latte
    if provider == "fla-gla":
        from fla.ops.gla import chunk_gla

        q, k = torch.softmax(r(B, T, H, L), -1), torch.sigmoid(r(B, T, H, L))
        log_decay = F.logsigmoid(r(B, T, H, L, dt=torch.float32))
        return [q, k, r(B, T, H, D), log_decay], lambda q, k, v, g_: chunk_gla(q, k, v, g_, scale=1.0)[0]
    if provider == "fla-gate":
        from fla.ops.gsa.gate import fused_additive_gate

        return [r(B, T, H, L)], lambda b: fused_additive_gate(b, gate_dtype=torch.float32)[:2]
    if provider in ("macchiato", "macchiato-fla"):
        backend = "fla" if provider == "macchiato-fla" else "torch"
        ins = [r(B, T, H, L), r(B, T, H, L), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)]
        return ins, lambda a, b, v, q, k: macchiato(
            a, b, v, q, k, window_size=WINDOW, chunk_size=CHUNK, backend=backend
        )[0]
    if provider in ("macchiato-window-mix", "macchiato-fla-window-mix"):
        backend = "fla" if provider == "macchiato-fla-window-mix" else "torch"
        ins = [r(B, T, H, L), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D), r(B, T, H, D)]
        return ins, lambda a, v, q, k, y: macchiato_window_mix(
            a, v, q, k, y, window=WINDOW, chunk=CHUNK, backend=backend
        )
    if provider == "sdpa":

        def sdpa(q, k, v):
            with _sdpa_context(dtype):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return [r(B, H, T, D), r(B, H, T, D), r(B, H, T, D)], sdpa
    raise ValueError(f"provider: expected one of {PROVIDERS}, got {provider!r}")


def _predicted_s(prev, T: int, args) -> float | None:
    """Seconds the point would take (first call, warm-up, repeats) from the provider's last T."""
    if prev is None:
        return None
    T0, ms, quadratic = prev
    return ms / 1e3 * (T / T0 if quadratic else 1.0) * (1 + args.warmup + args.repeats)


def _point(todo: list[dict], args, last: dict, t_start: float) -> dict:
    """The providers at one (T, mode): interleaved times, then peak memory one by one."""
    fns, rows = {}, {}
    for pt in todo:
        p = pt["provider"]
        pred = _predicted_s(last.get((p, pt["mode"])), pt["T"], args)
        if args.time_budget is not None and time.perf_counter() - t_start > args.time_budget:
            rows[p] = common.skipped(f"budget: the run's --time-budget of {args.time_budget:g} s was spent")
            continue
        if pred is not None and pred > args.point_cap:
            rows[p] = common.skipped(f"cap: predicted {pred:.0f} s > --point-cap {args.point_cap:g} s")
            continue
        try:
            inputs, fn = make_inputs(p, pt["T"], DTYPES[args.dtype], pt["B"], (args.heads, args.latents, args.dv))
            fns[p] = synced(as_call(fn, inputs, pt["mode"]), DEVICE)
            fns[p]()  # a first call: kernels compile and autotune here, and what cannot run fails here
        except (ImportError, RuntimeError, ValueError) as e:  # fla missing, out of memory
            fns.pop(p, None)
            rows[p] = common.skipped(f"unavailable: {type(e).__name__}: {str(e)[:200]}")
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup) if fns else {}
    for p, t in times.items():
        rows[p] = {**t, "peak_mb": cuda_peak_mb(fns[p]) if DEVICE == "cuda" else None}
        last[(p, todo[0]["mode"])] = (todo[0]["T"], t["median_ms"], p in QUADRATIC)
    fns.clear()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def _recompile_limit() -> int | None:
    """flex_attention is compiled per shape (dynamic=False); torch.compile falls back to eager
    after its recompile limit (8 by default), which would time eager flex. Raise it for the sweep."""
    try:
        import torch._dynamo.config as dc
    except ImportError:
        return None
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dc, name):
            setattr(dc, name, max(getattr(dc, name), 64))
            return getattr(dc, name)
    return None


def config_of(args) -> dict:
    return {
        "device": DEVICE,
        "dtype": args.dtype,
        "quick": args.quick,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "providers": args.providers,
        "T": args.seqs,
        "macchiato_fla_T": args.macchiato_seqs,
        "tokens": args.tokens,
        "point_cap_s": args.point_cap,
        "time_budget_s": args.time_budget,
        "shapes": {"H": args.heads, "Lh": args.latents, "Dv": args.dv, "chunk_size": CHUNK, "window_size": WINDOW},
        "sdpa": "FlashAttention only" if args.dtype != "float32" else "torch's default kernel choice",
        "timing": "wall clock with torch.cuda.synchronize after each call; providers interleaved",
        "memory": "torch.cuda.max_memory_allocated over one call minus memory allocated before it",
    }


def output_name(dtype: str) -> str:
    return f"ops-cuda-{dtype}"


def main_ops(args) -> dict:
    torch.manual_seed(0)
    info = {**reporting.machine_info(), **device_info(DEVICE), "dynamo_recompile_limit": _recompile_limit()}
    res = {"benchmark": "ops-cuda", "machine": info, "config": config_of(args), "results": []}
    last, t_start = {}, time.perf_counter()
    by_point: dict[tuple, list[dict]] = {}
    for pt in plan(args):
        by_point.setdefault((pt["T"], pt["mode"]), []).append(pt)
    for (T, mode), todo in by_point.items():
        for p, t in _point(todo, args, last, t_start).items():
            res["results"].append({"provider": p, "T": T, "B": todo[0]["B"], "mode": mode, **t})
            print(
                f"  {p:14s} T={T:6d} B={todo[0]['B']:4d} {mode:7s} "
                + (f"skipped: {t['reason']}" if t.get("skipped") else f"{t['median_ms']:9.3f} ms"),
                flush=True,
            )
        if mode == MODES[-1]:  # after each T: the files so far (a run cut short keeps them)
            _write(args, res)
    res["wall_s"] = time.perf_counter() - t_start
    return _write(args, res, echo=True)


def _write(args, res: dict, echo: bool = False) -> dict:
    res["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    res["ratios"] = ops_ratios(res)
    name = output_name(args.dtype)
    common.claim_outputs(args, "ops", name, create=True)  # the write rule (latte/guard.py)
    common.write_json(args.out / f"{name}.json", res)
    (args.out / f"{name}.md").write_text(markdown_ops(res))
    if echo:
        plot_ops(res, args.out / f"{name}.png")
        print(markdown_ops(res))
    return res
