"""`LatteForSequenceClassification`: a bidirectional encoder, pooling over
real tokens, a linear head (the paper's Long Range Arena models, MATH.md 7)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .causal_lm import num_parameters
from .config import LatteConfig
from .io import PretrainedMixin
from .modeling import LatteModel, check_attention_mask


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
        hidden, _ = self.model(input_ids, attention_mask=attention_mask)  # [B, T, dim]
        mask = check_attention_mask(attention_mask, tuple(input_ids.shape))
        logits = self.head(pool(hidden, mask, self.config.pooling))  # [B, num_labels]
        return SequenceClassifierOutput(classification_loss(logits, labels, self.config.num_labels), logits)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude_embeddings=exclude_embeddings)


class LatteForPairClassification(PretrainedMixin, nn.Module):
    """A two-tower classifier of PAIRS of sequences (the LRA retrieval task:
    do two papers cite each other?). One shared encoder reads each sequence
    on its own; the pooled vectors u, v meet only in the head, an MLP on
    [u, v, u * v, u - v] (the LRA dual-encoder head). No attention crosses
    the pair, which is what the task measures: how well a long document is
    compressed into one vector. `forward(input_ids, input_ids_2, *, labels=None,
    attention_mask=None, attention_mask_2=None)`."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        if config.causal:
            raise ValueError("config.causal: the classifier is a bidirectional encoder, expected causal=False, got True")
        self.config = config
        self.model = LatteModel(config)
        self.head = nn.Sequential(nn.Linear(4 * config.dim, config.dim), nn.GELU(),
                                  nn.Linear(config.dim, config.num_labels))
        with torch.no_grad():
            self.model.init_weights()
            for layer in (self.head[0], self.head[2]):
                nn.init.normal_(layer.weight, 0.0, config.initializer_range)
                nn.init.zeros_(layer.bias)

    def forward(self, input_ids: torch.Tensor, input_ids_2: torch.Tensor, *, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                attention_mask_2: torch.Tensor | None = None) -> SequenceClassifierOutput:
        # both towers in one forward: pad to the longer one and stack along the batch
        (B, T1), (B2, T2) = input_ids.shape, input_ids_2.shape
        if B != B2 or input_ids.dim() != 2 or input_ids_2.dim() != 2:
            raise ValueError(f"input_ids_2: expected [B, T] with B={B} like input_ids, got {tuple(input_ids_2.shape)}")
        T = max(T1, T2)
        ids, masks = [], []
        for x, m in ((input_ids, attention_mask), (input_ids_2, attention_mask_2)):
            m = check_attention_mask(m, tuple(x.shape))
            m = torch.ones_like(x, dtype=torch.bool) if m is None else m
            ids.append(F.pad(x, (0, T - x.shape[1])))
            masks.append(F.pad(m, (0, T - m.shape[1])))
        ids_2BT, mask_2BT = torch.cat(ids), torch.cat(masks)
        hidden, _ = self.model(ids_2BT, attention_mask=mask_2BT)  # [2B, T, dim]
        u, v = pool(hidden, check_attention_mask(mask_2BT, (2 * B, T)), self.config.pooling).split(B)
        logits = self.head(torch.cat([u, v, u * v, u - v], dim=-1))  # [B, num_labels]
        return SequenceClassifierOutput(classification_loss(logits, labels, self.config.num_labels), logits)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude_embeddings=exclude_embeddings)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """Mean cross-entropy of logits [B, n] against class ids [B] (None without labels)."""
    if labels is None:
        return None
    if labels.shape != logits.shape[:1] or labels.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"labels: expected integer class ids of shape ({logits.shape[0]},), "
                         f"got {labels.dtype} {tuple(labels.shape)}")
    if bool(((labels < 0) | (labels >= n)).any()):
        raise ValueError(f"labels: class ids must be in [0, {n - 1}] (num_labels {n}), got {labels.tolist()}")
    return F.cross_entropy(logits.float(), labels.long())


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """hidden [B, T, dim] -> [B, dim]: mean over real tokens, or the first
    real token ("cls"; with left padding it is not at index 0)."""
    if mask is None:
        return hidden.mean(1) if pooling == "mean" else hidden[:, 0]
    if not bool(mask.any(1).all()):
        raise ValueError("attention_mask: every sequence needs at least one real token")
    if pooling == "mean":
        m = mask.unsqueeze(-1)  # [B, T, 1]; masked_fill: padded outputs may be anything, even NaN
        return hidden.masked_fill(~m, 0.0).sum(1) / m.sum(1).to(hidden.dtype)
    first = mask.long().argmax(1)  # [B] index of the first real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
