"""The MQAR training loop's pieces (python -m experiments.mqar): loss and accuracy
at the query positions only, the optimiser, the batch order."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from experiments.common.cells import set_aside
from latte.data import IGNORE_INDEX, MQARData
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


# --------------------------------------------------------------------------- resuming a cell mid-run
# A cell's run saves its progress at every test evaluation (every 250 steps at the full budget) and
# where a deadline stops it, so a killed or stopped run continues where it was instead of starting
# over. The file records the cell and its protocol: another cell's or protocol's progress is set
# aside (renamed, nothing deleted), never resumed. A finished run keeps its record there until the
# sweep's cell file is written, so a kill between the two rebuilds the same cell.


def _normal(obj) -> object:
    return json.loads(json.dumps(obj))


def save_progress(path: Path, identity: dict, state: dict) -> None:
    """Write `state` (model, optimizer, the loop's counters) with the cell's identity, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"identity": _normal(identity), **state}, tmp)
    os.replace(tmp, path)


def load_progress(path: Path, identity: dict) -> dict | None:
    """The saved progress of this cell under this protocol, or None (nothing saved, or the file was of
    another cell or protocol or unreadable: then it is renamed `NAME.set-aside-N` and the run starts over)."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
        same = isinstance(saved, dict) and saved.get("identity") == _normal(identity)
    except Exception as e:  # a damaged file: kept, set aside, never resumed
        saved, same, why = None, False, f"unreadable ({type(e).__name__}: {e})"
    else:
        why = "of another cell or protocol"
    if same:
        return saved
    target = set_aside(path)
    print(f"mqar: the saved progress {path} is {why}: set aside as {target}, the run starts over", file=sys.stderr)
    return None
