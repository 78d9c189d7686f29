"""Open a trained run for inference (`latte generate`, `latte eval`, tests):
the newest checkpoint of a run folder (or one step folder), its config, its
task and the model with its weights.

Only what inference needs is read (the weights, the config and the task's
files, e.g. the tokenizer) and each of those files is checked against the
manifest when it is read; a damaged optimizer.pt, which inference never
reads, does not get in the way. Weights holding NaN or inf are refused with
a message naming them, rather than a model that only emits garbage.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from latte.config_io import merge, parse_overrides
from latte.train.checkpoint import Checkpoint, check_finite, check_state_against, load_checkpoint
from latte.train.config import RunConfig
from latte.train.distributed import DistEnv
from latte.train.inputs import DERIVED, INIT, RECORD, InputsChanged, compare, read_record
from latte.train.manifest import MANIFEST, MODEL, CheckpointError, step_dirs
from latte.train.task import Task, build_run_config, task_class

log = logging.getLogger("latte.train")


@dataclass
class TrainedRun:
    model: nn.Module  # eval mode
    task: Task
    config: RunConfig
    checkpoint: Path
    step: int

    @property
    def tokenizer(self) -> Any:
        """The task's tokenizer (tasks on text have one)."""
        return self.task.tokenizer


def open_run(path: str | Path, *, device: str | torch.device = "cpu", sets: Sequence[str] = ()) -> TrainedRun:
    """`path` is a run folder (its newest checkpoint that loads is used,
    skipping damaged ones with a warning) or one `step-N` folder. `sets`:
    overrides of the saved config ("section.field=value", `latte eval
    --set`), applied before the model is built."""
    path = Path(path).expanduser()
    if (path / MANIFEST).is_file():
        return _open_step(path, torch.device(device), sets)
    if not path.is_dir():
        raise ValueError(f"{path}: no such run or checkpoint folder")
    problems = []
    for _, step_dir in step_dirs(path):
        try:
            return _open_step(step_dir, torch.device(device), sets)
        except CheckpointError as e:
            log.warning("skipping checkpoint %s: %s", step_dir, e)
            problems.append(f"{step_dir.name}: {str(e).splitlines()[-1].strip()}")
    raise ValueError(
        f"{path}: no verified checkpoint (step-*/{MANIFEST}) in this run folder" + "".join(f"\n  {p}" for p in problems)
    )


def _open_step(step_dir: Path, device: torch.device, sets: Sequence[str] = ()) -> TrainedRun:
    ckpt = load_checkpoint(step_dir, verify="read", map_location=device)
    where = str(ckpt.file("config.yaml"))
    data = merge(ckpt.config, parse_overrides([f"--{s.lstrip('-')}" for s in sets])) if sets else ckpt.config
    cfg = build_run_config(data, where=where + (" + --set " + " ".join(sets) if sets else ""))
    task = task_class(cfg.task)(cfg, DistEnv(device=device))
    task.prepare_inference(ckpt)
    with torch.random.fork_rng(devices=[]):  # weights a checkpoint leaves out come from the seeded build
        torch.manual_seed(cfg.train.seed)
        model = task.build_model().to(device)
    load_weights(model, ckpt, task.checkpoint_keys(model))
    model.eval()
    return TrainedRun(model, task, cfg, step_dir, ckpt.step)


def check_run_inputs(trained: TrainedRun, *, verify: bool = False) -> None:
    """Before evaluating a trained run on the data its config names: those
    inputs (corpus files, tokenizer, base; not the token caches) must be the
    ones its run folder recorded (latte/train/inputs.py), else InputsChanged
    (exit 2) naming each. A run that predates the record is evaluated with a
    warning ("inputs not recorded")."""
    run_dir = trained.checkpoint.parent
    record = read_record(run_dir)
    if record is None:
        log.warning(
            "inputs not recorded: %s predates records of a run's inputs; evaluating without checking them", run_dir
        )
        return
    # neither the token caches nor train.init_from's weights are read by an evaluation
    recorded = {k: v for k, v in record["inputs"].items() if not k.startswith((DERIVED, INIT))}
    files = {k: v for k, v in trained.task.input_files().items() if not k.startswith(INIT)}
    changes, _ = compare(recorded, files, verify=verify)
    if changes:
        lines = "\n  ".join(f"{name}: recorded {was}; now {now}" for name, (was, now) in changes.items())
        raise InputsChanged(
            f"{run_dir}: {len(changes)} input(s) of the run changed since {run_dir / RECORD} recorded them:\n  "
            f"{lines}\nevaluating now would score the model on other data than its run's; restore the recorded "
            "inputs, or resume the run with --accept-changed-inputs to record the new ones (nothing was written)"
        )


def load_weights(model: nn.Module, ckpt: Checkpoint, keys: set[str] | None = None) -> None:
    """The checkpoint's weights into a plain (unwrapped) `model`, from either
    format; `keys`: the subset the checkpoint holds (None: all)."""
    expected = {k: v for k, v in model.state_dict().items() if keys is None or k in keys}
    if ckpt.format == "full":
        state = ckpt.model_state
        where = str(ckpt.path / MODEL)
        check_state_against(expected, state, where=where)
    else:
        state = {"model": dict(expected)}
        ckpt.load_sharded(state)  # into the model's own tensors
        state, where = state["model"], str(ckpt.path / "dcp")
    check_finite(state, where=where)
    model.load_state_dict(state, strict=keys is None)
