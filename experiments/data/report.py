"""Tables and the learning-curve plot of `python -m experiments.data`."""

from __future__ import annotations

from pathlib import Path

from latte.reporting import pyplot, save_figure
from latte.train import load_yaml


def report(a, pilots: list[dict], curve: list[dict]) -> tuple[str, list[str]]:
    parts, images = [], []
    if pilots:
        parts.append(_pilot_table(a, pilots))
    if curve:
        parts.append(_curve_table(curve, _sinks_of_run(Path(a.curve_run))))
        if _plot_curve(curve, Path(a.out) / "curve.png", a):
            images.append("curve.png")
    return "\n\n".join(parts), images


def _pilot_table(a, rows: list[dict]) -> str:
    head = (
        f"Pilots: every mix up-trained for the same {a.pilot_steps} steps (config `{a.config}`"
        + (f", {' '.join(a.set)}" if a.set else "")
        + f"), {a.threads} thread(s) each; held-out perplexity over the first {a.eval_windows} window(s) of "
        f"{a.eval_len} tokens of every held-out essay and play (text no mix contains).\n\n"
        "| mix | train tokens | held-out essays | held-out plays | mix's own validation | train wall s | load |\n"
        "|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        val = f"{r['val_ppl']:.2f}" if "val_ppl" in r else ""
        load = f"{r.get('load_start', 0):.1f}" + (f"-{r['load_end']:.1f}" if "load_end" in r else "")
        lines.append(
            f"| {r['mix']} | {r['train_tokens']:,} | {r['essays_ppl']:.2f} | {r['plays_ppl']:.2f} | {val} "
            f"| {r.get('train_wall_s', '')} | {load} |"
        )
    tokens = rows[0]
    lines.append(
        f"\n({tokens['essays_tokens']:,} essay tokens and {tokens['plays_tokens']:,} play tokens per model; "
        "lower is better.)"
    )
    return "\n".join(lines)


def _sinks_of_run(run: Path) -> int:
    """conversion.num_sinks of a convert run's saved config (a config saved
    before sinks existed had none: latte.convert.config)."""
    cfg = load_yaml(run / "config.yaml") if (run / "config.yaml").is_file() else {}
    return int((cfg.get("conversion") or {}).get("num_sinks", 0))


def _curve_table(rows: list[dict], sinks: int) -> str:
    before = f"its window and its {sinks} sinks, untrained" if sinks else "its window alone, untrained"
    tasks = any("task_avg" in r for r in rows)
    lines = [
        f"Learning curve of `{rows[0]['run']}`: held-out perplexity of each kept checkpoint "
        f'("none (swa)": the converted model before up-training, {before})'
        + (
            "; zero-shot task average (%): `latte eval --suite tasks` at the checkpoints it was run on (the "
            "untrained row: window + sinks, `--against window`)"
            if tasks
            else ""
        )
        + ".\n",
        "| checkpoint | train tokens | held-out essays | held-out plays |"
        + (" task average |" if tasks else "")
        + " load |",
        "|---|---|---|---|" + ("---|" if tasks else "") + "---|",
    ]
    for r in rows:
        avg = (f" {100 * r['task_avg']:.1f} |" if "task_avg" in r else " - |") if tasks else ""
        lines.append(
            f"| {r['checkpoint']} | {r['train_tokens']:,} | {r['essays_ppl']:.2f} | {r['plays_ppl']:.2f} |{avg}"
            f" {r.get('load_start', 0):.1f} |"
        )
    return "\n".join(lines)


def _plot_curve(rows: list[dict], path: Path, a) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for corpus in ("essays", "plays"):
        xs = [r["train_tokens"] for r in rows]
        ax.plot(xs, [r[f"{corpus}_ppl"] for r in rows], marker="o", label=f"held-out {corpus}")
    ax.set_xlabel("up-training tokens")
    ax.set_ylabel(f"perplexity ({a.eval_len}-token windows)")
    ax.set_title(f"{rows[0]['run']}: held-out perplexity while up-training")
    ax.legend(loc="upper center")
    tasks = [r for r in rows if "task_avg" in r]
    if tasks:
        right = ax.twinx()
        ys = [100 * r["task_avg"] for r in tasks]
        right.plot([r["train_tokens"] for r in tasks], ys, "k--", marker="s")
        right.set_ylim(min(ys) - 5, max(ys) + 5)  # a +-5-point frame: the average's standard error is ~1.5
        right.set_ylabel("zero-shot task average (%, dashed)")
    save_figure(plt, fig, path)
    return True
