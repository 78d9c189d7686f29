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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latte.config_io import save_yaml, to_dict
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint, check_finite, check_state_against, load_checkpoint, nonfinite_tensors
from latte.train.config import RunConfig, check_world_size
from latte.train.faults import Faults
from latte.train.metrics import NullLogger, RunLogger
from latte.train.rng import restore_rng_state
from latte.train.rundir import RunLock, choose_resume, prepare_run_dir
from latte.train.sharded import apply_sharded_state, sharded_state
from latte.train.step import STOP_NONE, SkipGuard
from latte.train.task import Batches, Task, build_run_config, task_class

log = logging.getLogger("latte.train")


@dataclass
class Run:
    """Everything `fit` and `evaluate` need, built by `setup`."""

    cfg: RunConfig
    env: D.DistEnv
    run_dir: Path
    task: Task
    model: nn.Module  # wrapped (DDP / FSDP2) when distributed
    optimizer: torch.optim.Optimizer
    batches: Batches
    guard: SkipGuard
    logger: RunLogger | NullLogger
    faults: Faults
    lock: RunLock | None  # rank 0's hold on the run folder
    checkpoint_keys: set[str] | None  # the model state a checkpoint keeps (None: all)
    step: int = 0  # optimizer steps completed (skipped ones included)
    seen: int = 0  # loss units (tokens, examples) trained on
    last_healthy_step: int | None = None  # newest checkpoint saved with no skipped step since the one before
    skips_at_last_save: int = 0
    t_start: float = 0.0
    train_seconds: float = 0.0  # spent in optimizer steps this session
    train_count: int = 0  # units of those steps
    recent_rate: float = 0.0  # units per second, moving average of the last steps
    recent_step_s: float = 0.0  # seconds per step, moving average
    eval_speedup: float = 3.0  # evaluation units/s over training units/s (forward only), measured
    stop_request: int = STOP_NONE  # what THIS rank asks for (SIGTERM, time budget)
    stop: int = STOP_NONE  # agreed by all ranks: stop after the current step

    @property
    def raw_model(self) -> nn.Module:
        return D.unwrap(self.model)

    @property
    def sharded(self) -> bool:
        """Checkpoints in the sharded (DCP) format: FSDP2 on several ranks."""
        t = self.cfg.train
        return self.env.is_distributed and t.distributed == "fsdp2" and t.checkpoint_format in ("auto", "sharded")


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
    task = task_class(cfg.task)(cfg, env)
    if ckpt is not None:
        _compare_configs(ckpt.config, cfg, ckpt.path, task, env)
    if env.is_main:
        save_yaml(cfg, run_dir / "config.yaml")
    task.prepare(run_dir, ckpt)

    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank (FSDP2 shards them)
    model = task.build_model().to(env.device)
    trainable = task.trainable_parameters(model)
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    no_decay = task.no_weight_decay(model)
    keys = task.checkpoint_keys(model)
    if ckpt is not None and ckpt.format == "full":
        expected = {k: v for k, v in model.state_dict().items() if keys is None or k in keys}
        check_state_against(expected, ckpt.model_state, where=str(ckpt.path))
        check_finite(ckpt.model_state, where=str(ckpt.file("model.safetensors")))
    fsdp2 = env.is_distributed and cfg.train.distributed == "fsdp2"
    model = D.wrap_model(model, cfg.train.distributed, env, units=task.shard_units(model) if fsdp2 else None)
    optimizer = _adamw(model, no_decay, cfg)

    state = {"step": 0, "sample_index": 0, "skipped_steps": 0, "consecutive_skips": 0}
    if ckpt is not None:
        _load_state(model, optimizer, ckpt, keys, env)
        _apply_optim_hparams(optimizer, cfg)  # the config wins over the saved param_groups
        state.update(ckpt.trainer_state)
    batches = task.train_batches(state["sample_index"])
    _restore_rng(ckpt, cfg, env, state["step"])

    logger = (
        RunLogger(
            run_dir,
            start_step=state["step"],
            total_steps=cfg.train.steps,
            unit=task.unit,
            log_every=cfg.train.log_every,
            tensorboard=cfg.train.tensorboard,
        )
        if env.is_main
        else NullLogger()
    )
    run = Run(
        cfg,
        env,
        run_dir,
        task,
        model,
        optimizer,
        batches,
        SkipGuard(
            cfg.train.on_nonfinite,
            cfg.train.max_consecutive_skips,
            total=state["skipped_steps"],
            consecutive=state["consecutive_skips"],
        ),
        logger,
        Faults.from_env(),
        lock,
        keys,
        step=state["step"],
        seen=state.get(f"{task.unit}_seen", 0),
        last_healthy_step=state.get("last_healthy_step"),
        skips_at_last_save=state["skipped_steps"],
    )
    if ckpt is not None and state.get("healthy") is False:
        logger.message(
            f"note: {ckpt.path.name} was saved after skipped steps; the newest healthy checkpoint "
            f"is step {run.last_healthy_step} (resume from it explicitly if this one misbehaves)"
        )
    logger.message(_describe(run, ckpt_path))
    return run


def _load_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: Checkpoint, keys: set[str] | None, env: D.DistEnv
) -> None:
    """Weights and optimizer state of `ckpt` into the (wrapped) model, from
    either format, on any world size; refuses non-finite weights."""
    if ckpt.format == "full":
        D.load_full_state(model, optimizer, ckpt.model_state, ckpt.optimizer_state, strict=keys is None)
        return
    state = sharded_state(model, optimizer, keys)
    ckpt.load_sharded(state)
    apply_sharded_state(model, optimizer, state, strict=keys is None)
    bad = len(nonfinite_tensors(state["model"]))
    if D.all_reduce(torch.tensor([float(bad)], device=env.device), env, "sum").item():
        raise ValueError(
            f"{ckpt.path}: non-finite weights (the run diverged before this save; use an earlier checkpoint)"
        )


def _compare_configs(saved: dict, cfg: RunConfig, where: Path, task: Task, env: D.DistEnv) -> None:
    """The task and its architecture fields must match the checkpoint
    (ValueError naming all of them); any other change is allowed with a warning."""
    try:
        old = _flatten(to_dict(build_run_config(saved, where=f"{where}/config.yaml")))
    except ValueError as e:
        raise ValueError(f"{where}: the saved config no longer validates, cannot resume from it:\n{e}") from None
    new = _flatten(to_dict(cfg))
    if old.get("task") != new["task"]:
        raise ValueError(
            f"cannot resume from {where}: it was trained with task {old.get('task')!r}, "
            f"the config says task {new['task']!r}"
        )
    arch = task.architecture_fields()
    errors, changed = [], []
    for key, value in new.items():
        if old.get(key) == value or key == "train.resume":
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


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _set_threads(num_threads: int | None, env: D.DistEnv) -> None:
    if num_threads is None and env.is_distributed and env.device.type == "cpu":
        num_threads = max(1, (os.cpu_count() or 1) // env.local_world_size)  # ranks share the cores
    if num_threads is not None:
        torch.set_num_threads(num_threads)


def _adamw(model: nn.Module, no_decay: set[str], cfg: RunConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (DDP prefixes "module."; FSDP2 keeps the names)."""
    decay, plain = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (plain if name.removeprefix("module.") in no_decay else decay).append(p)
    o = cfg.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps)


def _apply_optim_hparams(optimizer: torch.optim.Optimizer, cfg: RunConfig) -> None:
    for group, wd in zip(optimizer.param_groups, (cfg.optim.weight_decay, 0.0)):
        group.update(betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=wd)


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
    how = f"resuming from {ckpt_path} (step {run.step})" if ckpt_path else "starting fresh"
    return (
        f"run {run.run_dir}: {how}; task {c.task}: {run.task.describe(run.model)}; {env.world_size} rank(s) "
        f"({c.train.distributed if env.is_distributed else 'single process'}), {torch.get_num_threads()} "
        "threads"
    )
