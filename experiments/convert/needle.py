"""Stage `needle` of `python -m experiments.convert`: pass-key retrieval of the four
models (latte.eval's MODELS) in a haystack of held-out essays, by context
length and needle depth (latte.eval.needle; docs/evaluation.md §7)
-> results/convert-needle: accuracy per (model, context, depth) cell, a heat
map per model.

One sweep cell per (model, context, depth, trial). Trial i uses the essays
in order i and a key drawn from (context, depth, i): the same prompts for
every model.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from experiments.common.results import Sweep
from latte.data import eval_essays
from latte.eval import (
    MODELS,
    TRAINED,
    PrefixFeeder,
    as_model,
    bos_cell,
    haystack_text,
    label,
    make_key,
    needle_prompt,
    run_trial,
    sentence_ends,
    sinks_cell,
)
from latte.reporting import pyplot, save_figure

from .stages import checks


def needle_stage(a, subject, sinks: int) -> list[dict]:
    tok = subject.tokenizer
    essays = eval_essays()
    hay: dict[int, tuple[list[int], list[bool]]] = {}
    bos = subject.bos  # the model's first token (Gemma's), before the haystack
    for i in range(a.needle_trials):
        ids = tok.encode(haystack_text(essays, seed=i))
        hay[i] = (bos + ids, [False] * len(bos) + sentence_ends(tok, ids))
    prompts = {
        (c, d, i): needle_prompt(tok, *hay[i], c, d, make_key(f"{c}-{d}-{i}"), keep=len(bos))
        for c in a.needle_contexts
        for d in a.needle_depths
        for i in range(a.needle_trials)
    }
    # per model and trial, in the order of the needle's position: the
    # converted models continue one haystack state from prompt to prompt
    order = sorted(prompts, key=lambda k: (k[2], prompts[k].needle_start, k[0]))
    cells = [
        {"model": m, "context": c, "depth": d, "trial": i, **sinks_cell(m, sinks), **bos_cell(subject)}
        for m in a.models
        for c, d, i in order
    ]
    cells = [{**c, "source": subject.identity} if c["model"] in TRAINED else c for c in cells]
    feeder: dict[tuple, PrefixFeeder] = {}

    def cell_fn(cell):
        load0 = os.getloadavg()[0]
        prompt = prompts[(cell["context"], cell["depth"], cell["trial"])]
        with as_model(subject, cell["model"], sinks) as model:
            shared = None
            if cell["model"] != "original":  # constant-size states: copies are cheap
                key = (cell["model"], cell["trial"])
                if key not in feeder:
                    feeder.clear()
                    feeder[key] = PrefixFeeder(model, hay[cell["trial"]][0])
                shared = feeder[key]
            rec = run_trial(model, tok, prompt, feeder=shared)
        return {**rec, "load": round(load0, 2), "window": subject.model.converted[0].window_size}

    sweep = Sweep(Path(a.runs) / "cells-needle", cells, **checks(a, ("correct", "answer", "load")))
    return sweep.run(cell_fn, desc="needle")


def needle_records(cells: list[dict]) -> list[dict]:
    """One record per (model, context, depth): trials, found, accuracy and
    its binomial standard error, mean needle distance from the question,
    whether it lay beyond the window, seconds."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["model"], c["context"], c["depth"]), []).append(c)
    out = []
    for (model, ctx, depth), cs in sorted(groups.items(), key=lambda kv: (MODELS.index(kv[0][0]), *kv[0][1:])):
        n, k = len(cs), sum(c["correct"] for c in cs)
        p = k / n
        out.append(
            {
                "model": model,
                "context": ctx,
                "depth": depth,
                "trials": n,
                "found": k,
                "accuracy": p,
                "accuracy_stderr": math.sqrt(p * (1 - p) / n),
                "mean_distance": sum(c["distance"] for c in cs) / n,
                "beyond_window": all(c["distance"] >= c["window"] for c in cs),
                "wall_s": round(sum(c["wall_s"] for c in cs), 1),
                "cpu_s": round(sum(c["cpu_s"] for c in cs), 1),
                "max_load": max(c["load"] for c in cs),
                **({"sinks": cs[0]["sinks"]} if "sinks" in cs[0] else {}),
            }
        )
    return out


def needle_tables(records: list[dict], sinks: int) -> str:
    models = [m for m in MODELS if any(r["model"] == m for r in records)]
    contexts = sorted({r["context"] for r in records})
    depths = sorted({r["depth"] for r in records})
    by = {(r["model"], r["context"], r["depth"]): r for r in records}
    lines = [
        "Pass keys found (all depths together), by context length:",
        "",
        "| context | " + " | ".join(label(m, sinks) for m in models) + " |",
        "|---|" + "---|" * len(models),
    ]
    for c in contexts:
        row = []
        for m in models:
            rs = [by[(m, c, d)] for d in depths if (m, c, d) in by]
            found, n = sum(r["found"] for r in rs), sum(r["trials"] for r in rs)
            row.append(f"{found}/{n}" if n else "-")
        lines.append(f"| {c:,} | " + " | ".join(row) + " |")
    for m in models:
        lines += ["", f"{label(m, sinks)}: found / tried, by needle depth (rows) and context (columns):", ""]
        lines += ["| depth | " + " | ".join(f"{c:,}" for c in contexts) + " |", "|---|" + "---|" * len(contexts)]
        for d in depths:
            row = [f"{by[(m, c, d)]['found']}/{by[(m, c, d)]['trials']}" if (m, c, d) in by else "-" for c in contexts]
            lines.append(f"| {100 * d:.0f}% | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + needle_statement(records, sinks)


def needle_statement(records: list[dict], sinks: int) -> str:
    """The issue's needle target, judged cell by cell: the converted model
    at least window + sinks everywhere, and above it beyond the window."""
    by = {(r["model"], r["context"], r["depth"]): r for r in records}
    keys = [(c, d) for (m, c, d) in by if m == "converted" and ("window+sinks", c, d) in by]
    if not keys:
        return "Needle target: not judged (the converted or the window + sinks model is missing)."
    conv = {k: by[("converted", *k)]["accuracy"] for k in keys}
    ref = {k: by[("window+sinks", *k)]["accuracy"] for k in keys}
    below = [k for k in keys if conv[k] < ref[k]]
    beyond = [k for k in keys if by[("converted", *k)]["beyond_window"]]
    above = [k for k in beyond if conv[k] > ref[k]]
    found_beyond = sum(by[("converted", *k)]["found"] for k in beyond)
    tried_beyond = sum(by[("converted", *k)]["trials"] for k in beyond)
    ok = not below and beyond and len(above) == len(beyond)
    text = (
        f"**Needle target {'met' if ok else 'missed'}**: the converted model is below window + {sinks} sinks "
        f"in {len(below)} of {len(keys)} (context, depth) cells and above it in {len(above)} of the "
        f"{len(beyond)} cells whose needle lies beyond the window."
    )
    if beyond and found_beyond == 0:
        text += (
            f" **The latent state retrieves nothing here**: of {tried_beyond} needles beyond the window the "
            "converted model found none."
        )
    elif beyond:
        text += f" It found {found_beyond} of {tried_beyond} needles beyond the window."
    return text


def plot_heatmaps(records: list[dict], out: Path, sinks: int) -> list[str]:
    """needle-<model>.png: accuracy by depth and context, one per model."""
    plt = pyplot()
    if plt is None:
        return []
    names = []
    for m in [m for m in MODELS if any(r["model"] == m for r in records)]:
        rs = [r for r in records if r["model"] == m]
        contexts, depths = sorted({r["context"] for r in rs}), sorted({r["depth"] for r in rs})
        grid = [[float("nan")] * len(contexts) for _ in depths]
        for r in rs:
            grid[depths.index(r["depth"])][contexts.index(r["context"])] = 100 * r["accuracy"]
        fig, ax = plt.subplots(figsize=(1.2 * len(contexts) + 2, 0.6 * len(depths) + 1.5))
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(contexts)), [f"{c // 1024}K" if c >= 1024 else str(c) for c in contexts])
        ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
        ax.set(xlabel="context (tokens)", ylabel="needle depth", title=f"Pass key found (%): {label(m, sinks)}")
        fig.colorbar(im, ax=ax)
        name = f"needle-{m.replace('+', '-')}.png"
        save_figure(plt, fig, out / name)
        names.append(name)
    return names
