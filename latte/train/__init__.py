"""`latte train`: a trainer that survives kill -9, pluggable by task.

task.py        the Task interface (what is trained), the task registry and
               build_run_config / load_run_config; lm.py, the language model
config.py      RunConfig (task, optim, train) and the LM's sections
loop.py        train(cfg): setup, fit, evaluate
setup.py       everything fit needs, built in order
step.py        one optimizer step, the non-finite guard
state.py       the trainer's state as Stateful parts; the Checkpointer collecting them
checkpoint.py  the commit protocol (manifest last), retention, loading
manifest.py    the checkpoint folder's layout, its manifest and verification
sharded.py     FSDP2 checkpoints with torch.distributed.checkpoint
rundir.py      the run-folder lock, which checkpoint to resume, branches
runs.py        open a trained run for inference (generate, eval, export)
validation.py  LM validation loss and perplexity
distributed.py torchrun, DDP / FSDP2, collectives
metrics.py     progress bar, CSV, TensorBoard, loss curve
schedule.py, rng.py, faults.py (the test hooks: no-ops unless LATTE_FAULTS is set)
"""

from __future__ import annotations

from latte._lazy import lazy_getattr

# The trainer's front door for code outside the package (experiments/,
# benchmarks/, tests of them): public name -> the module that defines it,
# imported on first use. The laboratory imports these names from
# `latte.train`, never the modules themselves (tests/test_lab_imports.py).
_EXPORTS = {
    **dict.fromkeys(("build_run_config", "load_run_config", "task_class"), "latte.train.task"),
    "train": "latte.train.loop",
    "open_run": "latte.train.runs",
    "find_latest_checkpoint": "latte.train.checkpoint",
    **dict.fromkeys(("MANIFEST", "step_dirs", "step_dir_name"), "latte.train.manifest"),
    **dict.fromkeys(("read_csv", "run_wall_time"), "latte.train.metrics"),
    **dict.fromkeys(("pack_split", "split_corpus"), "latte.train.lm"),
    **dict.fromkeys(("nll_sums", "subset", "summarize"), "latte.train.validation"),
    "lr_at": "latte.train.schedule",
    "DistEnv": "latte.train.distributed",
    **dict.fromkeys(("DERIVED", "RECORD", "compare", "read_record"), "latte.train.inputs"),
    **dict.fromkeys(("flatten", "load_yaml", "to_dict"), "latte.config_io"),  # run configs as files hold them
}


__getattr__ = lazy_getattr("latte.train", _EXPORTS, globals())
