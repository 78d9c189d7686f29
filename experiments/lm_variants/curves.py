"""The learning curves of `python -m experiments.lm_variants`: validation
perplexity at each evaluation of each run (its val.csv), at chosen steps
relative to softmax's, and their plot."""

from __future__ import annotations

import json
from pathlib import Path

from latte.reporting import save_figure
from latte.train import load_yaml

from .report import ORDER, _figure


def _val_curve(path: Path) -> dict[int, tuple[float, int]]:
    """step -> (validation perplexity, tokens it was measured on), from a run's val.csv."""
    lines = path.read_text().splitlines()
    head = lines[0].split(",")
    return {
        int(r[head.index("step")]): (float(r[head.index("val_ppl")]), int(r[head.index("val_tokens")]))
        for r in (line.split(",") for line in lines[1:] if line)
    }


def curve_table(cells: list[dict], runs: Path, *, steps=(), out: Path | None = None) -> tuple[str, str | None]:
    """Validation perplexity at every evaluation of every run that has one
    (its val.csv), finished or not: an unfinished run still compares with the
    others at the steps it reached. The intermediate evaluations use the
    config's eval_batches, the last one (and those of train.eval_whole_at)
    the whole validation split. `steps`: only these columns, then also each
    variant's perplexity relative to softmax at the same step, and a plot of
    the whole-split points in `out` (returns (markdown, PNG name or None))."""
    rows, found = [], set()
    for c in cells:
        run_dir = Path(runs) / c["variant"] / f"seed-{c['seed']}"
        if not (run_dir / "val.csv").is_file():
            continue
        vals = _val_curve(run_dir / "val.csv")
        summary = run_dir / "summary.json"
        done = summary.is_file()
        train_tokens = json.loads(summary.read_text()).get("train_tokens") if done else None
        cfg = load_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else None
        per_step = cfg["train"]["global_batch_size"] * cfg["data"]["seq_len"] if cfg else None
        rows.append((c, vals, done, (train_tokens, per_step)))
        found |= set(vals)
    if not rows:
        return "", None
    cols = [s for s in steps if s in found] if steps else sorted(found)
    tokens = {s: v[1] for _, vals, _, _ in rows for s, v in vals.items()}
    whole = max(tokens.values())
    rows.sort(key=lambda r: (ORDER.index(r[0]["variant"]) if r[0]["variant"] in ORDER else len(ORDER), r[0]["seed"]))
    lines = [
        "| variant | seed | " + " | ".join(f"step {s} ({tokens[s]:,} tokens)" for s in cols) + " | run |",
        "|---|---|" + "---|" * (len(cols) + 1),
    ]
    for c, vals, done, _ in rows:
        cells_ = [f"{vals[s][0]:.1f}" if s in vals else "" for s in cols]
        lines.append(
            f"| {c['variant']} | {c['seed']} | " + " | ".join(cells_) + f" | {'finished' if done else 'not finished'} |"
        )
    text = "Validation perplexity at each evaluation during training (from each run's val.csv):\n\n" + "\n".join(lines)
    if not steps:
        return text, None
    text = text.replace("at each evaluation", f"at steps {', '.join(map(str, cols))}", 1)
    relative = _relative_table(rows, cols, tokens, whole)
    text += f"\n\n{relative}" if relative else ""
    train_tokens, per_step = next((t for *_, t in rows if all(t)), (None, None))
    if train_tokens:
        text += (
            f"\n\nEpochs of the {train_tokens:,}-token training split at those steps ({per_step:,} tokens per "
            "step): " + ", ".join(f"step {s}: {s * per_step / train_tokens:.2f}" for s in cols) + "."
        )
    png = _plot_curves(rows, whole, Path(out) / "val_curve.png") if out is not None else False
    return text, ("val_curve.png" if png else None)


def _relative_table(rows: list, cols: list[int], tokens: dict, whole: int) -> str:
    """Each variant's perplexity over softmax's (same seed) at each step
    measured on the whole split: 1.00 = softmax's, 1.25 = 25% worse."""
    ref = {c["seed"]: vals for c, vals, _, _ in rows if c["variant"] == "softmax"}
    cols = [s for s in cols if tokens[s] == whole]
    if not ref or not cols:
        return ""
    lines = [
        "| variant | seed | " + " | ".join(f"step {s}" for s in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for c, vals, _, _ in rows:
        base = ref.get(c["seed"], {})
        cells = [f"{vals[s][0] / base[s][0]:.2f}" if s in vals and s in base else "" for s in cols]
        lines.append(f"| {c['variant']} | {c['seed']} | " + " | ".join(cells) + " |")
    head = "Validation perplexity relative to softmax's at the same step (whole split; 1.25 = 25% higher):"
    return head + "\n\n" + "\n".join(lines)


def _plot_curves(rows: list, whole: int, path: Path) -> bool:
    plt, fig, ax = _figure((6.5, 4))
    if plt is None:
        return False
    for i, (c, vals, _, _) in enumerate(rows):
        pts = sorted((s, v[0]) for s, v in vals.items() if v[1] == whole)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=f"C{i % 10}", label=f"{c['variant']} (seed {c['seed']})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation perplexity (whole split)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(plt, fig, path, dpi=110)
    return True
