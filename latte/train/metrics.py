"""What rank 0 records about a run: a progress bar, CSV files, TensorBoard,
and a loss-curve PNG at the end.

    run_dir/metrics.csv   one row per optimizer step (loss as repr(float): exact)
    run_dir/val.csv       one row per validation
    run_dir/tb/           TensorBoard events (optional: tensorboard installed)
    run_dir/loss_curve.png  (optional: matplotlib installed)

Every number arriving here was already summed over ranks with its count.
The training columns name the task's unit ("tokens", "examples"); the
validation columns are "val_" + the task's metric names. On resume the CSV
rows after the resumed step are dropped (they belong to the timeline that
crashed or was branched from; a branch keeps a copy, see train/rundir.py)
and TensorBoard purges them likewise.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from latte.reporting import pyplot, save_figure


def train_fields(unit: str) -> list[str]:
    return ["step", "loss", "lr", "grad_norm", unit, f"{unit}_per_s", "applied", "elapsed_s"]


def _truncate_csv(path: Path, after_step: int) -> list[str] | None:
    """Keep the header and the rows with step <= after_step; returns the
    header (None when there is no file, or no row is kept)."""
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        rows = [r for r in reader if r.get("step", "").isdigit() and int(r["step"]) <= after_step]
    if not rows or not fields:
        path.unlink()
        return None
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return list(fields)


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def process_walls(path: str | Path, upto_step: int | None = None) -> list[float]:
    """Wall seconds of each process that wrote metrics.csv (rows with step <=
    upto_step), read from elapsed_s: it restarts near 0 in every process, so
    each run of increasing values is one process and its last value that
    process's wall time to its last kept step. The estimate for runs whose
    checkpoints predate trainer_state's "wall_s"; it merges two processes
    when the later one's first step ends sooner after its start than the
    earlier one's last did (seconds-long toy runs, not real ones)."""
    walls: list[float] = []
    previous = None
    for row in read_csv(path) if Path(path).is_file() else []:
        if upto_step is not None and int(row["step"]) > upto_step:
            break
        elapsed = float(row["elapsed_s"])
        if previous is None or elapsed < previous:
            walls.append(elapsed)
        walls[-1], previous = elapsed, elapsed
    return walls


def run_wall_time(run_dir: str | Path) -> float | None:
    """A finished run's wall time over all its processes, from summary.json;
    for a summary written before "process_wall_time_s" existed (its
    wall_time_s is the last process's alone), the earlier processes are read
    from metrics.csv."""
    run_dir = Path(run_dir)
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        return None
    summary = json.loads(summary_file.read_text())
    if "process_wall_time_s" in summary or "wall_time_s" not in summary:
        return summary.get("wall_time_s")
    return sum(process_walls(run_dir / "metrics.csv")[:-1]) + summary["wall_time_s"]


class RunLogger:
    """Rank 0 only (the others get a `NullLogger`)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        start_step: int,
        total_steps: int,
        log_every: int,
        tensorboard: bool,
        unit: str = "tokens",
    ):
        self.run_dir, self.log_every, self.unit = run_dir, log_every, unit
        self.train_csv, self.val_csv = run_dir / "metrics.csv", run_dir / "val.csv"
        fields = _truncate_csv(self.train_csv, start_step)
        if fields is not None and fields != train_fields(unit):
            raise ValueError(f"{self.train_csv}: columns {fields}, expected {train_fields(unit)}")
        self._val_fields = _truncate_csv(self.val_csv, start_step)
        self._files, self._writers = {}, {}
        self._open("train", self.train_csv, train_fields(unit))
        self.tb = _tensorboard(run_dir / "tb", start_step) if tensorboard else None
        self.bar = _progress_bar(start_step, total_steps)
        self._window = [0.0, 0, 0.0, 0]  # loss_sum, count, seconds, steps since the last line

    def _open(self, key: str, path: Path, fields: list[str]) -> None:
        new = not path.is_file()
        self._files[key] = open(path, "a", newline="")
        self._writers[key] = csv.DictWriter(self._files[key], fieldnames=fields, extrasaction="ignore")
        if new:
            self._writers[key].writeheader()

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def train_step(self, step: int, result, lr: float, seconds: float, elapsed: float) -> None:
        """`step` counts completed steps (1-based)."""
        rate = result.count / seconds if seconds > 0 else 0.0
        self._writers["train"].writerow(
            {
                "step": step,
                "loss": repr(result.loss),
                "lr": repr(lr),
                "grad_norm": repr(result.grad_norm),
                self.unit: result.count,
                f"{self.unit}_per_s": f"{rate:.1f}",
                "applied": int(result.applied),
                "elapsed_s": f"{elapsed:.2f}",
            }
        )
        self._files["train"].flush()
        if self.tb is not None:
            for name, value in (
                ("loss", result.loss),
                ("lr", lr),
                ("grad_norm", result.grad_norm),
                (f"{self.unit}_per_s", rate),
            ):
                if math.isfinite(value):
                    self.tb.add_scalar(f"train/{name}", value, step)
        w = self._window
        if result.applied:
            w[0] += result.loss_sum
            w[1] += result.count
        w[2] += seconds
        w[3] += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", rate=f"{rate:,.0f}", refresh=False)
        if step % self.log_every == 0:
            loss = w[0] / w[1] if w[1] else math.nan
            skipped = "" if result.applied else " (skipped: non-finite)"
            if self.bar is None:
                self.message(
                    f"step {step}: loss {loss:.4f}  lr {lr:.2e}  {w[1] / max(w[2], 1e-9):,.0f} {self.unit}/s{skipped}"
                )
            self._window = [0.0, 0, 0.0, 0]

    def validation(self, step: int, metrics: dict, text: str) -> None:
        """One val.csv row: step and "val_" + each metric (columns fixed by the first row)."""
        row = {"step": step, **{f"val_{k}": repr(v) if isinstance(v, float) else v for k, v in metrics.items()}}
        if "val" not in self._writers:
            self._open("val", self.val_csv, self._val_fields or list(row))
        self._writers["val"].writerow(row)
        self._files["val"].flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(f"val/{k}", v, step)
        self.message(f"step {step}: validation {text}")

    def sample(self, step: int, text: str) -> None:
        block = f"--- sample at step {step} ---\n{text}\n---"
        with open(self.run_dir / "samples.txt", "a", encoding="utf-8") as f:
            f.write(block + "\n")
        self.message(block)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        for f in self._files.values():
            f.close()
        self._files = {}

    def plot(self) -> Path | None:
        """loss_curve.png from the CSV files (None without matplotlib)."""
        return plot_loss_curve(self.run_dir)


class NullLogger:
    """What ranks > 0 log: nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _tensorboard(log_dir: Path, start_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("note: TensorBoard logging off (pip install 'tensorboard>=2.14,<3' to enable)", file=sys.stderr)
        return None
    # purge_step drops events after the resumed step (left by a crashed timeline)
    return SummaryWriter(str(log_dir), purge_step=start_step + 1)


def _progress_bar(start_step: int, total_steps: int):
    """A tqdm bar on an interactive terminal; plain log lines otherwise."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True, mininterval=0.5)


def plot_loss_curve(run_dir: str | Path) -> Path | None:
    plt = pyplot(note="note: no loss_curve.png (pip install 'matplotlib>=3.7,<4' to plot it)")
    if plt is None:
        return None
    run_dir = Path(run_dir)
    train = read_csv(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    val = read_csv(run_dir / "val.csv") if (run_dir / "val.csv").is_file() else []
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [int(r["step"]) for r in train if math.isfinite(float(r["loss"]))]
    ys = [float(r["loss"]) for r in train if math.isfinite(float(r["loss"]))]
    ax.plot(xs, ys, lw=0.8, alpha=0.5, label="train (per step)")
    if len(ys) >= 10:  # a running mean makes the trend readable
        k = max(5, len(ys) // 30)
        smooth = [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, lw=1.5, label=f"train (mean of {k})")
    if val and "val_loss" in val[0]:
        ax.plot([int(r["step"]) for r in val], [float(r["val_loss"]) for r in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(plt, fig, run_dir / "loss_curve.png", dpi=110)
