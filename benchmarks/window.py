"""`python -m benchmarks.window`: Macchiato's window branch on the project's tile kernel
(latte/ops/window/window_tiles.py) against torch's flex_attention (latte/ops/window/flex_window.py).

Both compute causal sliding-window softmax attention with its log-normaliser
(which Macchiato's joint mix needs) for B=1, H=8 heads of width 64, W=128.
On CUDA, both are timed forward and forward+backward, beside SDPA's causal
attention over the whole context for scale. On CPU, torch 2.13 compiles
flex_attention for inference only and without the log-normaliser, so "flex"
there is the forward without it (the most flex could offer Macchiato on
CPU) and forward+backward is the tile kernel's alone. The compile time of
each flex shape (first call) and the largest difference between the two
outputs are recorded. Providers are timed in interleaved rounds.

    python -m benchmarks.window [--device cuda] [--quick] [--threads 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from benchmarks import RESULTS
from latte import bench as common
from latte import reporting
from latte.arguments import int_list
from latte.bench import (
    DTYPES,
    add_device_args,
    as_call,
    check_device,
    device_info,
    flex_window,
    resolve_device_args,
    synced,
    window_block_mask,
    window_blocked,
)

B, H, E, W = 1, 8, 64, 128
FULL_T, QUICK_T = [512, 1024, 2048, 4096, 8192], [200]
MODES = ("fwd", "fwdbwd")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.window", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    add_device_args(p)
    p.add_argument("--seqs", default=None, type=int_list(low=1), help="comma-separated T (default 512..8192)")
    args = p.parse_args(argv)
    resolve_device_args(p, args, cpu_dtypes=tuple(DTYPES))
    args.seqs = list(args.seqs or (QUICK_T if args.quick else FULL_T))
    return args


def _qkv(T, args, bhte=False):
    """The same q, k, v for every provider: [B, T, H, E], or [B, H, T, E] (contiguous) for SDPA / flex."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(B, T, H, E, generator=g).to(args.device, DTYPES[args.dtype]) for _ in range(3)]
    return [x.transpose(1, 2).contiguous() for x in xs] if bhte else xs


def make(provider: str, T: int, mode: str, args):
    """(zero-argument call, compile seconds or None) for one point."""

    scale = E**-0.5
    compile_s = None
    if provider == "tiles":
        inputs, fn = _qkv(T, args), lambda q, k, v: window_blocked(q, k, v, W, scale, None, None)[:2]
    elif provider == "sdpa":
        inputs, fn = _qkv(T, args, bhte=True), lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif args.device == "cuda":  # flex with its log-normaliser, as Macchiato runs it
        inputs, fn = _qkv(T, args), lambda q, k, v: flex_window(q, k, v, W, scale, None, None)[:2]
    else:  # CPU: compiled flex, forward only, no log-normaliser
        from torch.nn.attention.flex_attention import flex_attention

        compiled = torch.compile(flex_attention, dynamic=False)
        mask = window_block_mask(T, 0, W, "cpu")
        inputs, fn = _qkv(T, args, bhte=True), lambda q, k, v: compiled(q, k, v, block_mask=mask, scale=scale)
    call = synced(as_call(fn, inputs, mode), args.device)
    if provider == "flex":
        t0 = time.perf_counter()
        call()  # the compile
        compile_s = time.perf_counter() - t0
    return call, compile_s, (inputs, fn)


def _max_diff(points) -> float | None:
    """Largest |flex - tiles| of the forward outputs (same inputs, same layout after transposes)."""
    if "flex" not in points or "tiles" not in points:
        return None
    with torch.no_grad():
        (qf, kf, vf), ff = points["flex"]
        (qt, kt, vt), ft = points["tiles"]
        yf = ff(qf, kf, vf)
        yt = ft(qt, kt, vt)[0]
        yf = yf[0] if isinstance(yf, tuple) else yf.transpose(1, 2)
        return (yf.float() - yt.float()).abs().max().item()


def run(args) -> dict:
    check_device(args.device)
    common.set_threads(args.threads)
    info = {**reporting.machine_info(), **device_info(args.device)}
    providers = ["tiles", "flex"] + (["sdpa"] if args.device == "cuda" else [])
    rows = []
    for T in args.seqs:
        for mode in MODES:
            fns, compile_s, raw = {}, {}, {}
            for p in providers:
                if p == "flex" and mode == "fwdbwd" and args.device == "cpu":
                    rows.append(
                        {
                            "provider": p,
                            "T": T,
                            "mode": mode,
                            **common.skipped("unavailable: flex_attention has no backward on CPU (torch 2.13)"),
                        }
                    )
                    continue
                fns[p], compile_s[p], raw[p] = make(p, T, mode, args)
            times = common.time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
            diff = _max_diff(raw) if mode == "fwd" else None
            for p, t in times.items():
                rows.append(
                    {
                        "provider": p,
                        "T": T,
                        "mode": mode,
                        **t,
                        "compile_s": compile_s[p],
                        **({"max_abs_diff_vs_tiles": diff} if p == "flex" and diff is not None else {}),
                    }
                )
                print(f"  {p:6s} T={T:6d} {mode:7s} {t['median_ms']:9.2f} ms", flush=True)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "window",
        "machine": info,
        "config": {
            "device": args.device,
            "dtype": args.dtype,
            "threads": args.threads,
            "quick": args.quick,
            "B": B,
            "H": H,
            "E": E,
            "window_size": W,
            "seqs": args.seqs,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "providers": providers,
            "flex_cpu": "compiled, forward only, no log-normaliser (what torch 2.13 supports on CPU)",
        },
        "results": rows,
    }


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    where = m.get("gpu") or f"{m['cpu_model']}, {m['threads']} threads"
    out = [
        f"# latte bench window ({cfg['device']}{', quick' if cfg['quick'] else ''})",
        "",
        f"{where}, torch {m['torch']}, {cfg['dtype']}, B={cfg['B']} H={cfg['H']} E={cfg['E']} "
        f"W={cfg['window_size']}; median ms of {cfg['repeats']} calls, providers interleaved; load avg "
        f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}.",
    ]
    if cfg["device"] == "cpu":
        out += [
            "",
            "On CPU flex is compiled flex_attention forward **without** the log-normaliser (torch 2.13 "
            "offers no other compiled CPU form); tiles computes it as well.",
        ]
    out += [
        "",
        "flex compile s: the first call of each shape (inductor's on-disk cache may already hold "
        "the kernel from an earlier run).",
    ]
    for mode in MODES:
        provs = [p for p in cfg["providers"] if any(k[0] == p and k[2] == mode for k in cell)]
        hdr = ["T"] + provs + ["tiles/flex", "flex compile s", "max abs(flex - tiles)"]
        rows = []
        for T in cfg["seqs"]:

            def get(p, T=T, mode=mode):
                return cell.get((p, T, mode), {})

            med = {p: None if get(p).get("skipped") else get(p).get("median_ms") for p in provs}
            ratio = med["tiles"] / med["flex"] if med.get("flex") and med.get("tiles") else None
            flex = get("flex")
            rows.append(
                [str(T)]
                + [med[p] if med[p] is not None else "n/a" for p in provs]
                + [
                    ratio,
                    flex.get("compile_s"),
                    f"{flex['max_abs_diff_vs_tiles']:.1e}" if flex.get("max_abs_diff_vs_tiles") is not None else "-",
                ]
            )
        out += [
            "",
            f"## {'forward' if mode == 'fwd' else 'forward+backward'}: median ms",
            "",
            reporting.md_table(hdr, rows),
        ]
    skips = {r["reason"] for r in res["results"] if r.get("skipped")}
    out += [""] + [f"- {s}" for s in sorted(skips)] if skips else []
    return "\n".join(out) + "\n"


def plot(res: dict, path) -> bool:
    panels = {}
    for mode in MODES:
        series = {}
        for p in res["config"]["providers"]:
            pts = [
                (r["T"], r["median_ms"])
                for r in res["results"]
                if r["provider"] == p and r["mode"] == mode and not r.get("skipped")
            ]
            if pts:
                series[p] = ([t for t, _ in pts], [v for _, v in pts])
        panels["forward" if mode == "fwd" else "forward+backward"] = series
    return common.plot_loglog(
        path,
        panels,
        xlabel="T (tokens)",
        ylabel="median time (ms)",
        title=f"latte bench window ({res['config']['device']})",
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    name = "window" if args.device == "cpu" else f"window-{args.device}"
    common.claim_outputs(args, "window", name)  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, name, res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.window", main, sys.argv[1:]))
