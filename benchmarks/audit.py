"""`python -m benchmarks.audit`: does any op's cost depend on its input values?

Every op whose work could depend on the values (the causal and
bidirectional Latte ops, Macchiato, the sliding window, the RG-LRU scan, the
fused cross-entropy, the decoding steps) is timed at one shape on every
distribution of latte.ops.distributions (std 1 ... 100 logits, +80 spikes,
all-padding rows), forward+backward, the distributions of an op in
interleaved rounds (drift lands on all of them alike). The rule: the
slowest distribution may take at most RULE x the fastest.

    python -m benchmarks.audit [--quick] [--threads 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F

from benchmarks import RESULTS
from latte import bench as common
from latte import ops, reporting
from latte.bench import RULE, as_call, seeded_randn, timing_line, timing_row
from latte.ops import distributions as dists


def _masked(fn, dist, B, T):
    """fn with the distribution's token mask (None unless "padding") as `mask`."""
    mask = dists.mask(dist, B, T)
    return lambda *xs: fn(*xs, mask=mask)


def op_calls(dist: str, quick: bool) -> dict:
    """{op: (shape note, zero-argument call)} for one distribution."""
    s = 8 if quick else 1  # quick: every size / 8
    return {**_attention_calls(dist, s), **_scan_and_head_calls(dist, s), "decode steps": _decode_call(dist)}


def _attention_calls(dist: str, s: int) -> dict:
    """The attention ops' entries of op_calls, forward and backward (sizes / s)."""
    B, T, H, L, D = 4, 512 // s, 4, 32, 32
    lat = [
        seeded_randn(B, T, H, L, seed=1),
        dists.logits(seeded_randn(B, T, H, L, seed=2), dist),
        seeded_randn(B, T, H, D, seed=3),
    ]
    win = [
        dists.logits(seeded_randn(2, 1024 // s, 8, 64, seed=4), dist),
        dists.logits(seeded_randn(2, 1024 // s, 2, 64, seed=5), dist),
        seeded_randn(2, 1024 // s, 2, 64, seed=6),
    ]
    mac = lat + [
        dists.logits(seeded_randn(B, T, H, D, seed=7), dist),
        dists.logits(seeded_randn(B, T, H, D, seed=8), dist),
    ]
    return {
        "latte_causal": (
            f"B={B} T={T} H={H} Lh={L} Dv={D}",
            as_call(_masked(lambda a, b, v, mask: ops.latte_causal(a, b, v, mask=mask)[0], dist, B, T), lat, "fwdbwd"),
        ),
        "latte_bidirectional": (
            f"B={B} T={T} H={H} Lh={L} Dv={D}",
            as_call(_masked(ops.latte_bidirectional, dist, B, T), lat, "fwdbwd"),
        ),
        "macchiato": (
            f"B={B} T={T} H={H} Lh={L} E=Dv={D} W=128",
            as_call(
                _masked(
                    lambda a, b, v, q, k, mask: ops.macchiato(a, b, v, q, k, window_size=128, mask=mask)[0], dist, B, T
                ),
                mac,
                "fwdbwd",
            ),
        ),
        "sliding_window": (
            f"B=2 T={1024 // s} H=8 K=2 E=Dv=64 W=128",
            as_call(
                _masked(
                    lambda q, k, v, mask: ops.sliding_window_attention(q, k, v, window_size=128, mask=mask)[0],
                    dist,
                    2,
                    1024 // s,
                ),
                win,
                "fwdbwd",
            ),
        ),
    }


def _scan_and_head_calls(dist: str, s: int) -> dict:
    """The RG-LRU scan's and the fused head's entries of op_calls (sizes / s)."""
    N, V, E = 2048 // s, 8192 // s, 256
    hidden = dists.logits(seeded_randn(N, E, seed=9), dist)
    weight = seeded_randn(V, E, seed=10) / math.sqrt(E)  # logits: the distribution's std
    targets = seeded_randn(N, seed=11).abs().mul(V / 4).long().clamp_(max=V - 1)
    if dist == "padding":
        targets[N // 2 :] = -100
    x = seeded_randn(1, 4096 // s, 512, seed=12)
    log_a = -F.softplus(dists.logits(seeded_randn(1, 4096 // s, 512, seed=13), dist))
    return {
        "linear_recurrence": (
            f"[1, {4096 // s}, 512], log_a = -softplus(logits)",
            as_call(lambda x, la: ops.linear_recurrence(x, la)[0], [x, log_a], "fwdbwd"),
        ),
        "linear_cross_entropy": (
            f"N={N} D={E} V={V}, logits of the distribution's std",
            as_call(lambda h, w: ops.linear_cross_entropy(h, w, targets), [hidden, weight], "fwdbwd"),
        ),
    }


def _decode_call(dist: str) -> tuple:
    """op_calls' "decode steps" entry: 64 recurrent steps of three decoding ops."""
    steps = [
        seeded_randn(8, 64, 8, 32, seed=14),
        dists.logits(seeded_randn(8, 64, 8, 32, seed=15), dist),
        seeded_randn(8, 64, 8, 64, seed=16),
        dists.logits(seeded_randn(8, 64, 8, 64, seed=17), dist),
    ]
    step_mask = dists.mask(dist, 8, 64)

    def decode():
        st_l = st_m = st_w = None
        with torch.no_grad():
            for t in range(steps[0].shape[1]):
                a, b, v, k = (z[:, t] for z in steps)
                m = None if step_mask is None else step_mask[:, t]
                _, st_l = ops.latte_causal_step(a, b, v, st_l, mask_t=m)
                _, st_m = ops.macchiato_step(a, b, v, k, k, st_m, window_size=16, mask_t=m)
                _, st_w = ops.sliding_window_step(k, k, v, st_w, window_size=16, mask_t=m)

    return "64 steps of latte, macchiato (W=16), window (W=16): B=8 H=8 Lh=32 Dv=64", decode


def run(args) -> dict:
    common.set_threads(args.threads)
    info = reporting.machine_info()
    rows = []
    calls = {d: op_calls(d, args.quick) for d in dists.DISTRIBUTIONS}
    for op, (note, _) in calls[dists.DISTRIBUTIONS[0]].items():
        t = common.time_interleaved(
            {d: calls[d][op][1] for d in dists.DISTRIBUTIONS}, repeats=args.repeats, warmup=args.warmup
        )
        rows.append({**timing_row(op, t), "shape": note})
        print(f"  {op}: " + timing_line(rows[-1]), flush=True)
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "audit",
        "machine": info,
        "rule": RULE,
        "config": {
            "threads": args.threads,
            "dtype": "float32",
            "quick": args.quick,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "distributions": dict(dists.DESCRIPTIONS),
            "timing": "wall clock of forward + autograd.grad of every input (decode: 64 steps, no grad); "
            "the distributions of an op in interleaved rounds",
        },
        "results": rows,
    }


def markdown(res: dict) -> str:
    m, rows = res["machine"], res["results"]
    bad = [r["name"] for r in rows if not r["within_rule"]]
    out = [
        f"# latte bench audit ({'quick' if res['config']['quick'] else 'full'})",
        "",
        f"{m['cpu_model']}, {m['usable_cores']} cores, torch {m['torch']}, {m['threads']} threads, fp32; "
        f"forward+backward median ms of {res['config']['repeats']} repeats; load avg "
        f"{m['loadavg_start'][0]:.1f} -> {m['loadavg_end'][0]:.1f}. Rule: max/min <= {res['rule']} "
        f"({'every op passes' if not bad else 'over the rule: ' + ', '.join(bad)}).",
        "",
        "; ".join(f"{d}: {dists.DESCRIPTIONS[d]}" for d in dists.DISTRIBUTIONS) + ".",
        "",
    ]
    hdr = ["op", "shape"] + list(dists.DISTRIBUTIONS) + ["max/min", "within rule"]
    out.append(
        reporting.md_table(
            hdr,
            [
                [r["name"], r["shape"]]
                + [r["median_ms"][d] for d in dists.DISTRIBUTIONS]
                + [f"{r['max_over_min']:.2f}", "yes" if r["within_rule"] else "NO"]
                for r in rows
            ],
        )
    )
    return "\n".join(out) + "\n"


def plot(res: dict, path) -> bool:
    """max/min per op (no log-log sweep here: one bar per op)."""
    plt = reporting.pyplot()
    if plt is None:
        return False
    rows = res["results"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh([r["name"] for r in rows], [r["max_over_min"] for r in rows])
    ax.axvline(res["rule"], color="C3", ls="--", label=f"rule {res['rule']}")
    ax.set_xlabel("slowest / fastest input distribution")
    ax.legend()
    reporting.save_figure(plt, fig, path)
    return True


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m benchmarks.audit", description=__doc__.split("\n\n")[0]
    )
    common.add_common_args(p, out=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.claim_outputs(args, "audit", "audit")  # before any work: the write rule (latte/guard.py)
    res = run(args)
    common.write_outputs(args, "audit", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    import sys

    from latte.cli import run_command  # the exit codes of every latte command

    sys.exit(run_command("python -m benchmarks.audit", main, sys.argv[1:]))
