"""`python -m experiments.pilots`: the table of the recipe pilots of
docs/conversion.md §12 (issue 43), from their `latte convert` run folders.

For each pilot (a run folder, its newest checkpoint, or one of its step-N
folders) it records

  recipe     the pilot's name (its folder's name, "pilot-" dropped) and its
             overrides: every field of the run's saved config.yaml that
             differs from --config with --set (where and how fast a run
             goes left out, experiments/common/cells.py: NOT_PROTOCOL)
  budget     the optimizer steps and tokens the checkpoint had trained, and
             the run's wall time when the checkpoint is its last one
  retrieval  RULER-style retrieval in held-out essays (cells.py): passkey
             and multikey at 1K and 2K tokens by default, found / prompts
             whose needle lies beyond the window, for the original, the
             window + sinks model (both training-free) and the converted pilot

The cells follow the one reuse rule (cells.Sweep): the training-free
models' cells are computed once in WORK/baselines and shared by every pilot
of the same window and sinks (they record no pilot's weights), the
pilot's own in WORK/NAME/CHECKPOINT; a rerun reuses every finished cell, so
the command resumes where it stopped and a pilot added later costs only its
own prompts. The results go to --out (results.json, results.md, run.json;
latte/guard.py's write rule).

    python -m experiments.pilots --quick RUN...                 # the stand-in model (the test)
    python -m experiments.pilots runs/pilot-base runs/pilot-wdrop16 ...   # the pilots of §12
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from experiments.common.cells import NOT_PROTOCOL, protocol_difference, resolved_config
from experiments.common.results import check_readme, claim_results, claim_work, provenance, write_results
from experiments.common.stats import t_quantile
from experiments.convert.study import check_same_base, experiment_base, quick_setup
from latte.eval import label, open_subject, sinks_of
from latte.train import MANIFEST, run_wall_time

from .cells import DEFAULT_FORMAT, beyond, length_table, retrieval_records, retrieval_stage, stage_args

EXPERIMENT = "convert-recipes-v3"
TASKS = "passkey,multikey"
BASELINES = ("original", "window+sinks")
# what makes the training-free models of a pilot (they share cells when these agree)
BASELINE_FIELDS = ("conversion.window_size", "conversion.num_sinks", "conversion.sink_positions")
CURVE_PNG = "gap_vs_tokens.png"


def parse_args(argv: list[str]) -> argparse.Namespace:
    from latte.arguments import int_at_least

    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.pilots", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("pilots", nargs="+", help="the pilots' `latte convert` run folders (or step-N folders)")
    p.add_argument("--config", default="convert/quick", help="the config every pilot ran (overrides are against it)")
    p.add_argument("--set", action="append", default=[], help="overrides every pilot shares (section.field=value)")
    p.add_argument("--work", default="runs/convert-recipes-v3", help="the cells (resumable)")
    p.add_argument("--out", default=f"results/{EXPERIMENT}", help="results.json, results.md, run.json")
    p.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads")
    p.add_argument(
        "--readme",
        default=None,
        help="replace the section results:NAME of this markdown file (NAME: --out's folder name)",
    )
    p.add_argument("--retrieval-tasks", default=TASKS, help=f"of the retrieval stage ({TASKS})")
    p.add_argument("--retrieval-contexts", default=None, help="tokens (1024,2048; --quick: 400,512)")
    p.add_argument("--retrieval-depths", default=None, help="depths of the asked needle (0.1,0.5,0.8)")
    p.add_argument("--retrieval-trials", default=None, help="haystack orders per cell (3)")
    p.add_argument("--retrieval-format", default=None, help=f"prompt format ({DEFAULT_FORMAT}, the calibrated one)")
    p.add_argument("--quick", action="store_true", help="the stand-in model of `python -m experiments.convert --quick`")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    started = time.time()
    torch.set_num_threads(a.threads)
    claim_results(a.out, EXPERIMENT, create=False)  # before any work: the one write rule (latte/guard.py)
    # the table is named after its folder: a second curve (--out results/OTHER) has its own README section
    section = Path(a.out).name
    check_readme(a.readme, [section])
    claim_work(a.work, EXPERIMENT, create=True)  # before any work: the one write rule, as --out
    if a.quick:  # the stand-in base and data of `python -m experiments.convert --quick`, kept in --work
        quick = argparse.Namespace(runs=a.work, set=list(a.set))
        quick_setup(quick)
        a.set = quick.set
    names = [pilot_name(p) for p in a.pilots]
    if len(set(names)) != len(names):
        raise ValueError(f"pilots {' '.join(a.pilots)}: two pilots have the same name ({', '.join(names)})")
    rows, cells = [], []
    for path, name in zip(a.pilots, names):
        budget, pilot_cells, base_cells = evaluate_pilot(a, Path(path), name)
        rows.append(budget)
        cells += [{**c, "recipe": name} for c in pilot_cells]
        cells += [c for c in base_cells if c not in cells]
    records = gather(rows, cells)
    points = curve(rows, cells)
    run = provenance(EXPERIMENT, argv, started, threads=a.threads)
    run["machine"]["threads"] = a.threads
    claim_results(a.out, EXPERIMENT)
    md = tables(a, rows, records, cells) + curve_table(points)
    images = [CURVE_PNG] if points and plot_curve(points, Path(a.out) / CURVE_PNG) else []
    write_results(a.out, section, records + points, md, run, readme=a.readme, images=images)
    print(f"{EXPERIMENT}: {len(rows)} pilots, {len(cells)} prompts -> {a.out}", file=sys.stderr)
    return 0


def pilot_name(path: str) -> str:
    """A pilot's name: its run folder's name without "pilot-" (a step
    folder: the run's name, then the step)."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        return f"{pilot_name(str(p.parent))}@{p.name}"
    return p.resolve().name.removeprefix("pilot-")


def evaluate_pilot(a, path: Path, name: str) -> tuple[dict, list[dict], list[dict]]:
    """(the pilot's recipe and budget, its converted model's retrieval
    cells, the training-free models' cells of its window and sinks)."""
    if not path.is_dir():
        raise ValueError(f"pilot {path}: no such folder (expected a `latte convert` run folder or its step-N folder)")
    subject = open_subject(path)
    trained = subject.run
    if trained is None:
        raise ValueError(f"pilot {path}: a model folder; give the `latte convert` run folder (its budget is there)")
    run = path.parent if (path / MANIFEST).is_file() else path
    saved = json.loads((trained.checkpoint / "trainer_state.json").read_text())
    sinks = sinks_of(subject, None)
    # the baselines' models are fixed by these fields: pinned, so their cells are shared exactly when they agree
    flat = _saved_config(run)
    pins = [f"{k}={flat[k]}" for k in BASELINE_FIELDS if k in flat]
    base = stage_args(a, ",".join(BASELINES), Path(a.work) / "baselines", pins)
    base.inputs = {"base": experiment_base(base)}
    base_cells = retrieval_stage(base, subject, sinks)
    own = stage_args(a, "converted", Path(a.work) / name / Path(trained.checkpoint).name, pins)
    own.inputs = {"base": base.inputs["base"]}
    own.inputs["converted"] = check_same_base(own, subject)
    pilot_cells = retrieval_stage(own, subject, sinks)
    last = _last_step(run)
    wall = run_wall_time(run) if last == int(trained.step) else None
    budget = {
        "recipe": name,
        "run": str(run),
        "checkpoint": Path(trained.checkpoint).name,
        "overrides": overrides(a, flat),
        "steps": int(trained.step),
        "train_tokens": int(saved.get("tokens_seen", 0)),
        "finished": last == int(trained.step),
        "run_steps": last,
        "train_wall_s": None if wall is None else round(wall, 3),
        "sinks": sinks,
        "window": subject.model.converted[0].window_size,
        "baselines": " ".join(pins),
    }
    return budget, pilot_cells, [{**c, "baselines": budget["baselines"]} for c in base_cells]


def _saved_config(run: Path) -> dict:
    from latte.train import flatten, load_yaml

    path = run / "config.yaml"
    if not path.is_file():
        raise ValueError(f"pilot {run}: no config.yaml (not a `latte convert` run folder)")
    return {k: v for k, v in flatten(load_yaml(path)).items() if k not in NOT_PROTOCOL}


def _last_step(run: Path) -> int | None:
    """The step of the run's final evaluation (summary.json), None while it trains."""
    path = run / "summary.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    return None if s.get("stopped") else s.get("step")


def overrides(a, flat: dict) -> str:
    """The recipe: the run's fields that differ from --config with --set
    (and --quick's stand-in), as `section.field=value`, in the config's order."""
    expected = resolved_config(a.config, a.set)
    diff = protocol_difference(expected, flat)
    return " ".join(f"{k}={_show(now)}" for k, (_, now) in diff.items())


def _show(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# --------------------------------------------------------------------------- the table


def gather(rows: list[dict], cells: list[dict]) -> list[dict]:
    """One flat record per (recipe or baseline, task, context): found /
    prompts beyond the window, with the pilot's recipe and budget."""
    out = []
    for group in dict.fromkeys(c["baselines"] for c in cells if "baselines" in c):
        base = [c for c in cells if c.get("baselines") == group]
        for r in retrieval_records(base):
            out.append({"recipe": f"none ({r['model']})", "baselines": group, "train_tokens": 0, **r})
    for row in rows:
        own = [c for c in cells if c.get("recipe") == row["recipe"]]
        out += [{**row, **r} for r in retrieval_records(own)]
    return out


def _hits(recs: list[dict], task: str, context: int) -> str:
    r = [x for x in recs if x["task"] == task and x["context"] == context]
    return f"{r[0]['found_beyond']}/{r[0]['beyond_window']}" if r and r[0]["beyond_window"] else "-"


def _nats(recs: list[dict], task: str, context: int) -> str:
    r = [x for x in recs if x["task"] == task and x["context"] == context and "nll_gap" in x]
    if not r:
        return "-"
    r = r[0]
    gap = f"{r['nll_gap']:+.2f} ({r['answer_likelier']}/{r['beyond_window']})"
    return f"{r['answer_nll']:.2f} / {r['decoy_nll']:.2f}: {gap}"


# --------------------------------------------------------------------------- the curve


def pooled_gap(cells: list[dict]) -> dict | None:
    """The gap (decoy - answer NLL, nats per token) over every prompt of
    `cells` whose needle lies beyond the window, all tasks and contexts
    pooled: its mean, the standard error of that mean over prompts, the
    prompts where the asked value is the likelier, and how many there are.
    None when none of them recorded the gap."""
    far = [c for c in beyond(cells) if "decoy_nll" in c]
    if not far:
        return None
    gaps = [c["decoy_nll"] - c["answer_nll"] for c in far]
    se = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else float("nan")
    return {
        "prompts": len(gaps),
        "nll_gap": round(statistics.fmean(gaps), 4),
        "nll_gap_stderr": round(se, 4),
        "answer_likelier": sum(g > 0 for g in gaps),
    }


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Ordinary least squares y = a + b x: (a, b, the standard error of b
    from the residuals with n - 2 degrees of freedom; nan for 2 points)."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if n < 3:
        return a, b, float("nan")
    rss = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, math.sqrt(rss / (n - 2) / sxx)


def curve(rows: list[dict], cells: list[dict]) -> list[dict]:
    """How the gap grows with tokens trained, for every run evaluated at
    two or more checkpoints: one record per checkpoint (the pooled gap of
    its prompts beyond the window) and per run the least-squares line of
    the gap against tokens, its slope per 100,000 tokens with a 95%
    interval, and the tokens at which the line reaches half the original's
    pooled gap (the target asks half the original's retrieval rate; the gap
    is its graded stand-in) when the slope's interval lies above 0; where
    only the interval's upper end is above 0, the tokens at which a line of
    that slope through the points' centre reaches it (the soonest the data
    allow: a lower bound on the budget under linear growth). The
    training-free models' pooled gaps are records too (0 tokens): the
    floor (window + sinks) and the ceiling (original) the curve lies between."""
    runs = [r for r in dict.fromkeys(row["run"] for row in rows) if sum(row["run"] == r for row in rows) > 1]
    out = []
    for run in runs:
        pts = []
        for row in sorted((row for row in rows if row["run"] == run), key=lambda row: row["train_tokens"]):
            g = pooled_gap([c for c in cells if c.get("recipe") == row["recipe"] and c["model"] == "converted"])
            if g is not None:
                keep = ("recipe", "run", "checkpoint", "steps", "train_tokens", "baselines")
                pts.append({**{k: row[k] for k in keep}, "model": "converted", "task": "pooled", **g})
        if len(pts) < 2:
            continue
        group = pts[0]["baselines"]
        ceiling = pooled_gap([c for c in cells if c.get("baselines") == group and c["model"] == "original"])
        fit = _gap_fit(pts, ceiling)
        out += [{**p, **fit} for p in pts]
    if out:
        for group in dict.fromkeys(p["baselines"] for p in out):
            for m in BASELINES:
                g = pooled_gap([c for c in cells if c.get("baselines") == group and c["model"] == m])
                if g is not None:
                    floor = {"recipe": f"none ({m})", "baselines": group, "train_tokens": 0, "model": m}
                    out.append({**floor, "task": "pooled", **g})
    return out


def _gap_fit(pts: list[dict], ceiling: dict | None) -> dict:
    """The line of one run's pooled gap against tokens (curve): its slope per
    100,000 tokens with a 95% interval, and the tokens to half the ceiling's gap."""
    xs, ys = [p["train_tokens"] / 1e5 for p in pts], [p["nll_gap"] for p in pts]
    a, b, se = line_fit(xs, ys)
    # growth: the slope's 95% interval (Student t, n - 2 degrees of freedom) lies above 0
    half = t_quantile(0.975, len(pts) - 2) * se if len(pts) > 2 else math.nan
    grows = not math.isnan(se) and b - half > 0
    target = None if ceiling is None else ceiling["nll_gap"] / 2
    reach = round((target - a) / b * 1e5) if grows and target is not None else None
    # the earliest the data allow: the line at the interval's upper slope through the points' centre
    high = b + half
    ok = not math.isnan(se) and high > 0 and target is not None
    soonest = round((statistics.fmean(xs) + (target - statistics.fmean(ys)) / high) * 1e5) if ok else None
    return {
        "gap_slope_per_100k_tokens": round(b, 4),
        "gap_slope_ci95_low": None if math.isnan(se) else round(b - half, 4),
        "gap_slope_ci95_high": None if math.isnan(se) else round(b + half, 4),
        "gap_target": None if target is None else round(target, 4),
        "tokens_to_target": reach,
        "tokens_to_target_soonest": soonest,
    }


def curve_table(points: list[dict]) -> str:
    if not points:
        return ""
    floor = {p["model"]: p for p in points if p["recipe"].startswith("none (")}
    lines = [
        "\n\n**How the gap grows with tokens trained.** Each run evaluated at several checkpoints (its step-N "
        "folders): the gap (decoy - answer NLL, nats per token) over all its prompts beyond the window, every "
        "task and context pooled, with the standard error over prompts and the prompts where the asked value "
        "is the likelier; then the least-squares line through the checkpoints' gaps: its slope per 100,000 "
        "tokens with a 95% interval (Student t over the checkpoints) and, only where that interval lies above 0, "
        "the tokens at which the line reaches half the original's pooled gap. A slope whose interval holds 0 "
        "predicts no budget: the curve has not left the floor; where the interval's upper end is above 0, the "
        "tokens at which a line of that slope through the points' centre would reach the target bound the "
        "budget from below.",
        "",
        "| run | checkpoint | tokens trained | gap (pooled) | asked value likelier |",
        "|---|---|---|---|---|",
    ]
    for m in BASELINES:
        if m in floor:
            p = floor[m]
            lines.append(
                f"| {m} (training-free) | - | 0 | {p['nll_gap']:+.3f} +- {p['nll_gap_stderr']:.3f} | "
                f"{p['answer_likelier']}/{p['prompts']} |"
            )
    runs = list(dict.fromkeys(p["run"] for p in points if "run" in p))
    fits = []
    for run in runs:
        pts = [p for p in points if p.get("run") == run]
        for p in pts:
            lines.append(
                f"| {run} | {p['checkpoint']} | {p['train_tokens']:,} | {p['nll_gap']:+.3f} +- "
                f"{p['nll_gap_stderr']:.3f} | {p['answer_likelier']}/{p['prompts']} |"
            )
        f = pts[0]
        ci = (
            f"[{f['gap_slope_ci95_low']:+.3f}, {f['gap_slope_ci95_high']:+.3f}]"
            if f["gap_slope_ci95_low"] is not None
            else "(two points: no interval)"
        )
        if f["tokens_to_target"] is not None:
            verdict = f"the line reaches {f['gap_target']:+.2f} at {f['tokens_to_target']:,} tokens"
        elif f["gap_target"] is None:
            verdict = "no prediction (the original's gap was not measured)"
        elif f["gap_slope_ci95_low"] is None:
            verdict = "no prediction from two points (evaluate a third checkpoint)"
        else:
            where = "lies below 0: the gap shrinks" if f["gap_slope_ci95_high"] < 0 else "holds 0"
            verdict = f"no prediction: the interval {where} (target {f['gap_target']:+.2f}, half the original's gap)"
        if f["tokens_to_target_soonest"] is not None:
            verdict += (
                f"; at the interval's upper slope the line would reach it at {f['tokens_to_target_soonest']:,} "
                "tokens at the soonest (a linear extrapolation: a lower bound on the budget, not a forecast)"
            )
        fits.append(f"- {run}: slope {f['gap_slope_per_100k_tokens']:+.3f} per 100,000 tokens, 95% {ci}; {verdict}.")
    return "\n".join(lines) + "\n\n" + "\n".join(fits)


def plot_curve(points: list[dict], path: Path) -> bool:
    """The pooled gap against tokens trained, one line per run, the
    training-free models' gaps as horizontal lines."""
    from latte.reporting import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, run in enumerate(dict.fromkeys(p["run"] for p in points if "run" in p)):
        pts = [p for p in points if p.get("run") == run]
        ax.errorbar(
            [p["train_tokens"] for p in pts],
            [p["nll_gap"] for p in pts],
            yerr=[p["nll_gap_stderr"] for p in pts],
            marker="o",
            ms=4,
            capsize=3,
            color=f"C{i % 10}",
            label=Path(run).name,
        )
    for m, style in zip(BASELINES, (":", "--")):
        for p in (p for p in points if p["model"] == m):
            ax.axhline(p["nll_gap"], color="k", ls=style, lw=1, label=f"{m} (training-free)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("decoy - answer NLL (nats/token), beyond the window")
    ax.set_title("retrieval beyond the window: the graded gap over training", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path, dpi=110)
    return True


def tables(a, rows: list[dict], records: list[dict], cells: list[dict]) -> str:
    tasks = list(dict.fromkeys(r["task"] for r in records))
    contexts = sorted({r["context"] for r in records})
    cols = [(t, c) for t in tasks for c in contexts]
    lines = [
        "| recipe | overrides | steps | tokens trained | train wall time | "
        + " | ".join(f"{t} {c:,}" for t, c in cols)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(cols),
    ]
    nats = [
        "| recipe | steps | " + " | ".join(f"{t} {c:,}" for t, c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    groups = list(dict.fromkeys(r["baselines"] for r in rows))
    for group in groups:
        for m in BASELINES:
            recs = [r for r in records if r.get("baselines") == group and r["recipe"] == f"none ({m})"]
            sinks = next((r["sinks"] for r in rows if r["baselines"] == group), None)
            what = "training-free" + (f" ({group})" if len(groups) > 1 else "")
            hits = " | ".join(_hits(recs, t, c) for t, c in cols)
            lines.append(f"| {label(m, sinks)} | {what} | 0 | 0 | - | {hits} |")
            nats.append(f"| {label(m, sinks)} | 0 | " + " | ".join(_nats(recs, t, c) for t, c in cols) + " |")
    for row in rows:
        recs = [r for r in records if r["recipe"] == row["recipe"] and r["model"] == "converted"]
        wall = (
            f"{row['train_wall_s']:,.0f} s"
            if row["train_wall_s"] is not None
            else "(training)"
            if row["run_steps"] is None
            else f"(of the run's {row['run_steps']:,} steps)"
        )
        step = f"{row['steps']:,}" + ("" if row["finished"] else f" ({row['checkpoint']}, not the last)")
        hits = " | ".join(_hits(recs, t, c) for t, c in cols)
        lines.append(
            f"| {row['recipe']} | {row['overrides'] or 'none'} | {step} | {row['train_tokens']:,} | {wall} | {hits} |"
        )
        nats.append(f"| {row['recipe']} | {step} | " + " | ".join(_nats(recs, t, c) for t, c in cols) + " |")
    graded = ""
    if any("nll_gap" in r for r in records):
        graded = (
            "\n\n**What the state holds about the asked value**, where right-or-wrong says nothing, over the "
            "same prompts beyond the window: the asked value's and a decoy's mean negative log-likelihood in "
            "nats per token, each teacher-forced as the prompt's continuation (the decoy: as many digits, "
            "planted nowhere; a uniform guess costs ln 10 = 2.30 a digit), then decoy - answer and the prompts "
            "where the asked value is the likelier. A gap above 0 is information about the value itself; a "
            "lower answer NLL alone can be a better prior over numbers, which the decoy shares. A model that "
            "cannot see the needle (window + sinks) sets the gap a conversion must beat (`-`: cells written "
            "before this was recorded).\n\n" + "\n".join(nats)
        )
    return _intro(a, cells) + "\n\n" + "\n".join(lines) + graded + "\n\n" + length_table(cells)


def _threads(cells: list[dict]) -> str:
    """The torch threads the prompts ran on, as their cells recorded them."""
    seen = sorted({c["threads"] for c in cells if c.get("threads")})
    unknown = sum(1 for c in cells if not c.get("threads"))
    return " or ".join(map(str, seen)) + (f" ({unknown} not recorded)" if unknown else "") if seen else "unrecorded"


def _intro(a, cells: list[dict]) -> str:
    wall, cpu = sum(c["wall_s"] for c in cells), sum(c.get("cpu_s", 0.0) for c in cells)
    loads = [c["load"] for c in cells]
    fmt = cells[0]["format"]
    trials = max(c["trial"] for c in cells) + 1
    depths = sorted({c["depth"] for c in cells})
    return (
        f"Each row a `latte convert` run of --config ({a.config}) with the overrides shown, or one of its step-N "
        "checkpoints (the recipe pilots of docs/conversion.md §12, the shipped default's learning curve), then "
        f"RULER-style retrieval in held-out essays (format `{fmt}`, the asked needle at depths "
        f"{', '.join(f'{100 * d:.0f}%' for d in depths)}, {trials} trial(s) per cell; greedy decoding). A cell "
        "is found / prompts whose nearest needle lies more than the window from the end of the prompt; the "
        "training-free models are the same for every pilot of one window and sinks. The budget is the steps "
        "and tokens the evaluated checkpoint trained and the run's wall time over all its processes. The "
        f"{len(cells)} prompts took {wall:,.0f} s of wall time ({cpu:,.0f} s of CPU) when they ran, on "
        f"{_threads(cells)} thread(s) beside other jobs (1-min load average {min(loads):.1f} to {max(loads):.1f} at "
        "their starts); a rerun reuses finished prompts (their cells in --work)."
    )
