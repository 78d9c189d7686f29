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

from __future__ import annotations

from latte._lazy import lazy_getattr

# The front door for the checkout's benchmarks/ and experiments/: public name
# -> "module" (or "module:attribute"), imported on first use. They import
# these names from `latte.bench` (`from latte import bench as common` keeps
# their `common.NAME` calls), never the modules themselves
# (tests/test_lab_imports.py).
_EXPORTS = {
    **dict.fromkeys(
        (
            "add_common_args claim_outputs memory_points plot_loglog set_threads skipped time_interleaved write_outputs"
        ).split(),
        "latte.bench.common",
    ),
    **dict.fromkeys(
        "DTYPES add_device_args check_device device_info resolve_device_args synced".split(), "latte.bench.device"
    ),
    "as_call": "latte.bench.providers",
    **dict.fromkeys("RULE seeded_randn timing_line timing_row".split(), "latte.bench.fixed_shapes"),
    "cuda_plan": "latte.bench.cuda:plan",
    **dict.fromkeys("flex_window window_block_mask".split(), "latte.ops.window.flex_window"),
    "window_blocked": "latte.ops.window.sliding_window",
    **dict.fromkeys("MEMORY_RULES Memory".split(), "latte.ops.window.memory"),
    **dict.fromkeys("chunked_objective full_logits_objective head_logits".split(), "latte.convert.distill"),
    "QK_MIXERS": "latte.layers",
    **dict.fromkeys("LatteHFConfig LatteHFForCausalLM".split(), "latte.models.hf"),  # needs transformers
}


__getattr__ = lazy_getattr("latte.bench", _EXPORTS, globals())
