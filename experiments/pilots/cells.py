"""The pilots' retrieval cells: RULER-style retrieval in held-out essays
(latte.eval.retrieval; docs/evaluation.md §7.2.1) of one pilot's converted
model or of the training-free models of its window and sinks, one cell per
(model, task, context, depth, trial), under the protocol of the convert
study's cells (experiments/convert/stages.py: checks), so the cells written
before issue 58 (by `python -m experiments.convert --stages retrieval`) are
reused. Trial i reads the essays in order i; the planted numbers come from
(context, depth, trial): every model sees the same facts.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from experiments.common.results import Sweep
from experiments.convert.stages import checks
from latte.eval import (
    FORMATS,
    MODELS,
    RETRIEVAL_TASKS,
    TRAINED,
    Reader,
    SharedPrefix,
    answer_prompt,
    as_model,
    length_summary,
)

DEFAULT_FORMAT = "plain-qfirst-colon"  # the calibrated one (convert-calibration in results/archive.md)
FULL = {"contexts": (1024, 2048), "depths": (0.1, 0.5, 0.8), "trials": 3, "format": DEFAULT_FORMAT}
QUICK = {"contexts": (400, 512), "depths": (0.1, 0.5), "trials": 1, "format": "plain"}


def stage_args(a, models: str, runs: Path, pins: list[str]) -> argparse.Namespace:
    """What the retrieval cells of these models read: the pilots' config and
    overrides (then `pins`), the prompts' options (--quick: the stand-in's)."""
    default = QUICK if a.quick else FULL

    def option(name: str, parse):
        given = getattr(a, f"retrieval_{name}")
        return default[name] if given is None else parse(given)

    floats = lambda text: tuple(sorted({float(x) for x in str(text).split(",")}))  # noqa: E731
    ints = lambda text: tuple(sorted({int(x) for x in str(text).split(",")}))  # noqa: E731
    tasks = a.retrieval_tasks.split(",")
    if not tasks or set(tasks) - set(RETRIEVAL_TASKS):
        raise ValueError(f"--retrieval-tasks {a.retrieval_tasks!r}: expected some of {','.join(RETRIEVAL_TASKS)}")
    fmt = option("format", str)
    if fmt not in FORMATS:
        raise ValueError(f"--retrieval-format {fmt!r}: expected one of {','.join(FORMATS)}")
    return argparse.Namespace(
        config=a.config,
        set=[*a.set, *pins],
        runs=str(runs),
        models=[m for m in MODELS if m in models.split(",")],
        retrieval_tasks=tasks,
        retrieval_format=fmt,
        retrieval_contexts=list(option("contexts", ints)),
        retrieval_depths=list(option("depths", floats)),
        retrieval_trials=int(option("trials", int)),
    )


def retrieval_stage(a, subject, sinks: int) -> list[dict]:
    """The cells of a.models, answered in the order of their shared prefixes
    (one state fed once per model, task and trial)."""
    reader = Reader(subject)
    if reader.frame is None and FORMATS[a.retrieval_format].chat:
        raise ValueError(f"--retrieval-format {a.retrieval_format}: needs a tokenizer with a chat template")
    cells = [
        {"model": m, "task": t, "format": a.retrieval_format, "context": c, "depth": d, "trial": i}
        | ({"sinks": sinks} if m.startswith("window+") else {})
        for m in a.models
        for t in a.retrieval_tasks
        for c in a.retrieval_contexts
        for d in a.retrieval_depths
        for i in range(a.retrieval_trials)
    ]
    prompts = {id(c): reader.prompt(c) for c in cells}
    cells.sort(key=lambda c: (MODELS.index(c["model"]), c["trial"], c["task"], prompts[id(c)].shared, c["context"]))
    window = subject.model.converted[0].window_size
    shared: dict[str, SharedPrefix] = {}  # one state at a time: the model of the cell

    def cell_fn(cell):
        load0, prompt = os.getloadavg()[0], reader.prompt(cell)
        with as_model(subject, cell["model"], sinks) as model:
            if cell["model"] not in shared:
                shared.clear()
                shared[cell["model"]] = SharedPrefix(model)
            shared[cell["model"]].model = model  # the same weights, entered again
            rec = answer_prompt(model, reader.decode, cell["task"], prompt, shared[cell["model"]])
        threads = torch.get_num_threads()
        return {**rec, "tokens": len(prompt.ids), "window": window, "load": round(load0, 2), "threads": threads}

    if not any(m in TRAINED for m in a.models):  # the base's models: no up-trained checkpoint is an input
        a = argparse.Namespace(**{**vars(a), "inputs": {k: v for k, v in a.inputs.items() if k != "converted"}})
    sweep = Sweep(Path(a.runs) / "cells-retrieval", cells, **checks(a, ("correct", "answer", "load")))
    return sweep.run(cell_fn, desc="retrieval")


def beyond(cs: list[dict]) -> list[dict]:
    return [c for c in cs if c["distance"] > c["window"]]


def _likelihood(far: list[dict]) -> dict:
    """Over the prompts beyond the window, when each recorded them: the asked
    value's and the decoy's mean NLL (nats per token, teacher-forced), their
    mean difference (decoy - answer) and the prompts where the asked value
    is the likelier."""
    if not far or any("decoy_nll" not in c for c in far):
        return {}
    return {
        "answer_nll": round(statistics.fmean(c["answer_nll"] for c in far), 4),
        "decoy_nll": round(statistics.fmean(c["decoy_nll"] for c in far), 4),
        "nll_gap": round(statistics.fmean(c["decoy_nll"] - c["answer_nll"] for c in far), 4),
        "answer_likelier": sum(c["answer_nll"] < c["decoy_nll"] for c in far),
    }


def retrieval_records(cells: list[dict]) -> list[dict]:
    """One record per (task, model, context): found / prompts beyond the
    window, and what the state holds about the asked value (_likelihood)."""
    out = []
    order = sorted(
        {(c["task"], c["model"], c["context"]) for c in cells},
        key=lambda k: (RETRIEVAL_TASKS.index(k[0]), MODELS.index(k[1]), k[2]),
    )
    for t, m, ctx in order:
        cs = [c for c in cells if (c["task"], c["model"], c["context"]) == (t, m, ctx)]
        far = beyond(cs)
        k, n = sum(c["correct"] for c in far), len(far)
        r = {"model": m, "task": t, "context": ctx, "format": cs[0]["format"], "trials": len(cs)}
        r.update(beyond_window=n, found_beyond=k, accuracy=k / n if n else float("nan"))
        r.update(wall_s=round(sum(c["wall_s"] for c in cs), 1), eval_max_load=max(c["load"] for c in cs))
        out.append({**r, **_likelihood(far)})
    return out


def length_table(cells: list[dict]) -> str:
    """Prompt lengths and needle distances per task (and format)."""
    lines = [
        "Prompt lengths (tokens beyond the window) and needle distances (tokens from the nearest needle to "
        "the end), per task and format:",
        "",
        "| task | format | prompts | tokens (min-max) | beyond the window (median, max) | longer than the window | "
        "needle distance (min, median) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["task"], c["format"]), []).append(c)
    for (t, f), cs in groups.items():
        s = length_summary([c["tokens"] for c in cs if c["model"] == cs[0]["model"]], cs[0]["window"])
        d = sorted(c["distance"] for c in cs)
        lines.append(
            f"| {t} | {f} | {s['prompts']} | {s['tokens_min']:,}-{s['tokens_max']:,} | "
            f"{s['beyond_window_median']:,.0f}, {s['beyond_window_max']:,} | {100 * s['longer_than_window']:.0f}% | "
            f"{d[0]:,}, {d[len(d) // 2]:,} |"
        )
    return "\n".join(lines)
