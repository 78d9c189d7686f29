"""The language-model loss: labels shifted inside (position t predicts token
t + 1), IGNORE_INDEX (-100) and padded positions ignored, the mean over the
remaining targets; and the LM head with the fused chunked cross-entropy that
never forms [B, T, V] logits when training."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from latte.ops import linear_cross_entropy

IGNORE_INDEX = -100  # the target value that contributes no loss (PyTorch's and transformers' convention)


def _check_labels(name: str, labels: torch.Tensor, shape: tuple, V: int, values: bool) -> None:
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != shape:
        got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"{name}: expected shape {shape} like input_ids, got {got}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: expected an integer tensor, got dtype {labels.dtype}")
    if not values:  # the value check is a host sync (see latte.models.inputs)
        return
    bad = labels[(labels != IGNORE_INDEX) & ((labels < 0) | (labels >= V))]
    if bad.numel():
        raise ValueError(f"{name}: found {int(bad[0])}; {name} must be in [0, {V - 1}] or -100 (ignored)")


def next_token_targets(
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    mask: torch.Tensor | None,
    shape: tuple,
    V: int,
    *,
    values: bool = True,
) -> torch.Tensor:
    """Targets [B, T] aligned with the positions (position t predicts
    targets[:, t]; -100 = no loss there).

    labels: input_ids-aligned; shifted here, so the last position has no
    target, and labels at padded positions (mask False) are ignored.
    shift_labels: already shifted (what a loader of (x, y) windows yields),
    used as they are. Exactly one of the two is given. values=False skips
    the range check of the ids (a host sync)."""
    if (labels is None) == (shift_labels is None):
        raise ValueError(
            "labels, shift_labels: give exactly one (labels are shifted inside, shift_labels are already shifted)"
        )
    if shift_labels is not None:
        _check_labels("shift_labels", shift_labels, shape, V, values)
        return shift_labels.long()
    _check_labels("labels", labels, shape, V, values)
    labels = labels.long()
    if mask is not None:
        labels = labels.masked_fill(~mask, IGNORE_INDEX)
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against position-aligned targets
    (-100 ignored; 0 when every target is ignored)."""
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts labels[t + 1]. Targets
    equal to -100 or at padded positions (mask False) are ignored; the loss is
    the mean over the remaining targets (0 if there are none)."""
    B, T, V = logits.shape
    return mean_cross_entropy(logits, next_token_targets(labels, None, mask, (B, T), V))


def head_and_loss(
    hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor | None, return_logits: bool | None, training: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logits or None, mean loss or None) of an LM head over hidden [B, T, D].

    return_logits None means: skip the logits exactly when a loss is computed
    in training mode with gradients on (the usual training step). Without
    logits the loss comes from the fused, chunked head + cross-entropy
    (latte.ops.linear_cross_entropy), which never forms [B, T, V]."""
    if return_logits is None:
        return_logits = not (targets is not None and training and torch.is_grad_enabled())
    if return_logits:
        logits = head(hidden)
        return logits, None if targets is None else mean_cross_entropy(logits, targets)
    if targets is None:
        raise ValueError("return_logits=False needs labels or shift_labels: there would be nothing to return")
    if head.bias is not None:
        raise ValueError("return_logits=False: the fused loss supports an LM head without bias")
    total = linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
    return None, total / (targets != IGNORE_INDEX).sum().clamp(min=1)
