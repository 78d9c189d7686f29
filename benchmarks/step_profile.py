"""Where a training step's time goes (`python -m benchmarks.train --profile`).

At small shapes a step is many small ops, and the per-op cost of eager
PyTorch (dispatch, autograd bookkeeping, allocation) rather than arithmetic
sets its time. torch.profiler counts the aten ops of one step and their self
CPU time, so the gap between two mixers can be named: more ops, or a few
expensive ones.
"""

from __future__ import annotations

import time

from torch.profiler import ProfilerActivity, profile

TOP = 8


def profile_step(step, steps: int = 3, top: int = TOP) -> dict:
    """Profile `steps` calls of step() (already warmed up); per step: the
    number of aten op calls, their summed self CPU time, the profiled wall
    time, and the `top` ops by self CPU time."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    calls = sum(e.count for e in events) / steps
    self_ms = sum(e.self_cpu_time_total for e in events) / 1e3 / steps
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms,
        "aten_calls_per_step": calls,
        "aten_self_ms_per_step": self_ms,
        "top": [
            {"op": e.key, "calls_per_step": e.count / steps, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps}
            for e in ranked
        ],
    }


def markdown(profiles: dict, seq: int) -> list[str]:
    """A summary table (op count and time per variant) and each variant's top ops."""
    if not profiles:
        return []
    out = [
        "",
        f"## Profile of one step at seq {seq} (torch.profiler, CPU; profiling overhead included)",
        "",
        "| variant | profiled ms / step | aten op calls / step | aten self ms / step | "
        "top ops by self time (ms / step, calls) |",
        "|---|---|---|---|---|",
    ]
    for label, p in profiles.items():
        tops = "; ".join(f"{t['op'][6:]} {t['self_ms_per_step']:.1f} ({t['calls_per_step']:.0f})" for t in p["top"][:5])
        cells = [f"{p['wall_ms_per_step']:.1f}", f"{p['aten_calls_per_step']:.0f}", f"{p['aten_self_ms_per_step']:.1f}"]
        out.append(f"| {label} | {' | '.join(cells)} | {tops} |")
    return out
