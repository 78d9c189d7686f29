"""One optimizer step: micro-batches, loss, gradients, the non-finite guard.

Loss weighting. The task gives each micro-batch's SUMMED loss and its count
of units (target tokens, examples). Each summed loss is divided by the
GLOBAL count of the step (all ranks, all micro-batches, counted before any
forward), so the gradient is exactly that of the unit-weighted mean loss of
the whole global batch: no average of averages, and 2 ranks x batch b gives
the same update as 1 process x batch 2b. DDP and FSDP2 average gradients
over ranks, hence the extra factor world_size.

Non-finite values (docs/reliability.md): when the loss or the gradient norm
is not finite on ANY rank (a MIN all-reduce of an ok flag), the update is
not applied: gradients are dropped and the optimizer is not stepped. The
same collective carries the "stop requested" flag (SIGTERM, time budget), so
all ranks stop after the same step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from latte.train.distributed import DistEnv, all_reduce, gradient_sync

# Stop requests, agreed over ranks as the maximum: stop after the step, then
# evaluate (time budget) or exit at once (preemption: SIGTERM).
STOP_NONE, STOP_BUDGET, STOP_PREEMPT = 0, 1, 2


class NonFiniteError(RuntimeError):
    """Training stopped on non-finite values (on_nonfinite: raise, or the cap
    of consecutive skipped steps was reached)."""


@dataclass
class StepResult:
    loss_sum: float  # summed over the units of all ranks (nan if not finite)
    count: int  # loss units (tokens, examples) of all ranks
    grad_norm: float  # before clipping
    applied: bool  # False: the update was skipped (non-finite loss or gradient)
    stop: int  # the largest stop request of any rank (STOP_*)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.count, 1)


def _grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Total gradient norm (clipping to max_norm when > 0); a plain tensor
    even when FSDP2 returns a DTensor."""
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach().float().cpu()


def micro_batches(batch: dict[str, torch.Tensor], n: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """`batch` split along its first dimension into n equal micro-batches, on `device`."""
    sizes = {k: v.shape[0] for k, v in batch.items()}
    rows = next(iter(sizes.values()), 0)
    if any(s != rows for s in sizes.values()):
        raise ValueError(f"batch: every tensor needs the same first dimension (the batch), got {sizes}")
    if rows % n:
        raise ValueError(f"local batch {rows} is not divisible by grad_accum={n}")
    moved = {k: v.to(device) for k, v in batch.items()}
    return [{k: v[i * (rows // n) : (i + 1) * (rows // n)] for k, v in moved.items()} for i in range(n)]


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    *,
    task,
    lr: float,
    env: DistEnv,
    grad_accum: int = 1,
    grad_clip: float = 0.0,
    precision: str = "fp32",
    stop: int = STOP_NONE,
    loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> StepResult:
    """One optimizer step on this rank's share of the global batch (a dict
    of tensors, first dimension the local batch); `task` gives the loss and
    count of each micro-batch (latte/train/task.py).

    `stop`: this rank's stop request (STOP_*), agreed over ranks in the
    result. `loss_hook`: the trainer's test hook (train/faults.py), applied to
    each micro-batch's summed loss.
    """
    for group in optimizer.param_groups:  # lr is a pure function of the step
        group["lr"] = lr
    micro = micro_batches(batch, grad_accum, env.device)
    local = sum(task.count(m) for m in micro)
    count = int(all_reduce(torch.tensor([float(local)], dtype=torch.float64, device=env.device), env, "sum").item())
    scale = env.world_size / max(count, 1)
    autocast = torch.autocast(env.device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()

    loss_local = torch.zeros((), dtype=torch.float64, device=env.device)
    for i, m in enumerate(micro):
        with gradient_sync(model, enabled=i == len(micro) - 1):
            with autocast:
                loss_sum = task.loss(model, m)
            if loss_hook is not None:
                loss_sum = loss_hook(loss_sum)
            (loss_sum * scale).backward()
        loss_local += loss_sum.detach().double()

    grad_norm = _grad_norm(model, grad_clip)
    ok = bool(torch.isfinite(loss_local)) and bool(torch.isfinite(grad_norm))
    flags = torch.tensor([float(ok), -float(stop)], dtype=torch.float64, device=env.device)
    all_reduce(flags, env, "min")  # every rank applies the update, or none does; max of the stops
    ok_all, stop_all = bool(flags[0] == 1), int(-flags[1])
    loss_global = float(all_reduce(loss_local.reshape(1), env, "sum").item())
    if ok_all:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_global if ok_all else math.nan, count, float(grad_norm), ok_all, stop_all)


class SkipGuard:
    """Applies `on_nonfinite`: "raise" stops at the first skipped step;
    "skip" tolerates up to `max_consecutive` skipped steps in a row."""

    def __init__(self, mode: str, max_consecutive: int, *, total: int = 0, consecutive: int = 0):
        self.mode, self.max_consecutive = mode, max_consecutive
        self.total, self.consecutive = total, consecutive

    def update(self, result: StepResult, step: int, batch: str) -> None:
        """`step` is 0-based; `batch` describes the data (e.g. global samples [a, b))."""
        if result.applied:
            self.consecutive = 0
            return
        self.total += 1
        self.consecutive += 1
        what = f"non-finite loss or gradient norm (grad_norm={result.grad_norm}) at step {step}, batch {batch}"
        if self.mode == "raise":
            raise NonFiniteError(f"{what}; the update was not applied (on_nonfinite: raise)")
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(
                f"{what}: {self.consecutive} consecutive steps skipped, reaching "
                f"max_consecutive_skips={self.max_consecutive}; stopping (the last update applied "
                f"was before step {step - self.consecutive + 1})"
            )

    def state_dict(self) -> dict:
        return {"skipped_steps": self.total, "consecutive_skips": self.consecutive}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.consecutive = state.get("skipped_steps", 0), state.get("consecutive_skips", 0)
