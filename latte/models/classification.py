"""`LatteForSequenceClassification`: a bidirectional encoder, pooling over
real tokens, a linear head (the paper's Long Range Arena models, MATH.md 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import LatteConfig
from .inputs import value_checks
from .modeling import LatteModel
from .pretrained import PretrainedMixin


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None  # mean cross-entropy over the batch
    logits: torch.Tensor  # [B, num_labels]


class LatteForSequenceClassification(PretrainedMixin, nn.Module):
    """`forward(input_ids, *, labels=None, attention_mask=None)`. Padded
    positions (attention_mask 0) are excluded from every mixer and from the
    pooling, so padding (left or right) does not change the prediction."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        if config.causal:
            raise ValueError("config.causal: the classifier is a bidirectional encoder, expected causal=False, got True")
        self.config = config
        self.model = LatteModel(config)
        self.head = nn.Linear(config.dim, config.num_labels)
        with torch.no_grad():
            self.model.init_weights()
            nn.init.normal_(self.head.weight, 0.0, config.initializer_range)
            nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, *, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> SequenceClassifierOutput:
        values = value_checks(self.model.validate_inputs)
        mask = self.model.check_inputs(input_ids, attention_mask)  # the one validation of the inputs
        hidden, _ = self.model(input_ids, attention_mask=mask, inputs_checked=True)  # [B, T, dim]
        logits = self.head(pool(hidden, mask, self.config.pooling, values=values))  # [B, num_labels]
        loss = None
        if labels is not None:
            check_class_labels(labels, logits.shape[0], self.config.num_labels, values=values)
            loss = F.cross_entropy(logits.float(), labels.long())
        return SequenceClassifierOutput(loss, logits)


def check_class_labels(labels, batch: int, num_labels: int, *, values: bool = True) -> None:
    """labels: integer class ids [B] in [0, num_labels)."""
    if (not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (batch,)
            or labels.dtype not in (torch.int64, torch.int32)):
        got = f"{labels.dtype} {tuple(labels.shape)}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"labels: expected integer class ids of shape ({batch},), got {got}")
    if values and bool(((labels < 0) | (labels >= num_labels)).any()):
        raise ValueError(f"labels: class ids must be in [0, {num_labels - 1}] (num_labels {num_labels}), "
                         f"got {labels.tolist()}")


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str, *, values: bool = True) -> torch.Tensor:
    """hidden [B, T, dim] -> [B, dim]: mean over real tokens, or the first
    real token ("cls"; with left padding it is not at index 0)."""
    if mask is None:
        return hidden.mean(1) if pooling == "mean" else hidden[:, 0]
    if values and not bool(mask.any(1).all()):
        raise ValueError("attention_mask: every sequence needs at least one real token")
    if pooling == "mean":
        m = mask.unsqueeze(-1)  # [B, T, 1]; masked_fill: padded outputs may be anything, even NaN
        return hidden.masked_fill(~m, 0.0).sum(1) / m.sum(1).clamp(min=1).to(hidden.dtype)
    first = mask.long().argmax(1)  # [B] index of the first real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
