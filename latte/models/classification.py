"""`LatteForSequenceClassification`: a bidirectional encoder, pooling over
real tokens, a linear head (the paper's Long Range Arena models, docs/math.md §7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import LatteConfig
from .modeling import LatteModel, value_checks
from .pretrained import PretrainedMixin, architecture


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None  # mean cross-entropy over the batch
    logits: torch.Tensor  # [B, num_labels]


@architecture
class LatteForSequenceClassification(PretrainedMixin, nn.Module):
    """`forward(input_ids, *, labels=None, attention_mask=None)`. Padded
    positions (attention_mask 0) are excluded from every mixer and from the
    pooling, so padding (left or right) does not change the prediction."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        if config.causal:
            raise ValueError(
                "config.causal: the classifier is a bidirectional encoder, expected causal=False, got True"
            )
        self.config = config
        self.model = LatteModel(config)
        self.head = self.build_head(config)
        with torch.no_grad():
            self.model.init_weights()
            for layer in (m for m in self.head.modules() if isinstance(m, nn.Linear)):
                nn.init.normal_(layer.weight, 0.0, config.initializer_range)
                nn.init.zeros_(layer.bias)

    @staticmethod
    def build_head(config: LatteConfig) -> nn.Module:
        """pooled [B, dim] -> logits [B, num_labels]."""
        return nn.Linear(config.dim, config.num_labels)

    def forward(
        self, input_ids: torch.Tensor, *, labels: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> SequenceClassifierOutput:
        values = value_checks(self.model.validate_inputs, input_ids)
        mask = self.model.check_inputs(input_ids, attention_mask)  # the one validation of the inputs
        hidden, _ = self.model(input_ids, attention_mask=mask, inputs_checked=True)  # [B, T, dim]
        logits = self.head(pool(hidden, mask, self.config.pooling, values=values))  # [B, num_labels]
        loss = None
        if labels is not None:
            check_class_labels(labels, logits.shape[0], self.config.num_labels, values=values)
            loss = F.cross_entropy(logits.float(), labels.long())
        return SequenceClassifierOutput(loss, logits)


@architecture
class LatteForPairClassification(LatteForSequenceClassification):
    """A two-tower classifier of PAIRS of sequences (the LRA retrieval task:
    do two papers cite each other?). One shared encoder reads each sequence
    on its own; the pooled vectors u, v meet only in the head, an MLP on
    [u, v, u * v, u - v] (the LRA dual-encoder head). No attention crosses
    the pair, which is what the task measures: how well a long document is
    compressed into one vector. `forward(input_ids, input_ids_2, *, labels=None,
    attention_mask=None, attention_mask_2=None)`."""

    @staticmethod
    def build_head(config: LatteConfig) -> nn.Module:
        """[u, v, u * v, u - v] [B, 4 dim] -> logits [B, num_labels]."""
        return nn.Sequential(nn.Linear(4 * config.dim, config.dim), nn.GELU(), nn.Linear(config.dim, config.num_labels))

    def forward(
        self,
        input_ids: torch.Tensor,
        input_ids_2: torch.Tensor,
        *,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        attention_mask_2: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        values = value_checks(self.model.validate_inputs, input_ids)
        masks = [
            self.model.check_inputs(input_ids, attention_mask),
            self.model.check_inputs(input_ids_2, attention_mask_2),
        ]
        (B, T1), (B2, T2) = input_ids.shape, input_ids_2.shape
        if B != B2:
            raise ValueError(f"input_ids_2: expected [B, T] with B={B} like input_ids, got {tuple(input_ids_2.shape)}")
        # both towers in one forward: right-pad to the longer one, stack along the batch
        T = max(T1, T2)
        ids_2BT = torch.cat([F.pad(x, (0, T - x.shape[1])) for x in (input_ids, input_ids_2)])
        mask_2BT = torch.cat(
            [
                F.pad(torch.ones_like(x, dtype=torch.bool) if m is None else m, (0, T - x.shape[1]))
                for x, m in zip((input_ids, input_ids_2), masks)
            ]
        )
        hidden, _ = self.model(ids_2BT, attention_mask=mask_2BT, inputs_checked=True)  # [2B, T, dim]
        u, v = pool(hidden, mask_2BT, self.config.pooling, values=values).split(B)
        logits = self.head(torch.cat([u, v, u * v, u - v], dim=-1))  # [B, num_labels]
        loss = None
        if labels is not None:
            check_class_labels(labels, B, self.config.num_labels, values=values)
            loss = F.cross_entropy(logits.float(), labels.long())
        return SequenceClassifierOutput(loss, logits)


def check_class_labels(labels, batch: int, num_labels: int, *, values: bool = True) -> None:
    """labels: integer class ids [B] in [0, num_labels)."""
    if (
        not isinstance(labels, torch.Tensor)
        or tuple(labels.shape) != (batch,)
        or labels.dtype not in (torch.int64, torch.int32)
    ):
        got = f"{labels.dtype} {tuple(labels.shape)}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"labels: expected integer class ids of shape ({batch},), got {got}")
    if values and bool(((labels < 0) | (labels >= num_labels)).any()):
        raise ValueError(
            f"labels: class ids must be in [0, {num_labels - 1}] (num_labels {num_labels}), got {labels.tolist()}"
        )


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
