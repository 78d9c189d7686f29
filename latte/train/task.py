"""Tasks: what `latte train` trains, behind one small interface.

The trainer (setup.py, loop.py, step.py) owns everything a task should not
write again: the YAML config with dotted overrides and validation, the
run-folder lock, checkpoints with a manifest and exact resume after kill -9
(full or sharded), torchrun with DDP or FSDP2, bf16 autocast, gradient
accumulation and clipping, the non-finite guard, SIGTERM and the time
budget, the progress bar, CSV and TensorBoard logs. A task says what is
trained, on what, and how it is scored:

    class MyTask(Task):
        name = "my-task"
        config_class = MyRunConfig  # RunConfig + the task's own sections

        def prepare(self, run_dir, checkpoint): ...  # data, tokenizer, teacher
        def build_model(self): ...                   # the nn.Module to train
        def train_batches(self, start_index): ...    # this rank's micro-batches source
        def loss(self, model, batch): ...            # summed loss of a micro-batch
        def evaluate(self, model, *, final): ...     # metrics, summed over ranks

Batches are dicts of tensors whose first dimension is the batch; the
trainer splits them into `optim.grad_accum` micro-batches and moves them to
the device. `train_batches(start_index)` returns an iterator over this
rank's share of each global batch with a `sample_index` attribute: the
global position of the next global batch (samples served so far over all
ranks), which is all the data state a checkpoint keeps, so a resume (on any
number of ranks) continues with the very next sample.

Loss weighting: `loss` returns the SUM of per-unit losses and `count` the
number of units (target tokens, examples) of a micro-batch, known before the
forward. The trainer divides by the global count of the step, so the update
is that of the unit-weighted mean over the whole global batch, whatever the
world size and accumulation (never an average of averages). `unit` names
the units in logs ("tokens", "examples").

Optional hooks, with their defaults:
    count                  units of a micro-batch: labels that are not -100
    trainable_parameters   names to optimize: those build_model left with
                           requires_grad; the trainer freezes the others
    no_weight_decay        norms, biases, embeddings
    checkpoint_keys        the model state a checkpoint keeps: all of it. A
                           task with frozen pretrained weights keeps only what
                           it trains; the rest comes back from build_model
                           (seeded with train.seed, in training and in open_run)
    checkpoint_files       files copied into each checkpoint (a tokenizer;
                           called at every save, so a task may write its own
                           format of the weights there)
    shard_units            what FSDP2 shards one by one: the `blocks` ModuleList
    sample                 text shown during training: none
    eval_size              units of one evaluation, for the time budget: 0
    summary                extra fields of summary.json at the end (e.g.
                           test-set metrics, or an export)
    format_metrics         one line of metrics for the log
    architecture_fields    config fields that must match when resuming: none
    prepare_inference      what open_run needs to rebuild the model from a
                           checkpoint without training data (a tokenizer)
    input_files            the files the run reads, recorded and checked on
                           resume (train/inputs.py): none
    check_init, init_state train.init_from (train/init_from.py): whether the
                           weights it names fit this run (nothing checked), and
                           the state of an exported model folder (refused)
    describe               one line about data and model at the start

Evaluation runs on every rank: sum over ranks with `self.sum_over_ranks`.
Under FSDP2 each forward is collective, so every rank must run the same
number of forwards (`self.lockstep` says when).

Choosing a task: the `task` key of the run config. A registered name
(TASKS below: "lm") or ``package.module:Class`` for a task defined
anywhere else, e.g. in a test. The language model (latte/train/lm.py) is
the reference implementation; tests/train/toy_task.py shows the smallest one.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from latte.config_io import ConfigError, build, merge, parse_overrides
from latte.models import IGNORE_INDEX
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint
from latte.train.config import RunConfig, load_config_file, resolve_config

# name -> "module:Class", imported when used (a task may need optional packages).
TASKS: dict[str, str] = {
    "lm": "latte.train.lm:LanguageModelingTask",
    "classification": "latte.train.classification:ClassificationTask",
    "convert": "latte.convert.task:ConversionTask",
}

Batch = dict[str, torch.Tensor]


class Batches(Protocol):
    """This rank's share of each global batch, in order, forever."""

    sample_index: int  # global samples served before the next batch (all ranks)

    def __next__(self) -> Batch: ...


class Task:
    """Base class of every task; see the module docstring."""

    name: ClassVar[str] = ""
    config_class: ClassVar[type[RunConfig]] = RunConfig
    unit: ClassVar[str] = "tokens"

    def __init__(self, cfg: RunConfig, env: D.DistEnv):
        self.cfg, self.env = cfg, env

    # ------------------------------------------------------------------ required

    def prepare(self, run_dir: Path, checkpoint: Checkpoint | None) -> None:
        """Everything the model and batches need: data, tokenizer, teacher.
        Runs on every rank; files shared by the ranks are written by rank 0
        (`self.env.is_main`) before a `D.barrier(self.env)`, then read by
        the others. `checkpoint` is the one being resumed (or None): read its
        files with `checkpoint.file(name)`."""
        raise NotImplementedError

    def build_model(self) -> nn.Module:
        """The model to train, on the CPU; called after seeding with
        train.seed, so every rank builds identical initial weights."""
        raise NotImplementedError

    def train_batches(self, start_index: int) -> Batches:
        """Training batches from global sample `start_index` (see Batches)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Summed (not averaged) loss of one micro-batch over its `count`
        units, a float32 scalar. `model` may be wrapped (DDP, FSDP2): call it
        exactly once, as `model(...)`."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, *, final: bool) -> dict[str, float]:
        """Validation metrics, identical on every rank. Periodic evaluations
        (final=False) may use a subset (train.eval_batches global batches);
        the final one uses the whole split."""
        raise NotImplementedError

    # ------------------------------------------------------------------ defaults

    def count(self, batch: Batch) -> int:
        return int((batch["labels"] != IGNORE_INDEX).sum())

    def trainable_parameters(self, model: nn.Module) -> set[str]:
        """Names of the parameters to optimize; the trainer freezes the rest.
        Default: those `build_model` left with requires_grad=True."""
        return {n for n, p in model.named_parameters() if p.requires_grad}

    def no_weight_decay(self, model: nn.Module) -> set[str]:
        """Norms, biases (anything below 2-D) and embeddings: GPT-2 / nanoGPT practice."""
        embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        return {n for n, p in model.named_parameters() if p.ndim < 2 or id(p) in embedding_ids}

    def checkpoint_keys(self, model: nn.Module) -> set[str] | None:
        """Names of the model's state entries a checkpoint keeps (None: all).
        The others must come back from `build_model` (e.g. frozen
        pretrained weights)."""
        return None

    def checkpoint_files(self) -> dict[str, Path]:
        return {}

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """Modules that FSDP2 shards one by one (before the root)."""
        for name, module in model.named_modules():
            if name.split(".")[-1] == "blocks" and isinstance(module, nn.ModuleList):
                return list(module)
        raise ValueError(
            f"{type(model).__name__}: no ModuleList named 'blocks' to shard with fsdp2; "
            f"the task {self.name!r} must say which modules to shard (shard_units)"
        )

    def sample(self, model: nn.Module) -> str | None:
        """Text to show (and append to samples.txt) every train.sample_every
        steps and at the end; rank 0 only, every rank under FSDP2 (lockstep)."""
        return None

    def eval_size(self, *, final: bool) -> int:
        return 0

    def summary(self, model: nn.Module, metrics: dict[str, float]) -> dict[str, Any]:
        """Extra fields of summary.json after the final evaluation `metrics`.
        Runs on every rank (collectives allowed); rank 0's result is written."""
        return {}

    def format_metrics(self, metrics: dict[str, float]) -> str:
        return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())

    def architecture_fields(self) -> set[str]:
        """Dotted config fields ("model.dim") that must equal the checkpoint's
        when resuming; any other change is allowed with a warning."""
        return set()

    def prepare_inference(self, checkpoint: Checkpoint) -> None:
        """What `build_model` needs when a trained run is opened for
        inference, read from the checkpoint (no training data)."""

    def input_files(self) -> dict[str, Path]:
        """{name: path} of every file the run reads (corpus files, a
        tokenizer, a base model; after `prepare` also the derived ones, named
        "cache:..."), recorded in RUN_DIR/inputs.json and compared when
        resuming (train/inputs.py). Called before `prepare` too: it must
        not need the data."""
        return {}

    def check_init(self, folder: Path, checkpoint: Checkpoint | None) -> None:
        """Before train.init_from's weights are loaded (train/init_from.py):
        a ValueError when the checkpoint (or, with `checkpoint` None, the
        exported model folder) `folder` cannot start this run although its
        tensors fit (e.g. a conversion of another base)."""

    def init_state(self, folder: Path) -> dict[str, torch.Tensor]:
        """The model state an exported model folder holds, named as the
        checkpoint keys (train.init_from); the default refuses exports."""
        raise ValueError(
            f"train.init_from={str(folder)!r}: an exported model folder; task {self.name!r} starts only from a "
            "checkpoint: give a step folder or a run folder"
        )

    def describe(self, model: nn.Module) -> str:
        return f"task {self.name}"

    # ------------------------------------------------------------------ helpers

    @property
    def lockstep(self) -> bool:
        """True when forwards are collective (FSDP2 on several ranks)."""
        return self.env.is_distributed and self.cfg.train.distributed == "fsdp2"

    def sum_over_ranks(self, *values: float) -> list[float]:
        """Each value summed over ranks (float64), identical on every rank."""
        t = torch.tensor(values, dtype=torch.float64, device=self.env.device)
        return D.all_reduce(t, self.env, "sum").tolist()


def task_class(name: str, *, where: str = "config") -> type[Task]:
    """The Task class for a registered name or a ``module:Class`` path."""
    target = TASKS.get(name, name) if isinstance(name, str) else None
    if target is None or ":" not in target:
        raise ConfigError(
            where, [("task", f"got {name!r}, expected one of {', '.join(map(repr, TASKS))} or 'package.module:Class'")]
        )
    module, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(where, [("task", f"{name!r}: cannot import {target} ({e})")]) from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(where, [("task", f"{name!r}: {target} is not a latte.train.task.Task subclass")])
    return cls


def build_run_config(data: dict, *, where: str) -> RunConfig:
    """A plain mapping (YAML + overrides, or a saved config.yaml) -> the
    validated config of its task (the `task` key, default "lm")."""
    name = data.get("task", "lm") if isinstance(data, dict) else "lm"
    cls = task_class(name, where=where)
    return build(cls.config_class, data, where=where)


def load_run_config(config_path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """YAML at `config_path` or a shipped config name (default: tiny) + CLI
    overrides -> a validated config of the task it names. Every problem is
    reported at once (a ValueError)."""
    path = resolve_config(config_path)
    data = merge(load_config_file(path), parse_overrides(list(overrides)))
    return build_run_config(data, where=str(path) + (" + overrides" if overrides else ""))
