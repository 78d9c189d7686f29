"""Tables and the accuracy-vs-state plot of `latte experiment mqar`."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .results import pyplot, save_figure

MODEL_KEY = ("model", "dim", "num_latents")


def best_lr(records: list[dict]) -> list[dict]:
    """One record per (setting, model, dim, latents): the lr with the highest
    accuracy (ties: the smaller lr), as Zoology selects."""
    groups = defaultdict(list)
    for r in records:
        groups[(r["seq_len"], r["num_kv_pairs"], *(r[k] for k in MODEL_KEY))].append(r)
    return [max(rs, key=lambda r: (r["accuracy"], -r["lr"])) for rs in groups.values()]


def _label(r: dict) -> str:
    if r["mixer"] == "latte":
        return f"{r['model']} L={r['num_latents']}"
    if r["mixer"] == "macchiato":
        return f"macchiato L={r['num_latents']} w={r['window_size']}"
    return r["model"]


def _bytes(n: int) -> str:
    return f"{n / 1000:,.1f}K" if n < 10**6 else f"{n / 1e6:,.2f}M"


def accuracy_table(best: list[dict]) -> str:
    settings = sorted({(r["seq_len"], r["num_kv_pairs"]) for r in best})
    rows = defaultdict(dict)
    for r in best:
        rows[(r["dim"], r["mixer"] != "softmax", r["state_bytes"] if r["mixer"] != "softmax" else 0, _label(r))][
            (r["seq_len"], r["num_kv_pairs"])
        ] = r
    head = "| model | dim | state bytes / layer | " + " | ".join(f"T={T}, {P} pairs" for T, P in settings) + " |"
    lines = [head, "|" + "---|" * (3 + len(settings))]
    for key in sorted(rows):
        cells = rows[key]
        any_r = next(iter(cells.values()))
        states = sorted({c["state_bytes"] for c in cells.values()})
        state = _bytes(states[0]) if len(states) == 1 else " / ".join(_bytes(s) for s in states) + " (grows with T)"
        accs = []
        for s in settings:
            c = cells.get(s)
            cut = f", stopped at step {c['steps']:,} of {c['planned_steps']:,}" if c and c.get("incomplete") else ""
            accs.append("" if c is None else f"{c['accuracy']:.3f} <sub>lr {c['lr']:g}{cut}</sub>")
        lines.append(f"| {key[3]} | {any_r['dim']} | {state} | " + " | ".join(accs) + " |")
    return "\n".join(lines)


def _acc(r: dict) -> str:
    """Accuracy, with the step reached when a deadline cut the run short."""
    cut = f" (stopped at step {r['steps']:,} of {r['planned_steps']:,})" if r.get("incomplete") else ""
    return f"{r['accuracy']:.3f}{cut}"


def equal_state_table(best: list[dict]) -> str:
    """Latte with num_latents = dim holds exactly linear attention's
    attention state (L (dv + 1) = H dv (dv + 1)): the like-for-like pairs,
    with the same qk mixer in front (none with none, conv with conv)."""
    by = {(r["seq_len"], r["num_kv_pairs"], r["dim"], r["model"], r["num_latents"]): r for r in best}
    cols = ("linear", "latte-none", "linear-conv", "latte-conv", "latte-conv_rglru")
    lines = [
        "| T, pairs | dim | attention state bytes | " + " | ".join(cols) + " |",
        "|---|---|---|" + "---|" * len(cols),
    ]
    for T, P, dim in sorted({k[:3] for k in by if k[3] in ("linear", "linear-conv")}):
        cells = [by.get((T, P, dim, m, None if m.startswith("linear") else dim)) for m in cols]
        size = next(c for c in cells if c is not None)["attn_state_bytes"]
        lines.append(
            f"| {T}, {P} | {dim} | {_bytes(size)} | " + " | ".join("" if c is None else _acc(c) for c in cells) + " |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def _byte_ticks(ax) -> None:
    """Label a log axis of byte counts at 1K, 2K, 4K, ... inside its current
    limits (matplotlib's default minor labels, "2x10^3 3x10^3 ...", overlap
    on a narrow panel)."""
    from matplotlib.ticker import NullFormatter

    lo, hi = ax.get_xlim()
    ticks = [1000 * 2**k for k in range(24) if lo <= 1000 * 2**k <= hi]
    if ticks:
        ax.set_xticks(ticks, [_bytes(t).replace(".0K", "K") for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)


def plot(best: list[dict], path: Path) -> bool:
    """Accuracy vs state bytes per layer, one panel per (T, pairs), one line
    per model family and width (Zoology's figure)."""
    plt = pyplot()
    if plt is None:
        return False
    settings = sorted({(r["seq_len"], r["num_kv_pairs"]) for r in best})
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings) + 1.5, 4.5), squeeze=False)
    models = sorted({r["model"] for r in best})
    color = {m: f"C{i % 10}" for i, m in enumerate(models)}
    for ax, (T, P) in zip(axes[0], settings):
        for m in models:
            for dim, marker in ((64, "o"), (128, "s"), (16, "^")):
                pts = sorted(
                    (r["state_bytes"], r["accuracy"])
                    for r in best
                    if r["model"] == m and r["dim"] == dim and (r["seq_len"], r["num_kv_pairs"]) == (T, P)
                )
                if pts:
                    ax.plot(
                        *zip(*pts),
                        marker=marker,
                        ms=5,
                        color=color[m],
                        lw=1,
                        label=m if dim == min(r["dim"] for r in best) else None,
                    )
        ax.set_xscale("log")
        _byte_ticks(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"MQAR T={T}, {P} key-value pairs")
        ax.set_xlabel("state bytes per layer (float32)")
        ax.set_ylabel("test accuracy (best lr)")
        ax.grid(alpha=0.3)
    # outside the panels: inside, it hid the points in its corner (dim 128's near 0.25 at T=64)
    seen = {}
    for ax in axes[0]:  # every family, whichever panels it ran in
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    names = sorted(seen)
    axes[0][-1].legend([seen[n] for n in names], names, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("circles: dim 64, squares: dim 128; latte lines: num_latents = dim/4, dim, 4 dim", fontsize=9)
    save_figure(plt, fig, path, dpi=110)
    return True


SERIES = ("interval_ms_per_step", "interval_cpu_ms_per_step", "epoch_train_seconds", "accuracy_curve")


def flat_records(records: list[dict]) -> list[dict]:
    """results.json's records: the per-interval and per-epoch step times
    (lists) summarised by their first and last values; the series themselves
    go to step_times.json."""
    flat = []
    for r in records:
        f = {k: v for k, v in r.items() if k not in SERIES}
        ms = r.get("interval_ms_per_step") or []
        f["ms_per_step_first_interval"] = ms[0] if ms else None
        f["ms_per_step_last_interval"] = ms[-1] if ms else None
        cpu = r.get("interval_cpu_ms_per_step") or []
        f["cpu_ms_per_step_first_interval"] = cpu[0] if cpu else None
        f["cpu_ms_per_step_last_interval"] = cpu[-1] if cpu else None
        flat.append(f)
    return flat


def step_time_table(records: list[dict], eval_every: int) -> str:
    """Training time per step (evaluations excluded) through each run: flat
    if the step cost does not depend on what the model has learnt."""
    timed = [r for r in records if r.get("interval_ms_per_step")]
    if not timed:
        return ""
    lines = [
        "| model | T, pairs | steps | accuracy | wall ms/step: all | first interval | last interval | "
        "slowest / fastest interval | CPU ms/step: first, last interval | train s per epoch | "
        "load at start, end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(timed, key=lambda r: (r["seq_len"], r["model"], r["num_latents"] or 0)):
        ms = r["interval_ms_per_step"]
        epochs = ", ".join(f"{s:.0f}" for s in r["epoch_train_seconds"])
        cpu = r.get("interval_cpu_ms_per_step")
        cpu_cell = f"{cpu[0]:.0f}, {cpu[-1]:.0f}" if cpu else "not recorded"
        lines.append(
            f"| {_label(r)} | {r['seq_len']}, {r['num_kv_pairs']} | {r['steps']} | {r['accuracy']:.3f} | "
            f"{r['ms_per_step']:.0f} | {ms[0]:.0f} | {ms[-1]:.0f} | {max(ms) / min(ms):.2f} | {cpu_cell} | {epochs} | "
            f"{r['loadavg_start']:.1f}, {r['loadavg_end']:.1f} |"
        )
    return (
        f"Time of the training steps alone (test evaluations excluded), in intervals of {eval_every} "
        "steps; 1 thread, on a machine shared with other jobs, so wall intervals also move with the load; "
        "the CPU time of the training thread moves far less. "
        "The full series, with the test accuracy at each evaluation, are in step_times.json.\n\n" + "\n".join(lines)
    )


def lr_table(records: list[dict]) -> str:
    """Accuracy at each learning rate, for the runs tried at more than one
    (the best-lr tables hide how much the choice mattered)."""
    groups = defaultdict(dict)
    for r in records:
        groups[(r["seq_len"], r["num_kv_pairs"], r["dim"], _label(r))][r["lr"]] = r
    multi = {k: v for k, v in groups.items() if len(v) > 1}
    if not multi:
        return ""
    lrs = sorted({lr for v in multi.values() for lr in v}, reverse=True)
    lines = [
        "| T, pairs | dim | model | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
        "|---|---|---|" + "---|" * len(lrs),
    ]
    for T, P, dim, label in sorted(multi):
        runs = multi[(T, P, dim, label)]
        lines.append(
            f"| {T}, {P} | {dim} | {label} | " + " | ".join(_acc(runs[lr]) if lr in runs else "" for lr in lrs) + " |"
        )
    return "\n".join(lines)


def _unfinished(pending: list[dict], planned: list[dict]) -> str:
    """The cells of the command's plan with no finished record, in the plan's
    order, by width and lr, then setting; a group none of whose runs finished
    is given by its count."""
    if not pending:
        return ""

    def group(cells: list[dict], key) -> dict:
        out = defaultdict(list)
        for c in cells:
            out[key(c)].append(c)
        return out

    def width_lr(c: dict) -> tuple:
        return c["dim"], c["lr"]

    def setting(c: dict) -> tuple:
        return c["seq_len"], c["num_kv_pairs"]

    todo, plan = group(pending, width_lr), group(planned, width_lr)
    parts = []
    for (dim, lr), cells in todo.items():
        if len(cells) == len(plan[(dim, lr)]):
            parts.append(f"dim {dim}, lr {lr:g}: all {len(cells)} runs")
            continue
        settings = []
        plan_s = group(plan[(dim, lr)], setting)
        for (T, P), cs in group(cells, setting).items():
            names = ", ".join(
                c["model"] + (f" L={c['num_latents']}" if c["num_latents"] not in (None, c["dim"]) else "") for c in cs
            )
            settings.append(f"T={T}: all {len(cs)} runs" if len(cs) == len(plan_s[(T, P)]) else f"T={T}: {names}")
        parts.append(f"dim {dim}, lr {lr:g}: " + "; ".join(settings))
    return (
        f"\n\n**Not finished: {len(pending)} of the {len(planned)} runs of this plan** (Latte without L= "
        "has num_latents = dim): " + ". ".join(parts) + "."
    )


def report(
    records: list[dict], out: Path, *, budget, pending: list[dict], planned: list[dict] | None = None, scope: str = ""
) -> tuple[str, list[str]]:
    """(markdown tables, names of the PNGs written in out). `scope`: a
    sentence saying what part of the full protocol ran (empty: all of it)."""
    best = best_lr(records)
    png = Path(out) / "accuracy_vs_state.png"
    Path(out).mkdir(parents=True, exist_ok=True)
    plotted = plot(best, png)
    train = ", ".join(f"T={T}: {n:,}" for T, n in sorted(budget.train_examples.items()))
    total_s = sum(r["seconds"] for r in records)
    loads = [r["loadavg_start"] for r in records]
    fillers = sorted({r["fillers"] for r in records})
    parts = [
        f"Zoology's MQAR at CPU scale: vocabulary {budget.vocab_size}, fillers {'/'.join(fillers)}, query slots by the "
        f"power law a = 0.01; 2 attention-only layers, 2 heads; training examples {train}, "
        f"{budget.test_examples:,} test examples (a disjoint seed stream), batch {budget.batch_size}, "
        f"up to {budget.epochs} epochs, early stop at accuracy 0.99; AdamW wd 0.1, warm-up + cosine; "
        f"best of lr in {{{', '.join(f'{x:g}' for x in budget.lrs)}}} on the test accuracy (of the lrs that ran: "
        "each accuracy names its lr). "
        f"{len(records)} runs, {total_s / 3600:.1f} h of training in total; load average "
        f"{min(loads):.1f}-{max(loads):.1f} at the runs' starts (a machine shared with other jobs)."
        + (f"\n\n{scope}" if scope else "")
        + _unfinished(pending, planned if planned is not None else pending),
        "## Accuracy per setting (best lr)",
        "State bytes per layer in float32: latte num_latents x (dv + 1) plus its qk mixer's state (conv: "
        "2 dim, RG-LRU: dim floats); softmax the KV cache at T; linear H dk (dv + 1), plus the conv's for "
        "linear-conv; swa the W - 1 cached "
        "keys and values; macchiato latents + window cache + qk mixer.",
        accuracy_table(best),
    ]
    eq = equal_state_table(best)
    if eq:
        parts += ["## Latte against linear attention at equal attention state (num_latents = dim)", eq]
    by_lr = lr_table(records)
    if by_lr:
        parts += ["## Accuracy at each learning rate (the runs tried at more than one)", by_lr]
    steps = step_time_table(records, budget.eval_every)
    if steps:
        parts += ["## Step time through training", steps]
        series = [
            {k: r.get(k) for k in ("model", "seq_len", "num_kv_pairs", "dim", "num_latents", "lr", *SERIES)}
            for r in records
            if r.get("interval_ms_per_step")
        ]
        (Path(out) / "step_times.json").write_text(json.dumps(series, indent=1) + "\n")
    return "\n\n".join(parts), ([png.name] if plotted else [])
