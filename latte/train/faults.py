"""Test-only fault injection, driven by the LATTE_FAULTS environment variable.

The fault tests (tests/train/) run real training processes and need them to
fail at an exact point: a kill -9 right after a checkpoint commits, a kill -9
in the middle of a save, a SIGTERM during a step, a NaN loss on one rank.
Nothing here is active unless LATTE_FAULTS is set, e.g.

    LATTE_FAULTS="kill_after_save=4"           SIGKILL self once step-4 is committed
    LATTE_FAULTS="kill_during_save=6"          SIGKILL self after step-6's files, before its manifest
    LATTE_FAULTS="sigterm_at=3"                SIGTERM self during step 3 (0-based)
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
from dataclasses import dataclass
from pathlib import Path

ENV = "LATTE_FAULTS"


@dataclass(frozen=True)
class Faults:
    kill_after_save: int | None = None
    kill_during_save: int | None = None
    sigterm_at: int | None = None
    hold_at: int | None = None
    nan_steps: tuple[range, ...] = ()
    nan_rank: int | None = None

    @classmethod
    def from_env(cls) -> Faults:
        spec = os.environ.get(ENV, "").strip()
        if not spec:
            return cls()
        kw: dict = {}
        for item in spec.split(","):
            key, _, value = item.strip().partition("=")
            try:
                if key in ("kill_after_save", "kill_during_save", "sigterm_at", "hold_at"):
                    kw[key] = int(value)
                elif key == "nan_loss":
                    steps, _, rank = value.partition("@")
                    start, _, stop = steps.partition(":")
                    kw["nan_steps"] = (
                        *kw.get("nan_steps", ()),
                        range(int(start), int(stop) if stop else int(start) + 1),
                    )
                    kw["nan_rank"] = int(rank) if rank else None
                else:
                    raise ValueError(f"unknown fault {key!r}")
            except ValueError as e:
                raise ValueError(f"{ENV}={spec!r}: bad item {item!r} ({e})") from None
        return cls(**kw)

    def nan_loss(self, step: int, rank: int) -> bool:
        return any(step in r for r in self.nan_steps) and self.nan_rank in (None, rank)

    def maybe_sigterm(self, step: int) -> None:
        if self.sigterm_at == step:
            os.kill(os.getpid(), signal.SIGTERM)

    def maybe_hold(self, step: int, run_dir: Path, is_main: bool) -> None:
        """Lets a test act while this trainer is alive at a known point
        (e.g. start a second trainer on the same run folder)."""
        if self.hold_at != step or not is_main:
            return
        marker = run_dir / "hold"
        marker.write_text(str(os.getpid()))
        deadline = time.monotonic() + 600
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def maybe_kill_after_save(self, step: int) -> None:
        if self.kill_after_save == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def kills_during_save(self, step: int) -> bool:
        return self.kill_during_save == step


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
