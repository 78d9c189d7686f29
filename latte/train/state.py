"""The trainer's state as objects that save and restore themselves, and the
`Checkpointer` that collects them (the Stateful pattern of torchtitan's
checkpointer: each part has `state_dict()` and `load_state_dict()`).

    Progress     steps done, loss units seen              } trainer_state.json:
    SkipGuard    skipped steps (train/step.py)            } one flat JSON object
    Health       the newest healthy checkpoint            } of all their keys
    DataPosition the next global sample, and the batches  }
    Weights      model + optimizer, full or sharded          model.safetensors + optimizer.pt, or dcp/
    RNG          this rank's generators                      rng-rank{r}.pt

(the files of a checkpoint: docs/reliability.md §1).

`Clock` (speeds, for the time budget) and `Stop` (stop requests) are the
run's state that no checkpoint keeps. The file format is train/manifest.py;
writing and reading it, train/checkpoint.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Protocol

import torch
from torch import nn

from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint, Ranks, Snapshot, nonfinite_tensors, save_checkpoint
from latte.train.faults import TrainerHooks
from latte.train.rng import capture_rng_state, restore_rng_state
from latte.train.sharded import apply_sharded_state, sharded_state
from latte.train.step import STOP_NONE, SkipGuard
from latte.train.task import Batches, Task


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """Optimizer steps completed (skipped ones included) and loss units
    (tokens, examples: the task's `unit`) trained on."""

    unit: str
    step: int = 0
    seen: int = 0
    # wall seconds of the earlier processes of this run, each up to its last
    # checkpoint (None: resumed from a checkpoint written before "wall_s" was kept)
    wall_before: float | None = 0.0
    t_start: float = field(default_factory=time.perf_counter)  # this process's start (train() sets it)

    def wall_seconds(self) -> float | None:
        """The run's wall time so far, over all its processes."""
        if self.wall_before is None:
            return None
        return self.wall_before + time.perf_counter() - self.t_start

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step, f"{self.unit}_seen": self.seen}
        wall = self.wall_seconds()
        if wall is not None:
            state["wall_s"] = round(wall, 3)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.seen = state.get("step", 0), state.get(f"{self.unit}_seen", 0)
        self.wall_before = state.get("wall_s") if state else 0.0  # {}: a fresh run


@dataclass
class Health:
    """A checkpoint is healthy when no step was skipped since the one before;
    retention never deletes the newest healthy one (docs/reliability.md)."""

    progress: Progress
    guard: SkipGuard
    last_healthy_step: int | None = None  # newest checkpoint saved with no skipped step since the one before
    skips_at_last_save: int = 0

    @property
    def healthy(self) -> bool:
        return self.guard.total == self.skips_at_last_save

    def newest_healthy(self) -> int | None:
        """The newest healthy step once the current one is saved."""
        return self.progress.step if self.healthy else self.last_healthy_step

    def state_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "last_healthy_step": self.newest_healthy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_healthy_step = state.get("last_healthy_step")
        self.skips_at_last_save = state.get("skipped_steps", 0)

    def saved(self) -> None:
        self.last_healthy_step, self.skips_at_last_save = self.newest_healthy(), self.guard.total


class DataPosition:
    """The task's training batches, restored from one number: the global
    index of the next sample (any world size continues with it)."""

    def __init__(self, task: Task):
        self.task = task
        self.batches: Batches | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"sample_index": self.batches.sample_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = self.task.train_batches(state.get("sample_index", 0))


@dataclass
class Weights:
    """The (wrapped) model and its optimizer. `keys`: the model entries a
    checkpoint keeps (None: all); `sharded`: DCP shards (FSDP2 on several
    ranks) instead of model.safetensors + optimizer.pt. Collective."""

    model: nn.Module  # wrapped (DDP / FSDP2) when distributed
    optimizer: torch.optim.Optimizer
    keys: set[str] | None
    sharded: bool
    env: D.DistEnv
    compiled: nn.Module | None = None  # torch.compile(model) when train.compile: the training steps' model

    @property
    def raw_model(self) -> nn.Module:
        return D.unwrap(self.model)

    @property
    def step_model(self) -> nn.Module:
        """The model the training steps call: the compiled one, else `model`."""
        return self.model if self.compiled is None else self.compiled

    def state_dict(self) -> dict[str, Any]:
        if self.sharded:
            return {"sharded_state": sharded_state(self.model, self.optimizer, self.keys)}
        model_state = D.full_model_state(self.model)  # gathered to rank 0 (FSDP2), name-keyed
        if self.keys is not None:
            model_state = {k: v for k, v in model_state.items() if k in self.keys}
        optim_state = D.full_optimizer_state(self.model, self.optimizer)
        main = self.env.is_main
        return {"model_state": model_state if main else None, "optimizer_state": optim_state if main else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From either format, on any world size; refuses non-finite shards."""
        strict = self.keys is None
        if "sharded_state" not in state:
            D.load_full_state(self.model, self.optimizer, state["model_state"], state["optimizer_state"], strict=strict)
            return
        apply_sharded_state(self.model, self.optimizer, state["sharded_state"], strict=strict)
        bad = len(nonfinite_tensors(state["sharded_state"]["model"]))
        if D.all_reduce(torch.tensor([float(bad)], device=self.env.device), self.env, "sum").item():
            raise ValueError("non-finite weights (the run diverged before this save; use an earlier checkpoint)")

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        """Weights and optimizer state of `ckpt`, saved in either format."""
        if ckpt.format == "full":
            self.load_state_dict({"model_state": ckpt.model_state, "optimizer_state": ckpt.optimizer_state})
            return
        # the checkpoint's format decides, not the one this run saves in
        state = sharded_state(self.model, self.optimizer, self.keys)  # the shapes DCP fills in place
        ckpt.load_sharded(state)
        try:
            self.load_state_dict({"sharded_state": state})
        except ValueError as e:
            raise ValueError(f"{ckpt.path}: {e}") from None


class RNG:
    """This rank's generators (torch, Python, numpy), as tensors."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)


class Checkpointer:
    """Collects the parts' states into a checkpoint and hands each its part
    back on resume; refuses weights unfit to keep; the hooks act before and
    after the commit."""

    def __init__(
        self,
        run_dir: Path,
        config: Any,
        env: D.DistEnv,
        *,
        keep: int,
        trainer: dict[str, Stateful],
        weights: Weights,
        health: Health,
        task: Task,
        hooks: TrainerHooks,
        log: Callable[[str], None],
    ):
        self.run_dir, self.config, self.env, self.keep = run_dir, config, env, keep
        self.trainer, self.weights, self.health = trainer, weights, health
        self.task, self.hooks, self.log = task, hooks, log
        self.rng = RNG()

    def save(self, step: int) -> Path | None:
        """A checkpoint of `step` (collective: every rank calls it), unless
        the weights are not fit to keep: after a skipped step (the current
        weights produced a non-finite loss or gradient) or with non-finite
        values. Returns the step folder, or None when refused."""
        refused = self._unfit_to_save()
        if refused:
            newest = self.health.last_healthy_step
            newest = (
                f"the newest healthy checkpoint is step {newest}"
                if newest is not None
                else "there is no healthy checkpoint yet"
            )
            self.log(f"step {step}: checkpoint NOT taken: {refused}; {newest}")
            return None
        healthy, newest_healthy = self.health.healthy, self.health.newest_healthy()
        trainer_state = {"world_size": self.env.world_size}
        for part in self.trainer.values():
            trainer_state.update(part.state_dict())
        snapshot = Snapshot(
            trainer_state=trainer_state,
            rng_state=self.rng.state_dict(),
            config=self.config,
            extra_files=self.task.checkpoint_files(),
            **self.weights.state_dict(),
        )
        path = save_checkpoint(
            self.run_dir,
            step,
            snapshot,
            ranks=Ranks(self.env.rank, self.env.world_size, lambda: D.barrier(self.env)),
            keep=self.keep,
            protect={newest_healthy} if newest_healthy is not None else set(),
            before_commit=lambda: self.hooks.before_commit(step),
        )
        self.health.saved()
        note = ""
        if not healthy:
            keeps = f"step {newest_healthy} stays as the newest healthy one" if newest_healthy is not None else ""
            note = f" (saved after skipped steps; {keeps or 'none is healthy yet'})"
        self.log(f"step {step}: checkpoint {path}{note}")
        self.hooks.after_commit(step)
        return path

    def _unfit_to_save(self) -> str | None:
        """Why the current weights must not be checkpointed (agreed over ranks), or None."""
        guard = self.health.guard
        if guard.consecutive:
            return (
                f"the current weights gave a non-finite loss or gradient ({guard.consecutive} "
                "consecutive skipped step(s))"
            )
        bad = nonfinite_tensors(dict(self.weights.raw_model.named_parameters()))
        if D.all_reduce(torch.tensor([float(len(bad))], device=self.env.device), self.env, "sum").item():
            return f"the weights hold NaN or inf values ({'; '.join(bad[:3]) or 'on another rank'})"
        return None


def load_trainer_state(parts: dict[str, Stateful], state: dict[str, Any]) -> None:
    """Each trainer part from trainer_state.json ({} for a fresh run)."""
    for part in parts.values():
        part.load_state_dict(state)


# Steps whose median is "the current training speed": one slow step (a burst
# of load) moves no decision; load that stays shows after two steps.
RECENT_STEPS = 3
# Validation batches the probe times before the evaluation speed is trusted
# (one after each of as many steps; their median, docs/reliability.md §7).
PROBE_BATCHES = 3


@dataclass
class Clock:
    """Training and evaluation speeds, measured as the run goes (not saved):
    what the time budget needs to stop in time for the final evaluation."""

    t_start: float = 0.0
    train_seconds: float = 0.0  # spent in optimizer steps this session
    train_count: int = 0  # units of those steps
    session_steps: int = 0  # optimizer steps taken by this process
    last_steps: list[tuple[int, float]] = field(default_factory=list)  # (units, seconds) of the newest steps
    # evaluation units/s, and the training units/s it was measured beside: the
    # median of the probe batches (loop._probe_eval), then each validation's own
    eval_rate: float | None = None
    eval_train_rate: float = 0.0
    probes: list[tuple[float, float]] = field(default_factory=list)  # (eval, train) units/s per probe batch
    predicted_final_s: float | None = None  # the newest estimate of the final evaluation's seconds

    @property
    def recent_rate(self) -> float:
        """Training units per second: the median of the newest steps' (0: none yet)."""
        return median([count / max(seconds, 1e-9) for count, seconds in self.last_steps]) if self.last_steps else 0.0

    @property
    def recent_step_s(self) -> float:
        return median([seconds for _, seconds in self.last_steps]) if self.last_steps else 0.0

    def step_done(self, count: int, seconds: float) -> None:
        self.train_seconds += seconds
        self.train_count += count
        self.session_steps += 1
        self.last_steps = [*self.last_steps, (count, seconds)][-RECENT_STEPS:]

    def eval_done(self, size: int, seconds: float) -> None:
        """A whole validation: its own speed replaces the earlier measurement."""
        if self.recent_rate and size and seconds > 0:
            self.eval_rate, self.eval_train_rate = size / seconds, self.recent_rate

    def probe_due(self, after_steps: int) -> bool:
        """No measured evaluation speed yet, and this process has just taken
        its `after_steps`-th step (the first carries the warm-up) or one of
        the next PROBE_BATCHES - 1: one probe batch after each."""
        return self.eval_rate is None and after_steps <= self.session_steps < after_steps + PROBE_BATCHES

    def probe_done(self, size: int, seconds: float) -> None:
        """One evaluation batch, timed beside the step just taken. Each is
        one moment of a machine whose load comes and goes; the median of
        PROBE_BATCHES such moments is the measurement."""
        if not (self.last_steps and size and seconds > 0):
            return
        count, step_s = self.last_steps[-1]
        self.probes.append((size / seconds, count / max(step_s, 1e-9)))
        if len(self.probes) >= PROBE_BATCHES:
            self.eval_rate = median([e for e, _ in self.probes])
            self.eval_train_rate = median([t for _, t in self.probes])

    def final_eval_seconds(self, size: int) -> float | None:
        """The final evaluation of `size` units at the measured evaluation
        speed, scaled by how much training has slowed (or sped up) since that
        speed was measured: the load that slows one slows the other."""
        if self.eval_rate is None or not self.recent_rate:
            return None
        return size / self.eval_rate * self.eval_train_rate / self.recent_rate

    def out_of_time(self, budget_minutes: float | None, final_eval_size: Callable[[], int]) -> bool:
        """Whether the step about to start must be the last: asked before
        each step, since the stop is agreed through that step's collective.
        train.time_budget_minutes bounds the WHOLE job: training stops after
        this step when the time left once it is done will be less than
        1.25 x (one step + the predicted final evaluation) + 5 s
        (docs/reliability.md §7); the step that then still runs is the one
        step. Until the evaluation speed is measured only the budget itself
        stops the run. `final_eval_size()`: the units of the final evaluation."""
        if budget_minutes is None:
            return False
        left = 60 * budget_minutes - (time.perf_counter() - self.t_start)
        final_eval_s = self.final_eval_seconds(final_eval_size()) if left > 0 and self.eval_rate else None
        if final_eval_s is None:
            return left <= 0
        self.predicted_final_s = final_eval_s
        after_this_step = left - self.recent_step_s
        return after_this_step < 1.25 * (self.recent_step_s + final_eval_s) + 5.0  # margin: checkpoint, jitter


@dataclass
class Stop:
    requested: int = STOP_NONE  # what THIS rank asks for (SIGTERM, time budget)
    agreed: int = STOP_NONE  # agreed by all ranks: stop after the current step
