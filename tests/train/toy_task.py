"""The smallest Task: classify random vectors by the sign of their sum with
a two-layer MLP. It exists to show that a task plugs into `latte train`
(config section, checkpoints, resume, logs, torchrun) without touching the
trainer: select it with ``task: tests.train.toy_task:ToyTask``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from latte.config_io import ConfigErrors
from latte.train.config import RunConfig
from latte.train.task import Batch, Task

TASK = "tests.train.toy_task:ToyTask"


@dataclass
class ToyConfig:
    features: int = 8
    hidden: int = 16
    train_examples: int = 256
    val_examples: int = 64

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        for name in ("features", "hidden", "train_examples", "val_examples"):
            e.check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        e.raise_if_any()


@dataclass
class ToyRunConfig(RunConfig):
    task: str = TASK
    toy: ToyConfig = field(default_factory=ToyConfig)


def _examples(n: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return x, (x.sum(1) > 0).long()


class ExampleBatches:
    """Global sample p is example p % N; rank r takes its slice of each global batch."""

    def __init__(self, x, y, global_batch: int, rank: int, world: int, start: int):
        self.x, self.y, self.sample_index = x, y, start
        self.global_batch, self.local, self.rank = global_batch, global_batch // world, rank

    def __next__(self) -> Batch:
        first = self.sample_index + self.rank * self.local
        idx = torch.arange(first, first + self.local) % len(self.x)
        self.sample_index += self.global_batch
        return {"x": self.x[idx], "labels": self.y[idx]}


class ToyTask(Task):
    name = "toy"
    config_class = ToyRunConfig
    unit = "examples"
    cfg: ToyRunConfig

    def prepare(self, run_dir: Path, checkpoint) -> None:
        c = self.cfg.toy
        self.train_xy = _examples(c.train_examples, c.features, seed=1)
        self.val_xy = _examples(c.val_examples, c.features, seed=2)

    def build_model(self) -> nn.Module:
        c = self.cfg.toy
        return nn.Sequential(nn.Linear(c.features, c.hidden), nn.ReLU(), nn.Linear(c.hidden, 2))

    def train_batches(self, start_index: int) -> ExampleBatches:
        return ExampleBatches(
            *self.train_xy, self.cfg.train.global_batch_size, self.env.rank, self.env.world_size, start_index
        )

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]).float(), batch["labels"], reduction="sum")

    @torch.no_grad()
    def evaluate(self, model: nn.Module, *, final: bool) -> dict[str, float]:
        x, y = self.val_xy
        mine = torch.arange(self.env.rank, len(x), self.env.world_size)
        logits = model(x[mine].to(self.env.device)).float()
        loss = F.cross_entropy(logits, y[mine].to(self.env.device), reduction="sum")
        correct = (logits.argmax(-1).cpu() == y[mine]).sum()
        loss_sum, right, n = self.sum_over_ranks(float(loss), float(correct), float(len(mine)))
        return {"loss": loss_sum / n, "accuracy": right / n, "examples": int(n)}

    def eval_size(self, *, final: bool) -> int:
        return self.cfg.toy.val_examples


class FrozenToyTask(ToyTask):
    """The toy with its first layer frozen and only the trained layer in
    checkpoints: the shape of conversion up-training (frozen base weights
    rebuilt by `build_model`, a few trainable ones saved)."""

    TRAINED = {"2.weight", "2.bias"}

    def trainable_parameters(self, model: nn.Module) -> set[str]:
        return self.TRAINED

    def checkpoint_keys(self, model: nn.Module) -> set[str]:
        return self.TRAINED
