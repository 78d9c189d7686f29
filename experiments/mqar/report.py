"""Tables and the accuracy-vs-state plot of `python -m experiments.mqar`."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from experiments.common.stats import t_central, t_quantile

from .cells import LEGACY, SERIES
from .plot import _bytes, plot

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


def flat_records(records: list[dict]) -> list[dict]:
    """results.json's records: the per-interval and per-epoch step times
    (lists) summarised by their first and last values; the series themselves
    go to step_times.json. The steps a run was resumed from become one
    space-separated string ("3000" or "1250 3500")."""
    flat = []
    for r in records:
        f = {k: v for k, v in r.items() if k not in SERIES}
        ms = r.get("interval_ms_per_step") or []
        f["ms_per_step_first_interval"] = ms[0] if ms else None
        f["ms_per_step_last_interval"] = ms[-1] if ms else None
        cpu = r.get("interval_cpu_ms_per_step") or []
        f["cpu_ms_per_step_first_interval"] = cpu[0] if cpu else None
        f["cpu_ms_per_step_last_interval"] = cpu[-1] if cpu else None
        if isinstance(f.get("resumed_from_steps"), list):  # a cell continued from saved progress
            f["resumed_from_steps"] = " ".join(str(s) for s in f["resumed_from_steps"])
        flat.append(f)
    return flat


def headline(records: list[dict], epochs: int) -> tuple[list[dict], list[dict]]:
    """(headline, other): the headline runs are seed 0 at `epochs` (the plan's),
    or, in a report of other seeds only, those of its smallest seed."""
    first = min(r["seed"] for r in records)
    head = [r for r in records if r["seed"] == first and r["max_epochs"] == epochs] or [
        r for r in records if r["seed"] == first
    ]
    return head, [r for r in records if r not in head]


def seed_table(head: list[dict], other: list[dict], epochs: int) -> str:
    """Accuracy per seed, mean ± std, for each (setting, model, lr, epochs)
    of the cells that ran at another seed or epoch budget than the headline."""
    if not other:
        return ""

    def cell(r: dict) -> tuple:
        return r["seq_len"], r["num_kv_pairs"], r["dim"], _label(r)

    shown = {cell(r) for r in other}
    groups = defaultdict(list)
    for r in head + other:
        if cell(r) in shown:
            groups[(*cell(r), r["lr"], r["max_epochs"])].append(r)
    lines = [
        "| T, pairs | dim | model | lr | epochs (most) | seeds | accuracy per seed | mean ± std (min-max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups, key=lambda k: (k[:4], -k[4], k[5])):
        T, P, dim, label, lr, max_epochs = key
        rs = sorted(groups[key], key=lambda r: r["seed"])
        accs = [r["accuracy"] for r in rs]
        spread = (
            f"{statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f} ({min(accs):.3f}-{max(accs):.3f})"
            if len(accs) > 1
            else f"{accs[0]:.3f}"
        )
        lines.append(
            f"| {T}, {P} | {dim} | {label} | {lr:g} | {max_epochs} | {', '.join(str(r['seed']) for r in rs)} | "
            + ", ".join(_acc(r) for r in rs)
            + f" | {spread} |"
        )
    return (
        "A seed sets the model's initialisation and the order of the batches; the training and test "
        "examples are the same for every seed. The tables above show seed 0 at the plan's epochs.\n\n"
        + "\n".join(lines)
    )


# The pair of equal attention state that issue 44 asks to order: Latte with num_latents = dim
# against linear attention, both with the short convolution in front of q/k.
PAIR = ("latte-conv", "linear-conv")


def paired_table(records: list[dict]) -> str:
    """Latte-conv (num_latents = dim) minus linear-conv per seed, for each (setting, dim,
    lr, epochs) where both ran at two seeds or more: the differences, their mean, standard
    deviation, 95% confidence interval and two-sided paired t-test p, and the exact
    sign-flip (permutation) p, which needs no normality (its smallest value is 2 / 2^n)."""
    runs = defaultdict(dict)
    for r in records:
        if r["model"] in PAIR and (r["model"] == PAIR[1] or r["num_latents"] == r["dim"]) and not r.get("incomplete"):
            runs[(r["seq_len"], r["num_kv_pairs"], r["dim"], r["lr"], r["max_epochs"])][(r["model"], r["seed"])] = r
    lines = []
    for key in sorted(runs):
        got = runs[key]
        seeds = sorted({s for m, s in got if (PAIR[0], s) in got and (PAIR[1], s) in got})
        if len(seeds) < 2:
            continue
        d = [got[PAIR[0], s]["accuracy"] - got[PAIR[1], s]["accuracy"] for s in seeds]
        st = paired_stats(d)
        T, P, dim, lr, epochs = key
        lines.append(
            f"| {T}, {P} | {dim} | {lr:g} | {epochs} | {', '.join(map(str, seeds))} | "
            + ", ".join(f"{x:+.3f}" for x in d)
            + f" | {st['mean']:+.3f} ± {st['std']:.3f} | [{st['ci_low']:+.3f}, {st['ci_high']:+.3f}] "
            f"| {st['t']:+.2f} ({st['n'] - 1} df), p = {st['p_t']:.3f} | {st['p_sign_flip']:.3f} | {_order(st)} |"
        )
    if not lines:
        return ""
    return (
        f"Accuracy of {PAIR[0]} (num_latents = dim) minus {PAIR[1]}, per seed (the same seed gives both "
        "the same batch order), at equal attention state:\n\n"
        "| T, pairs | dim | lr | epochs | seeds | difference per seed | mean ± std | 95% interval "
        "| paired t | sign-flip p | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(lines)
    )


def _order(st: dict) -> str:
    """Which family leads, when the paired t-test's 95% interval excludes 0."""
    if st["ci_low"] > 0:
        return f"{PAIR[0]} ahead (p < 0.05)"
    if st["ci_high"] < 0:
        return f"{PAIR[1]} ahead (p < 0.05)"
    need = seeds_for_power(st["mean"], st["std"])
    more = f"; about {need} seeds would detect a gap this size at 80% power" if need else ""
    return f"undecided (the 95% interval holds 0{more})"


def seeds_for_power(mean: float, std: float, power: float = 0.8, cap: int = 1000) -> int | None:
    """The smallest n whose paired t-test (two-sided, 5%) detects a true mean difference `mean`
    with per-seed spread `std` at the given power, by the usual approximation
    n >= ((t_{0.975, n-1} + t_{power, n-1}) std / |mean|)^2; None when mean is 0 or n > cap."""
    if mean == 0 or not math.isfinite(mean) or not math.isfinite(std):
        return None
    for n in range(2, cap + 1):
        if n >= ((t_quantile(0.975, n - 1) + t_quantile(power, n - 1)) * std / abs(mean)) ** 2:
            return n
    return None


def paired_stats(d: list[float]) -> dict:
    """Mean, standard deviation, Student-t 95% interval and two-sided p of paired
    differences, and the exact two-sided sign-flip p (every assignment of signs)."""
    n = len(d)
    if n < 2:
        raise ValueError(f"paired_stats: need at least 2 differences, got {n}")
    mean, std = statistics.mean(d), statistics.stdev(d)
    se = std / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    half = t_quantile(0.975, n - 1) * se
    observed = abs(sum(d)) - 1e-12
    flips = [abs(sum(s * x for s, x in zip(signs, d))) >= observed for signs in itertools.product((1, -1), repeat=n)]
    return {
        "n": n,
        "mean": mean,
        "std": std,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "t": t,
        "p_t": 1.0 - t_central(abs(t), n - 1) if math.isfinite(t) else 0.0,
        "p_sign_flip": sum(flips) / len(flips),
    }


def _protocol(r: dict, epochs: int) -> str:
    """ " seed 1", " 6 epochs": what sets a run apart from the plan's headline runs."""
    return (f" seed {r['seed']}" if r["seed"] else "") + (
        f" {r['max_epochs']} epochs" if r["max_epochs"] != epochs else ""
    )


def step_time_table(records: list[dict], eval_every: int, epochs: int) -> str:
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
    for r in sorted(timed, key=lambda r: (r["seq_len"], r["model"], r["num_latents"] or 0, r["seed"], r["max_epochs"])):
        ms = r["interval_ms_per_step"]
        per_epoch = ", ".join(f"{s:.0f}" for s in r["epoch_train_seconds"])
        cpu = r.get("interval_cpu_ms_per_step")
        cpu_cell = f"{cpu[0]:.0f}, {cpu[-1]:.0f}" if cpu else "not recorded"
        lines.append(
            f"| {_label(r)}{_protocol(r, epochs)} | {r['seq_len']}, {r['num_kv_pairs']} | {r['steps']} | "
            f"{r['accuracy']:.3f} | {r['ms_per_step']:.0f} | {ms[0]:.0f} | {ms[-1]:.0f} | {max(ms) / min(ms):.2f} | "
            f"{cpu_cell} | {per_epoch} | "
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
                c["model"]
                + (f" L={c['num_latents']}" if c["num_latents"] not in (None, c["dim"]) else "")
                + (f" seed {c['seed']}" if c.get("seed") else "")
                for c in cs
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
    sentence saying what part of the full protocol ran (empty: all of it).
    The accuracy, equal-state and lr tables and the plot show the headline
    runs (seed 0 at the plan's epochs); runs at other seeds or epochs of the
    same cells get their own table."""
    head, other = headline(records, budget.epochs)
    best = best_lr(head)
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
    seeds = seed_table(head, other, budget.epochs)
    if seeds:
        parts += ["## Seeds and longer training (the cells run at more than one seed or epoch budget)", seeds]
    paired = paired_table(records)
    if paired:
        parts += [f"## {PAIR[0]} against {PAIR[1]}, paired by seed", paired]
    by_lr = lr_table(head)
    if by_lr:
        parts += ["## Accuracy at each learning rate (the runs tried at more than one)", by_lr]
    steps = step_time_table(records, budget.eval_every, budget.epochs)
    if steps:
        parts += ["## Step time through training", steps]
        series = [
            {k: r.get(k) for k in ("model", "seq_len", "num_kv_pairs", "dim", "num_latents", "lr", *LEGACY, *SERIES)}
            for r in records
            if r.get("interval_ms_per_step")
        ]
        (Path(out) / "step_times.json").write_text(json.dumps(series, indent=1) + "\n")
    return "\n\n".join(parts), ([png.name] if plotted else [])
