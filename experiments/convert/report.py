"""Tables, plots and statements of `python -m experiments.convert`, written from
the sweep records by `experiments.common.results.write_results`: recipes and
perplexity (ppl_report.py; the suites' folders are latte eval's: suites.py)."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.results import claim_results, provenance, write_results
from latte.eval import TRAINED, original_context
from latte.train import TRAINER, run_wall_time

from .ppl_report import _fmt, corpus_tables, decode_table, eval_records, plot
from .stages import (
    CONTEXTS,
    DEFAULT_RECIPE,
    DOCUMENTS,
    FULL_DOCUMENTS,
    SHORT,
)


def recipe_table(rows: list[dict]) -> str:
    lines = [
        "| recipe | overrides | validation ppl | training tokens | steps | training wall s | load at start |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | `{r['overrides'] or '-'}` | {r['val_ppl']:.2f} | {r['train_tokens']:,} | "
            f"{r['steps']} | {r['train_wall_s']:,.0f} | {_fmt(r.get('load_start'), '.1f')} |"
        )
    return "\n".join(lines) + "\n\n" + recipe_statement(rows)


def recipe_statement(rows: list[dict]) -> str:
    """Which recipe came out best, and whether the comparison is at equal
    training tokens (a time budget can stop runs at different steps)."""
    trained = [r for r in rows if not r["recipe"].startswith("none")]
    if not trained:
        return ""
    best = min(trained, key=lambda r: r["val_ppl"])
    tokens = {r["train_tokens"] for r in trained}
    same = (
        f"Every recipe saw the same {tokens.pop():,} training tokens."
        if len(tokens) == 1
        else "**The recipes saw different numbers of training tokens** (the time budget stopped some runs "
        "early), so this is not a like-for-like comparison."
    )
    if len(trained) == 1:
        return f"Only {best['recipe']} ran. {same}"
    default = next((r for r in trained if r["recipe"] == DEFAULT_RECIPE), None)
    verdict = (
        f"the default, {DEFAULT_RECIPE}, is the best here ({best['val_ppl']:.2f})"
        if best is default
        else f"**{best['recipe']} is best here ({best['val_ppl']:.2f}), not the default {DEFAULT_RECIPE}"
        + (f" ({default['val_ppl']:.2f})" if default else "")
        + "**"
    )
    return f"Lowest validation perplexity: {verdict}. {same}"


FULL_COMMAND = "python -m experiments.convert --readme results/README.md"


def full_command(a) -> str:
    """The protocol's command for what this invocation evaluated."""
    if a.converted is None:
        return FULL_COMMAND
    return (
        f"python -m experiments.convert --stages eval,tasks,needle --converted {a.converted} --readme results/README.md"
    )


def cells_wall_s(recipe_rows, cells) -> float:
    """Seconds the sweep cells themselves took (training, baselines,
    evaluation), whichever invocation computed them."""
    total = sum(r.get("cell_wall_s", 0.0) for r in recipe_rows or [])
    return total + sum(c.get("wall_s", 0.0) for c in cells or [])


def budget_md(a, argv, trained: dict | None, cells_s: float = 0.0, wall_s: float = 0.0) -> str:
    """What this run did against the full protocol (docs/evaluation.md §7):
    contexts not evaluated, training tokens and time, the load it ran under."""
    missing = [c for c in CONTEXTS if c not in a.contexts]
    parts = []
    if cells_s > wall_s:
        parts.append(
            f"This invocation reused finished cells: the cells took {cells_s:,.0f} s in all "
            f"(the wall time above is this invocation's)."
        )
    if trained:
        parts.append(
            f"Up-training ({trained['recipe']}): {trained['train_tokens']:,} tokens in {trained['steps']} steps"
            + ("" if trained["train_wall_s"] is None else f", {trained['train_wall_s']:,.0f} s of training wall time")
            + (f", load average {trained['load_start']:.1f} at its start." if "load_start" in trained else ".")
        )
    if missing or a.threads < 2:
        parts.append(
            f"**Reduced CPU budget**: {a.threads} thread(s) per job (every cell records the load "
            "average at its start); "
            + (
                f"contexts {', '.join(f'{c:,}' for c in missing)} were not evaluated (the original's "
                "quadratic prefill and the converted model's pass through its cache do not fit this "
                "budget); "
                if missing
                else ""
            )
            + f"the full protocol is `{full_command(a)}`."
        )
    return " ".join(parts)


def stage_budget(a) -> str:
    """The eval stage's budget, and whether it is below the protocol's
    defaults (docs/evaluation.md §7.4)."""
    full = "all" if a.full_documents == 0 else a.full_documents
    text = (
        f"Budget: corpora {', '.join(a.corpora)}; {a.documents} document(s) each, {full} read to "
        f"{a.max_context:,} tokens by the window models and {a.original_full_documents} by the original"
        + (f", the others to {min(SHORT, a.max_context):,}." if a.max_context > SHORT else ".")
    )
    reduced = a.documents < DOCUMENTS or (0 < a.full_documents < FULL_DOCUMENTS)
    return text + (" **Below the protocol's default budget.**" if reduced else "")


def report(a, argv, started, recipe_rows, cells, subject=None) -> None:
    out = Path(a.out)
    trained = next((r for r in recipe_rows or [] if r["recipe"] == DEFAULT_RECIPE), None)
    trained = training_of(subject, a.models) or trained
    run = provenance("convert", argv, started, threads=a.threads)
    run["cells_wall_s"] = round(cells_wall_s(recipe_rows, cells), 1)
    run["budget"] = budget = budget_md(a, argv, trained, run["cells_wall_s"], run["wall_s"])
    head = budget + "\n\n" if budget else ""
    if recipe_rows:
        write_results(
            out / f"{a.name}-recipes",
            f"{a.section}-recipes",
            recipe_rows,
            recipe_table(recipe_rows) + ("\n\n" + budget if budget else ""),
            run,
            readme=a.readme,
        )
    if cells:
        contexts = a.contexts
        records = eval_records(cells, contexts)
        if trained:  # every record says what the converted model cost
            records = [
                {**r, "train_tokens": trained["train_tokens"], "train_wall_s": trained["train_wall_s"]} for r in records
            ]
        corpora = list(dict.fromkeys(r["corpus"] for r in records))
        md = head + stage_budget(a) + "\n\n"
        md += "\n\n".join(corpus_tables(records, c, contexts, original_context(subject)) for c in corpora)
        md += "\n\n" + decode_table(records, contexts)
        claim_results(out / a.name, "convert")
        plot(records, out / a.name / "convert.png")
        write_results(out / a.name, a.section, records, md, run, readme=a.readme, images=["convert.png"])


def training_of(subject, models=TRAINED) -> dict | None:
    """What the evaluated checkpoint cost to up-train: tokens and step from
    its trainer_state.json, the wall time from the run's summary.json when
    the run finished at that step (a run still training has none). None
    for a model folder, and when no up-trained model is among `models`
    (the report then names no checkpoint it did not evaluate)."""
    if subject is None or subject.run is None or not any(m in TRAINED for m in models):
        return None
    state_file = Path(subject.run.checkpoint) / TRAINER
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    summary_file = Path(subject.source) / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    finished = summary.get("step") == subject.run.step
    tokens = state.get("tokens_seen", summary.get("tokens_seen") if finished else None)
    if tokens is None:
        return None
    return {
        "recipe": f"{subject.source}, checkpoint {Path(subject.run.checkpoint).name}",
        "train_tokens": tokens,
        "steps": subject.run.step,
        "train_wall_s": round(run_wall_time(subject.source), 3) if finished else None,
    }
