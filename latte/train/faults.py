"""The trainer's test hooks, and the fault injection behind them (LATTE_FAULTS).

The trainer calls one hooks object at four points: before each step, on each
micro-batch's loss, once a checkpoint's files are durable (before its
commit) and once it is committed. `TrainerHooks` does nothing at any of
them; it is what every run gets unless LATTE_FAULTS is set.

The fault tests (tests/train/) run real training processes and need them to
fail at an exact point: a kill -9 right after a checkpoint commits, a kill -9
in the middle of a save, a SIGTERM during a step, a NaN loss on one rank.
With LATTE_FAULTS set the hooks are a `Faults`, e.g.

    LATTE_FAULTS="kill_after_save=4"           SIGKILL self once step-4 is committed
    LATTE_FAULTS="kill_during_save=6"          SIGKILL self after step-6's files, before its manifest
    LATTE_FAULTS="sigterm_at=3"                SIGTERM self at the start of step 3 (0-based)
    LATTE_FAULTS="sigterm_in=3"                SIGTERM self inside step 3's forward (after the
                                               step read the stop flag, as a real preemption)
    LATTE_FAULTS="nan_loss=2:5@1"              NaN loss on steps 2, 3, 4, rank 1 only
    LATTE_FAULTS="nan_loss=5,nan_loss=8"       NaN loss on steps 5 and 8 (items add up)
    LATTE_FAULTS="hold_at=2"                   before step 2, rank 0 creates RUN_DIR/hold and
                                               waits until it is removed (at most 10 minutes)

Several faults are separated by commas. `nan_loss=N` means step N on every
rank; `START:STOP` is a half-open range of steps; `@R` restricts to rank R.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "LATTE_FAULTS"


class TrainerHooks:
    """Points at which a test can act on a running trainer; all no-ops."""

    def before_step(self, step: int) -> None:
        """Before optimizer step `step` (0-based)."""

    def loss_hook(self, step: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A function applied to each micro-batch's summed loss of step
        `step`, or None (the loss as it is)."""
        return None

    def before_commit(self, step: int) -> None:
        """Every rank's files of checkpoint `step` are durable; not committed yet."""

    def after_commit(self, step: int) -> None:
        """Checkpoint `step` is committed."""


@dataclass(frozen=True)
class Faults(TrainerHooks):
    """The faults of LATTE_FAULTS, at the hooks' points, for one rank."""

    kill_after_save: int | None = None
    kill_during_save: int | None = None
    sigterm_at: int | None = None
    sigterm_in: int | None = None
    hold_at: int | None = None
    nan_steps: tuple[range, ...] = ()
    nan_rank: int | None = None
    rank: int = 0
    run_dir: Path | None = None  # where hold_at's marker goes (rank 0)

    @classmethod
    def parse(cls, spec: str, *, rank: int = 0, run_dir: Path | None = None) -> Faults:
        kw: dict = {}
        for item in spec.split(","):
            key, _, value = item.strip().partition("=")
            try:
                if key in ("kill_after_save", "kill_during_save", "sigterm_at", "sigterm_in", "hold_at"):
                    kw[key] = int(value)
                elif key == "nan_loss":
                    steps, _, on_rank = value.partition("@")
                    start, _, stop = steps.partition(":")
                    kw["nan_steps"] = (
                        *kw.get("nan_steps", ()),
                        range(int(start), int(stop) if stop else int(start) + 1),
                    )
                    kw["nan_rank"] = int(on_rank) if on_rank else None
                else:
                    raise ValueError(f"unknown fault {key!r}")
            except ValueError as e:
                raise ValueError(f"{ENV}={spec!r}: bad item {item!r} ({e})") from None
        return cls(**kw, rank=rank, run_dir=run_dir)

    def nan_loss(self, step: int) -> bool:
        return any(step in r for r in self.nan_steps) and self.nan_rank in (None, self.rank)

    def before_step(self, step: int) -> None:
        if self.sigterm_at == step:
            os.kill(os.getpid(), signal.SIGTERM)
        if self.hold_at == step and self.rank == 0 and self.run_dir is not None:
            # lets a test act while this trainer is alive at a known point
            # (e.g. start a second trainer on the same run folder)
            marker = self.run_dir / "hold"
            marker.write_text(str(os.getpid()))
            deadline = time.monotonic() + 600
            while marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def loss_hook(self, step: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if self.nan_loss(step):
            return lambda loss: loss * float("nan")
        if self.sigterm_in == step:

            def preempt(loss: torch.Tensor) -> torch.Tensor:
                os.kill(os.getpid(), signal.SIGTERM)
                return loss

            return preempt
        return None

    def before_commit(self, step: int) -> None:
        if self.kill_during_save == step:
            kill_self()

    def after_commit(self, step: int) -> None:
        if self.kill_after_save == step:
            kill_self()


def hooks_from_env(*, rank: int = 0, run_dir: Path | None = None) -> TrainerHooks:
    """`Faults` when LATTE_FAULTS is set, else the no-op `TrainerHooks`."""
    spec = os.environ.get(ENV, "").strip()
    return Faults.parse(spec, rank=rank, run_dir=run_dir) if spec else TrainerHooks()


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
