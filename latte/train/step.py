"""One optimizer step: micro-batches, loss, gradients, the non-finite guard.

Loss. The loader's labels are ALREADY shifted (labels[:, t] is the token
after input_ids[:, t]), so the model is given them as shift_labels (labels
would be shifted a second time) and computes the mean loss with its fused
head + cross-entropy; times the micro-batch's target count it is the sum.
Each micro-batch's summed loss is divided by the GLOBAL number of target
tokens of the step (all ranks, all micro-batches, counted first),
so the gradient is exactly that of the token-weighted mean loss of the whole
global batch: no average of averages, and 2 ranks x batch b gives the same
update as 1 process x batch 2b. DDP and FSDP2 average gradients over ranks,
hence the extra factor world_size.

Non-finite values (RELIABILITY.md): when the loss or the gradient norm is
not finite on ANY rank (a MIN all-reduce of an ok flag), the update is not
applied: gradients are dropped and the optimizer is not stepped. The same
collective carries the "stop requested" flag (SIGTERM, time budget), so all
ranks stop after the same step.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from latte.models import IGNORE_INDEX
from latte.train.distributed import DistEnv, all_reduce, gradient_sync

# Stop requests, agreed over ranks as the maximum: stop after the step, then
# evaluate (time budget) or exit at once (preemption: SIGTERM).
STOP_NONE, STOP_BUDGET, STOP_PREEMPT = 0, 1, 2


class NonFiniteError(RuntimeError):
    """Training stopped on non-finite values (on_nonfinite: raise, or the cap
    of consecutive skipped steps was reached)."""


@dataclass
class StepResult:
    loss_sum: float  # summed over target tokens of all ranks (nan if not finite)
    tokens: int  # target tokens of all ranks
    grad_norm: float  # before clipping
    applied: bool  # False: the update was skipped (non-finite loss or gradient)
    stop: int  # the largest stop request of any rank (STOP_*)

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.tokens, 1)


def summed_loss(model: nn.Module, input_ids_BT: torch.Tensor, labels_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the next-token losses in float32, number of targets) for labels
    that are already shifted; -100 is ignored. The model computes it with its
    fused head + cross-entropy (no [B, T, V] logits), inside its forward so
    that DDP and FSDP2 see one ordinary forward."""
    count = (labels_BT != IGNORE_INDEX).sum()
    mean = model(input_ids_BT, shift_labels=labels_BT, return_logits=False).loss
    return mean * count.clamp(min=1), count


def _grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Total gradient norm (clipping to max_norm when > 0); a plain tensor
    even when FSDP2 returns a DTensor."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach().float().cpu()


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, input_ids: torch.Tensor,
               labels: torch.Tensor, *, lr: float, env: DistEnv, grad_accum: int = 1,
               grad_clip: float = 0.0, precision: str = "fp32", stop: int = STOP_NONE,
               inject_nan: bool = False) -> StepResult:
    """One optimizer step on this rank's share [B_local, T] of the global batch.

    `stop`: this rank's stop request (STOP_*), agreed over ranks in the
    result. `inject_nan`: test-only, turns this rank's loss into NaN.
    """
    for group in optimizer.param_groups:  # lr is a pure function of the step
        group["lr"] = lr
    input_ids, labels = input_ids.to(env.device), labels.to(env.device)
    if input_ids.shape[0] % grad_accum:
        raise ValueError(f"local batch {input_ids.shape[0]} is not divisible by grad_accum={grad_accum}")

    count = torch.tensor([float((labels != IGNORE_INDEX).sum())], dtype=torch.float64, device=env.device)
    total_tokens = int(all_reduce(count, env, "sum").item())
    scale = env.world_size / max(total_tokens, 1)
    autocast = (torch.autocast(env.device.type, dtype=torch.bfloat16) if precision == "bf16"
                else nullcontext())

    loss_local = torch.zeros((), dtype=torch.float64, device=env.device)
    micro = list(zip(input_ids.chunk(grad_accum), labels.chunk(grad_accum)))
    for i, (x_BT, y_BT) in enumerate(micro):
        with gradient_sync(model, enabled=i == len(micro) - 1):
            with autocast:
                loss_sum, _ = summed_loss(model, x_BT, y_BT)
            if inject_nan:
                loss_sum = loss_sum * float("nan")
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
    return StepResult(loss_global if ok_all else math.nan, total_tokens, float(grad_norm), ok_all, stop_all)


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
                f"was before step {step - self.consecutive + 1})")

    def state_dict(self) -> dict:
        return {"skipped_steps": self.total, "consecutive_skips": self.consecutive}
