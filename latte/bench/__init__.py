"""Benchmarks: scripts that write JSON + PNG + a markdown table (protocols
in docs/evaluation.md §1-2). Nothing here asserts on time.

    python -m latte.bench.ops     # attention ops: time, memory, GFLOP/s vs T
    python -m latte.bench.decode  # per-token decode latency and state bytes
    python -m latte.bench.train   # tokens/s of one AdamW step per mixer
    python -m latte.bench.distill  # conversion's objective: whole logits vs chunks of the head
    python -m latte.bench.audit   # each op's time on every input distribution (latte.ops.distributions)
    python -m latte.bench.window   # Macchiato's window branch: tile kernel vs flex_attention
    python -m latte.bench.cuda_check  # `latte bench check`: the fla backend vs float64 on the device

Each module exposes `main(argv) -> dict` (the future `latte bench ...` CLI
calls it) and writes `<name>.json/.md/.png` into `--out` (bench-results/).
Plots need the optional extra `latte[plot]` (matplotlib).
"""
