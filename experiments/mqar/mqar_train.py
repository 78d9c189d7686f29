"""The MQAR training loop's pieces (latte experiment mqar): loss and accuracy
at the query positions only, the optimiser, the batch order."""

from __future__ import annotations

import torch

from latte.data.mqar import IGNORE_INDEX, MQARData
from latte.models import LatteForCausalLM


def scored_logits(model: LatteForCausalLM, ids_BT: torch.Tensor, labels_BT: torch.Tensor):
    """(logits [Q, V], targets [Q]) at the Q query positions of the batch."""
    hidden_BTD, _ = model.model(ids_BT)
    keep = labels_BT != IGNORE_INDEX
    return model.lm_head(hidden_BTD[keep]), labels_BT[keep]


@torch.no_grad()
def accuracy(model: LatteForCausalLM, data: MQARData, batch_size: int = 256) -> float:
    """Fraction of query positions whose argmax is the paired value."""
    was = model.training
    model.eval()
    hit = total = 0
    for i in range(0, len(data), batch_size):
        logits, target = scored_logits(model, data.input_ids[i : i + batch_size], data.labels[i : i + batch_size])
        hit += int((logits.argmax(-1) == target).sum())
        total += target.numel()
    model.train(was)
    return hit / max(total, 1)


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """AdamW, weight decay 0.1 except on norms, biases and embeddings (the
    trainer's rule, latte.train.task.Task.no_weight_decay)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    no_decay = {n for n, p in model.named_parameters() if p.ndim < 2 or id(p) in embeddings}
    groups = [
        {"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": 0.1},
        {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def batches(n: int, batch_size: int, epochs: int, g: torch.Generator):
    """(epoch, indices) of every batch: a fresh permutation per epoch."""
    for epoch in range(1, epochs + 1):
        order = torch.randperm(n, generator=g)
        for i in range(0, n, batch_size):
            yield epoch, order[i : i + batch_size]
