"""The stages of `python -m experiments.convert`: `latte eval`'s suites
(latte/eval/suites.py, each one's cells, records and table beside its
metric) on the converted model, against the original and the window + sinks
model (`--against original,window`), into results/NAME (the eval stage: the
ppl suite) or results/NAME-STAGE as `latte eval --out` writes a folder
(results.json with the provenance and records, results.md). The study gives
each suite its budget: the lengths, data, tasks, examples and trials of its
options.

Before issue 58 the study ran these evaluations with code of its own; the
published results folders it wrote then (results/convert, convert/gemma3-270m,
convert-smollm2 and its -tasks, -retrieval, -long-retrieval, -fewshot)
record that command, which runs at the commit their results/README.md note
names.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from experiments.common.results import readme_body
from latte.eval import ZERO_SHOT_TASKS, Request, evaluate
from latte.reporting import update_readme

STAGES = ("eval", "tasks", "needle", "retrieval", "fewshot")
SUITE = {"eval": "ppl"}  # a stage -> the suite it runs (the others: the suite of its name)
AGAINST = {"original": "original", "window+sinks": "window"}  # --models -> latte eval --against
FEWSHOT_TASKS = ("mmlu", "arc_challenge", "csqa", "hellaswag", "coqa", "naturalqs_open")
RETRIEVAL_TASKS = ("passkey", "multikey", "multivalue")


def check_tasks(text: str, known=ZERO_SHOT_TASKS, flag: str = "--tasks") -> list[str]:
    names = [t for t in text.split(",") if t]
    if not names or set(names) - set(known):
        raise ValueError(f"{flag} {text!r}: expected a comma-separated subset of {','.join(known)}")
    return names


def budget(a, stage: str) -> dict:
    """The Request fields a stage's options give: lengths, tasks, examples, trials."""
    if stage == "eval":
        return {"lengths": tuple(a.contexts), "data": a.data, "documents": a.documents}
    if stage == "tasks":
        return {"tasks": tuple(a.tasks), "examples": a.task_examples}
    if stage == "needle":
        return {"lengths": tuple(a.needle_contexts), "trials": a.needle_trials}
    if stage == "retrieval":
        return {"lengths": tuple(a.retrieval_contexts), "tasks": tuple(a.retrieval_tasks), "trials": a.retrieval_trials}
    return {"tasks": tuple(a.fewshot_tasks), "examples": a.fewshot_examples}


def suite_stage(a, argv: list[str], stage: str, model: Path) -> Path:
    """`latte eval MODEL --suite SUITE --against ...` into OUT/NAME (the eval
    stage) or OUT/NAME-STAGE, resumable cell by cell there; its README
    section replaced (--readme). The converted model is always evaluated;
    --models adds the original and window + sinks."""
    left = [m for m in a.models if m not in (*AGAINST, "converted")]
    if left:
        note = f"latte eval compares the converted model with {', '.join(AGAINST)}"
        print(f"{stage}: --models {','.join(left)} left out ({note})", file=sys.stderr)
    suffix = "" if stage == "eval" else f"-{stage}"
    name = a.section + suffix
    req = Request(
        model=str(model),
        suites=(SUITE.get(stage, stage),),
        against=tuple(AGAINST[m] for m in a.models if m in AGAINST),
        out=str(Path(a.out) / f"{a.name}{suffix}"),
        command=shlex.join(["python", "-m", "experiments.convert", *argv]),
        **budget(a, stage),
    )
    out = evaluate(req)
    if a.readme:
        text = Path(a.readme).read_text()
        if f"<!-- results:{name}:start -->" not in text:
            print(f"note: {a.readme} has no results:{name} markers; section not written", file=sys.stderr)
        else:
            body = readme_body((out / "results.md").read_text(), out, Path(a.readme))
            update_readme(Path(a.readme), name, body, kind="results")
    return out
