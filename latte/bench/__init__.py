"""Benchmarks a user runs on their own hardware: scripts that write JSON +
PNG + a markdown table (protocols in docs/evaluation.md §1-2). Nothing here
asserts on time.

    latte bench ops     # attention ops: time, memory, GFLOP/s vs T (--device cuda: cuda.py)
    latte bench decode  # per-token decode latency and state bytes
    latte bench check   # cuda_check.py: the fla backend vs float64 on the device

Each module exposes `main(argv) -> dict` and writes `<name>.json/.md/.png`
into `--out` (bench-results/). Plots need the optional extra `latte[plot]`
(matplotlib). The benchmarks only this repository runs (training steps, the
window kernel, the distillation head, the input-value audit) are in the
checkout's benchmarks/ folder; they import this package, never the reverse.
"""
