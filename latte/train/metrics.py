"""What rank 0 records about a run: a progress bar, CSV files, TensorBoard,
and a loss-curve PNG at the end.

    run_dir/metrics.csv   one row per optimizer step (loss as repr(float): exact)
    run_dir/val.csv       one row per validation
    run_dir/tb/           TensorBoard events (optional: tensorboard installed)
    run_dir/loss_curve.png  (optional: matplotlib installed)

Every number arriving here was already summed over ranks with token counts.
On resume the CSV rows after the resumed step are dropped (they belong to the
timeline that crashed) and TensorBoard purges them likewise.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

TRAIN_FIELDS = ["step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "applied", "elapsed_s"]
VAL_FIELDS = ["step", "val_loss", "val_ppl", "val_tokens", "tokens_per_s"]


def _truncate_csv(path: Path, fields: list[str], after_step: int) -> None:
    """Keep the header and the rows with step <= after_step."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("step", "").isdigit() and int(r["step"]) <= after_step]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class RunLogger:
    """Rank 0 only (the others get a `NullLogger`)."""

    def __init__(self, run_dir: Path, *, start_step: int, total_steps: int, log_every: int,
                 tensorboard: bool):
        self.run_dir, self.log_every = run_dir, log_every
        self.train_csv, self.val_csv = run_dir / "metrics.csv", run_dir / "val.csv"
        _truncate_csv(self.train_csv, TRAIN_FIELDS, start_step)
        _truncate_csv(self.val_csv, VAL_FIELDS, start_step)
        self._files = {}
        self._writers = {}
        for key, path, fields in (("train", self.train_csv, TRAIN_FIELDS), ("val", self.val_csv, VAL_FIELDS)):
            new = not path.is_file()
            self._files[key] = open(path, "a", newline="")
            self._writers[key] = csv.DictWriter(self._files[key], fieldnames=fields)
            if new:
                self._writers[key].writeheader()
        self.tb = _tensorboard(run_dir / "tb", start_step) if tensorboard else None
        self.bar = _progress_bar(start_step, total_steps)
        self._window = [0.0, 0, 0.0, 0]  # loss_sum, tokens, seconds, steps since the last line

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def train_step(self, step: int, result, lr: float, seconds: float, elapsed: float) -> None:
        """`step` counts completed steps (1-based)."""
        tps = result.tokens / seconds if seconds > 0 else 0.0
        self._writers["train"].writerow({
            "step": step, "loss": repr(result.loss), "lr": repr(lr), "grad_norm": repr(result.grad_norm),
            "tokens": result.tokens, "tokens_per_s": f"{tps:.1f}", "applied": int(result.applied),
            "elapsed_s": f"{elapsed:.2f}"})
        self._files["train"].flush()
        if self.tb is not None:
            for name, value in (("loss", result.loss), ("lr", lr), ("grad_norm", result.grad_norm),
                                ("tokens_per_s", tps)):
                if math.isfinite(value):
                    self.tb.add_scalar(f"train/{name}", value, step)
        w = self._window
        if result.applied:
            w[0] += result.loss_sum
            w[1] += result.tokens
        w[2] += seconds
        w[3] += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
        if step % self.log_every == 0:
            loss = w[0] / w[1] if w[1] else math.nan
            skipped = "" if result.applied else " (skipped: non-finite)"
            if self.bar is None:
                self.message(f"step {step}: loss {loss:.4f}  lr {lr:.2e}  "
                             f"{w[1] / max(w[2], 1e-9):,.0f} tok/s{skipped}")
            self._window = [0.0, 0, 0.0, 0]

    def validation(self, step: int, metrics: dict) -> None:
        self._writers["val"].writerow({
            "step": step, "val_loss": repr(metrics["loss"]), "val_ppl": repr(metrics["ppl"]),
            "val_tokens": metrics["tokens"], "tokens_per_s": f"{metrics['tokens_per_s']:.1f}"})
        self._files["val"].flush()
        if self.tb is not None:
            self.tb.add_scalar("val/loss", metrics["loss"], step)
            self.tb.add_scalar("val/ppl", metrics["ppl"], step)
        self.message(f"step {step}: val loss {metrics['loss']:.4f}  val ppl {metrics['ppl']:.2f}  "
                     f"({metrics['tokens']:,} tokens, {metrics['tokens_per_s']:,.0f} tok/s)")

    def sample(self, step: int, prompt: str, text: str) -> None:
        block = f"--- sample at step {step} (prompt {prompt!r}) ---\n{prompt}{text}\n---"
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
        print("note: TensorBoard logging off (pip install 'tensorboard>=2.14,<3' to enable)",
              file=sys.stderr)
        return None
    # purge_step drops events after the resumed step (left by a crashed timeline)
    return SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step else None)


def _progress_bar(start_step: int, total_steps: int):
    """A tqdm bar on an interactive terminal; plain log lines otherwise."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                mininterval=0.5)


def plot_loss_curve(run_dir: str | Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
        smooth = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, lw=1.5, label=f"train (mean of {k})")
    if val:
        ax.plot([int(r["step"]) for r in val], [float(r["val_loss"]) for r in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend()
    out = run_dir / "loss_curve.png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
