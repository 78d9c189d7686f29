"""Setup of a `latte train` run: everything `fit` needs, built in order.

    seed, threads, process group, run folder and its lock, checkpoint to
    resume (moving an abandoned timeline aside), the task's data, model,
    optimizer, checkpoint state, batch position, RNG, logger

Exact resume depends on this order (docs/reliability.md, "Exact resume"):
the data position is one global sample index and RNG is restored per rank
after everything else has consumed its random numbers.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latte.config_io import flatten, save_yaml, to_dict
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint, check_finite, check_state_against, load_checkpoint
from latte.train.config import RunConfig, check_world_size
from latte.train.faults import TrainerHooks, hooks_from_env
from latte.train.init_from import check_resumed, init_files, load_init, resolve_init
from latte.train.inputs import check_inputs
from latte.train.metrics import NullLogger, RunLogger
from latte.train.rng import restore_rng_state
from latte.train.rundir import RunLock, choose_resume, prepare_run_dir
from latte.train.state import (
    Checkpointer,
    Clock,
    DataPosition,
    Health,
    Progress,
    Stop,
    Weights,
    load_trainer_state,
)
from latte.train.step import SkipGuard
from latte.train.task import Task, build_run_config, task_class

log = logging.getLogger("latte.train")
# options of one start, not of the run: never compared with the checkpoint's config
START_OPTIONS = ("train.resume", "train.verify_inputs", "train.accept_changed_inputs")


@dataclass
class Run:
    """Everything `fit` and `evaluate` need, built by `setup`: the job, the
    trainer's state (train/state.py) and its services."""

    cfg: RunConfig
    env: D.DistEnv
    run_dir: Path
    task: Task
    weights: Weights  # model (wrapped when distributed) + optimizer
    data: DataPosition  # the training batches
    progress: Progress  # steps done, units seen
    guard: SkipGuard
    checkpointer: Checkpointer
    logger: RunLogger | NullLogger
    hooks: TrainerHooks  # no-ops unless LATTE_FAULTS is set (train/faults.py)
    lock: RunLock | None  # rank 0's hold on the run folder
    clock: Clock = field(default_factory=Clock)
    stop: Stop = field(default_factory=Stop)


# =========================================================================== setup


def setup(cfg: RunConfig, env: D.DistEnv) -> Run:
    check_world_size(cfg, env.world_size)
    _seed_everything(cfg.train.seed)
    _set_threads(cfg.train.num_threads, env)
    run_dir = Path(cfg.train.run_dir).expanduser()
    lock = D.on_rank0(lambda: prepare_run_dir(run_dir), env, share=False)
    try:
        ckpt_path = D.on_rank0(lambda: choose_resume(cfg.train.resume, run_dir), env)
        return _build(cfg, env, run_dir, lock, ckpt_path)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build(cfg: RunConfig, env: D.DistEnv, run_dir: Path, lock: RunLock | None, ckpt_path: Path | None) -> Run:
    ckpt = load_checkpoint(ckpt_path, verify="none") if ckpt_path else None  # rank 0 verified all files
    init = cfg.train.init_from if ckpt is None else None  # a resumed run has its own weights
    if init:  # first: a bad path fails before any data is read; a run folder's newest step, fixed now
        init = cfg.train.init_from = str(resolve_init(init))
    task = task_class(cfg.task)(cfg, env)
    if ckpt is not None and cfg.train.init_from:
        check_resumed(ckpt.config, cfg.train.init_from, ckpt.path)
    if ckpt is not None:
        _compare_configs(ckpt.config, cfg, ckpt.path, task, env)
        _check_inputs(cfg, env, run_dir, task, ckpt, prepared=False)  # before anything is written
    if env.is_main:
        save_yaml(cfg, run_dir / "config.yaml")
    task.prepare(run_dir, ckpt)
    _check_inputs(cfg, env, run_dir, task, ckpt, prepared=True)  # writes RUN_DIR/inputs.json

    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank (FSDP2 shards them)
    model = task.build_model().to(env.device)
    trainable = task.trainable_parameters(model)
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    if init:
        folder = load_init(model, task, init)
        if env.is_main:
            log.info("train.init_from: the weights of %s", folder)
    no_decay = task.no_weight_decay(model)
    keys = task.checkpoint_keys(model)
    if ckpt is not None and ckpt.format == "full":
        expected = {k: v for k, v in model.state_dict().items() if keys is None or k in keys}
        check_state_against(expected, ckpt.model_state, where=str(ckpt.path))
        check_finite(ckpt.model_state, where=str(ckpt.file("model.safetensors")))
    fsdp2 = env.is_distributed and cfg.train.distributed == "fsdp2"
    model = D.wrap_model(model, cfg.train.distributed, env, units=task.shard_units(model) if fsdp2 else None)
    sharded = fsdp2 and cfg.train.checkpoint_format in ("auto", "sharded")
    weights = Weights(model, _adamw(model, no_decay, cfg, env.device), keys, sharded, env)
    if ckpt is not None:
        weights.load_checkpoint(ckpt)
        _apply_optim_hparams(weights.optimizer, cfg, env.device)  # the config wins over the saved param_groups
    if cfg.train.compile:  # the training steps only: validation and samples call `model` (uncompiled)
        weights.compiled = torch.compile(model, backend=cfg.train.compile_backend)
    return _assemble(cfg, env, run_dir, lock, task, weights, ckpt)


def _assemble(cfg: RunConfig, env, run_dir: Path, lock, task: Task, weights: Weights, ckpt: Checkpoint | None) -> Run:
    """The trainer's state from the checkpoint (or fresh), then RNG, then the
    logger and the checkpointer."""
    t = cfg.train
    progress, guard, data = Progress(task.unit), SkipGuard(t.on_nonfinite, t.max_consecutive_skips), DataPosition(task)
    health = Health(progress, guard)
    trainer = {"progress": progress, "guard": guard, "health": health, "data": data}
    load_trainer_state(trainer, ckpt.trainer_state if ckpt is not None else {})  # creates the batches
    _restore_rng(ckpt, cfg, env, progress.step)
    if env.is_main:
        logger = RunLogger(
            run_dir,
            start_step=progress.step,
            total_steps=t.steps,
            unit=task.unit,
            log_every=t.log_every,
            tensorboard=t.tensorboard,
        )
    else:
        logger = NullLogger()
    hooks = hooks_from_env(rank=env.rank, run_dir=run_dir)
    checkpointer = Checkpointer(
        run_dir,
        cfg,
        env,
        keep=t.keep,
        trainer=trainer,
        weights=weights,
        health=health,
        task=task,
        hooks=hooks,
        log=logger.message,
    )
    run = Run(cfg, env, run_dir, task, weights, data, progress, guard, checkpointer, logger, hooks, lock)
    if ckpt is not None and ckpt.trainer_state.get("healthy") is False:
        logger.message(
            f"note: {ckpt.path.name} was saved after skipped steps; the newest healthy checkpoint "
            f"is step {health.last_healthy_step} (resume from it explicitly if this one misbehaves)"
        )
    logger.message(_describe(run, ckpt.path if ckpt is not None else None))
    return run


def _compare_configs(saved: dict, cfg: RunConfig, where: Path, task: Task, env: D.DistEnv) -> None:
    """The task and its architecture fields must match the checkpoint
    (ValueError naming all of them); any other change is allowed with a warning."""
    try:
        old = flatten(to_dict(build_run_config(saved, where=f"{where}/config.yaml")))
    except ValueError as e:
        raise ValueError(f"{where}: the saved config no longer validates, cannot resume from it:\n{e}") from None
    new = flatten(to_dict(cfg))
    if old.get("task") != new["task"]:
        raise ValueError(
            f"cannot resume from {where}: it was trained with task {old.get('task')!r}, "
            f"the config says task {new['task']!r}"
        )
    arch = task.architecture_fields()
    errors, changed = [], []
    for key, value in new.items():
        if old.get(key) == value or key in START_OPTIONS:
            continue
        (errors if key in arch else changed).append(f"{key}: checkpoint {old.get(key)!r}, config {value!r}")
    if errors:
        raise ValueError(
            f"cannot resume from {where}: the config changes the model architecture "
            f"({len(errors)} field{'s' * (len(errors) > 1)}):\n  "
            + "\n  ".join(errors)
            + "\nto train this config, start over with --resume never (earlier steps are "
            "moved aside, not deleted) or use a new train.run_dir"
        )
    if changed and env.is_main:
        log.warning("resuming from %s with a changed config:\n  %s", where, "\n  ".join(changed))


def _check_inputs(cfg: RunConfig, env: D.DistEnv, run_dir: Path, task: Task, ckpt, *, prepared: bool) -> None:
    """The run's inputs against its record (train/inputs.py), on rank 0."""
    t = cfg.train
    D.on_rank0(
        lambda: check_inputs(
            run_dir,
            {**task.input_files(), **init_files(t.init_from)},
            resumed=ckpt.path if ckpt is not None else None,
            step=ckpt.step if ckpt is not None else 0,
            verify=t.verify_inputs,
            accept=t.accept_changed_inputs,
            prepared=prepared,
        ),
        env,
        share=False,
    )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _set_threads(num_threads: int | None, env: D.DistEnv) -> None:
    if num_threads is None and env.is_distributed and env.device.type == "cpu":
        num_threads = max(1, (os.cpu_count() or 1) // env.local_world_size)  # ranks share the cores
    if num_threads is not None:
        torch.set_num_threads(num_threads)


def fused_adamw(fused: bool | None, device: torch.device) -> bool:
    """optim.fused resolved on `device`: None (auto) is fused on CUDA only."""
    return device.type == "cuda" if fused is None else fused


def _adamw(model: nn.Module, no_decay: set[str], cfg: RunConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (DDP prefixes "module."; FSDP2 keeps
    the names), fused as optim.fused says on `device`."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if name.removeprefix("module.") in no_decay else decay).append(p)
    o = cfg.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    fused = fused_adamw(o.fused, device) or None  # AdamW's default (foreach) when not fused
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps, fused=fused)


def _apply_optim_hparams(optimizer: torch.optim.Optimizer, cfg: RunConfig, device: torch.device) -> None:
    """The config's hyperparameters over the loaded param_groups; optim.fused
    too, with each step counter where that kernel reads it (fused: beside
    the parameter; else on the CPU, as AdamW keeps it)."""
    fused = fused_adamw(cfg.optim.fused, device) or None
    for group, wd in zip(optimizer.param_groups, (cfg.optim.weight_decay, 0.0)):
        group.update(betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=wd, fused=fused)
    for p, state in optimizer.state.items():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].to(p.device if fused else "cpu")


def _restore_rng(ckpt: Checkpoint | None, cfg: RunConfig, env: D.DistEnv, step: int) -> None:
    """Per-rank streams (dropout differs between ranks). Resuming: the saved
    state of this rank, or a fresh seed for a rank the saving run lacked."""
    saved = ckpt.rng_state(env.rank) if ckpt is not None else None
    if saved is not None:
        restore_rng_state(saved)
    else:
        _seed_everything(cfg.train.seed * 1_000_003 + 7919 * env.rank + step)


def _describe(run: Run, ckpt_path) -> str:
    c, env = run.cfg, run.env
    init = c.train.init_from
    how = f"resuming from {ckpt_path} (step {run.progress.step})" if ckpt_path else "starting fresh"
    how += f" from the weights of train.init_from={init}" if init and not ckpt_path else ""
    return (
        f"run {run.run_dir}: {how}; task {c.task}: {run.task.describe(run.weights.model)}; {env.world_size} rank(s) "
        f"({c.train.distributed if env.is_distributed else 'single process'}), {torch.get_num_threads()} "
        "threads"
    )
