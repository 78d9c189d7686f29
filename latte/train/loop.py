"""`latte train`: setup, fit, evaluate. Reads top to bottom.

    setup     (train/setup.py) seed, threads, process group, run folder and
              its lock, checkpoint to resume, the task's data and model,
              optimizer, batch position, RNG
    fit       optimizer steps (`step.train_step`), logging, validation,
              samples, checkpoints; stops cleanly on SIGTERM / time budget
    evaluate  the task's final evaluation, a sample, summary.json, the
              loss-curve PNG

What is trained is a Task (train/task.py; language modelling by default).
Only rank 0 logs and writes unsharded files; every metric is a sum with its
count over ranks. Exact resume: lr is a pure function of the step, the data
position is one global sample index, RNG is restored per rank, and the
optimizer is saved with the weights (docs/reliability.md). A checkpoint is
never taken of weights that are not finite or that just produced skipped
steps, and retention never deletes the newest healthy checkpoint.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import torch

from latte.models import num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import nonfinite_tensors, save_checkpoint
from latte.train.config import RunConfig
from latte.train.faults import kill_self
from latte.train.rng import capture_rng_state
from latte.train.schedule import lr_at
from latte.train.setup import Run, setup
from latte.train.sharded import sharded_state
from latte.train.step import STOP_BUDGET, STOP_PREEMPT, train_step


def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the job described by `cfg`; returns the summary dict."""
    t_start = time.perf_counter()
    env = D.init_distributed()
    run, clean = None, False
    try:
        run = setup(cfg, env)
        run.t_start = t_start
        fit(run)
        summary = evaluate(run)
        clean = True
        return summary
    finally:
        if run is not None:
            run.logger.close()
            if run.lock is not None:
                run.lock.release()
        D.shutdown(env, synchronize=clean)


# =========================================================================== fit


def fit(run: Run) -> None:
    """Optimizer steps until train.steps, a stop request or a non-finite cap."""
    t = run.cfg.train
    previous = signal.signal(signal.SIGTERM, _on_sigterm(run))
    try:
        while run.step < t.steps and not run.stop:
            _one_step(run)
            done = run.step >= t.steps or bool(run.stop)
            if run.step in t.eval_whole_at and not done:
                _validate_whole(run)
            elif _due(run.step, t.eval_every) and not done:  # the final validation is in `evaluate`
                _validate(run, final=False)
            if _due(run.step, t.sample_every) and not done:
                _sample(run)
            if _due(run.step, t.save_every) or done:
                save(run)
        if run.stop:
            why = (
                "SIGTERM received (preemption)"
                if run.stop == STOP_PREEMPT
                else f"leaving time for the final validation within train.time_budget_minutes={t.time_budget_minutes:g}"
            )
            run.logger.message(f"stopped cleanly after step {run.step}: {why}")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def _on_sigterm(run: Run):
    def handler(signum, frame):  # finish the step, checkpoint, exit 0
        run.stop_request = STOP_PREEMPT

    return handler


def _one_step(run: Run) -> None:
    cfg, env = run.cfg, run.env
    o = cfg.optim
    first_sample = run.batches.sample_index
    batch = next(run.batches)
    lr = lr_at(
        run.step,
        base_lr=o.lr,
        warmup_steps=o.warmup_steps,
        total_steps=cfg.train.steps,
        decay=o.decay,
        min_lr_ratio=o.min_lr_ratio,
    )
    run.faults.maybe_sigterm(run.step)
    run.faults.maybe_hold(run.step, run.run_dir, env.is_main)
    if _out_of_time(run):
        run.stop_request = max(run.stop_request, STOP_BUDGET)
    t0 = time.perf_counter()
    result = train_step(
        run.model,
        run.optimizer,
        batch,
        task=run.task,
        lr=lr,
        env=env,
        grad_accum=o.grad_accum,
        grad_clip=o.grad_clip,
        precision=cfg.train.precision,
        stop=run.stop_request,
        inject_nan=run.faults.nan_loss(run.step, env.rank),
    )
    seconds = time.perf_counter() - t0
    batch_text = f"global samples [{first_sample}, {first_sample + cfg.train.global_batch_size})"
    run.logger.train_step(run.step + 1, result, lr, seconds, time.perf_counter() - run.t_start)
    run.guard.update(result, run.step, batch_text)  # raises NonFiniteError (raise mode / cap)
    run.step += 1
    run.seen += result.count
    run.train_seconds += seconds
    run.train_count += result.count
    rate = result.count / max(seconds, 1e-9)
    run.recent_rate = rate if not run.recent_rate else 0.7 * run.recent_rate + 0.3 * rate
    run.recent_step_s = seconds if not run.recent_step_s else 0.7 * run.recent_step_s + 0.3 * seconds
    run.stop = result.stop  # agreed over ranks: all stop after this same step


def _out_of_time(run: Run) -> bool:
    """train.time_budget_minutes bounds the WHOLE job: stop training while
    there is still time for this step, its checkpoint and the final
    evaluation, estimated from the current training speed (which also tracks
    a machine that got busier) and the measured evaluation/training ratio."""
    budget = run.cfg.train.time_budget_minutes
    if budget is None:
        return False
    left = 60 * budget - (time.perf_counter() - run.t_start)
    if left <= 0 or not run.recent_rate:
        return left <= 0
    final_eval_s = run.task.eval_size(final=True) / (run.eval_speedup * run.recent_rate)
    return left < 1.25 * (run.recent_step_s + final_eval_s) + 5.0  # margin: checkpoint, sample, jitter


def _eval_model(run: Run):
    """FSDP2 forwards are collective: every rank runs the wrapped model in
    lockstep; otherwise the plain module (no DDP hooks) on each rank."""
    return run.model if run.task.lockstep else run.raw_model


def _validate(run: Run, *, final: bool) -> dict:
    t0 = time.perf_counter()
    metrics = run.task.evaluate(_eval_model(run), final=final)
    seconds = time.perf_counter() - t0
    size = run.task.eval_size(final=final)
    if run.recent_rate and size and seconds > 0:
        run.eval_speedup = size / seconds / run.recent_rate
    run.logger.validation(run.step, metrics, run.task.format_metrics(metrics))
    return metrics


def _validate_whole(run: Run) -> dict:
    """A periodic validation on the whole split (train.eval_whole_at): the
    tasks read train.eval_batches, whose 0 means the whole validation split
    (TrainConfig); set for this one call, not the final evaluation (which
    may also score a test split)."""
    t = run.cfg.train
    batches, t.eval_batches = t.eval_batches, 0
    try:
        return _validate(run, final=False)
    finally:
        t.eval_batches = batches


def _sample(run: Run) -> str | None:
    """The task's sample (text), on rank 0 (every rank under FSDP2)."""
    if not (run.env.is_main or run.task.lockstep):
        return None
    text = run.task.sample(_eval_model(run))
    if text is not None:
        run.logger.sample(run.step, text)
    return text


# =========================================================================== checkpoints


def save(run: Run) -> Path | None:
    """A checkpoint of the current step (collective: every rank calls it),
    unless the weights are not fit to keep: after a skipped step (the
    current weights produced a non-finite loss or gradient) or with
    non-finite values. Returns the step folder, or None when refused."""
    env, faults = run.env, run.faults
    refused = _unfit_to_save(run)
    if refused:
        newest = (
            f"the newest healthy checkpoint is step {run.last_healthy_step}"
            if run.last_healthy_step is not None
            else "there is no healthy checkpoint yet"
        )
        run.logger.message(f"step {run.step}: checkpoint NOT taken: {refused}; {newest}")
        return None
    healthy = run.guard.total == run.skips_at_last_save  # no step skipped since the last checkpoint
    last_healthy = run.step if healthy else run.last_healthy_step
    trainer_state = {
        "step": run.step,
        f"{run.task.unit}_seen": run.seen,
        "sample_index": run.batches.sample_index,
        **run.guard.state_dict(),
        "world_size": env.world_size,
        "healthy": healthy,
        "last_healthy_step": last_healthy,
    }
    if run.sharded:
        weights = {"sharded_state": sharded_state(run.model, run.optimizer, run.checkpoint_keys)}
    else:
        model_state = D.full_model_state(run.model)  # gathered to rank 0 (FSDP2), name-keyed
        if run.checkpoint_keys is not None:
            model_state = {k: v for k, v in model_state.items() if k in run.checkpoint_keys}
        optim_state = D.full_optimizer_state(run.model, run.optimizer)
        weights = {
            "model_state": model_state if env.is_main else None,
            "optimizer_state": optim_state if env.is_main else None,
        }
    path = save_checkpoint(
        run.run_dir,
        run.step,
        **weights,
        trainer_state=trainer_state,
        rng_state=capture_rng_state(),
        config=run.cfg,
        extra_files=run.task.checkpoint_files(),
        rank=env.rank,
        world_size=env.world_size,
        barrier=lambda: D.barrier(env),
        keep=run.cfg.train.keep,
        protect={last_healthy} if last_healthy is not None else set(),
        before_commit=kill_self if faults.kills_during_save(run.step) else None,
    )
    run.last_healthy_step, run.skips_at_last_save = last_healthy, run.guard.total
    note = (
        ""
        if healthy
        else " (saved after skipped steps; "
        + (
            f"step {last_healthy} stays as the newest healthy one)"
            if last_healthy is not None
            else "none is healthy yet)"
        )
    )
    run.logger.message(f"step {run.step}: checkpoint {path}{note}")
    faults.maybe_kill_after_save(run.step)
    return path


def _unfit_to_save(run: Run) -> str | None:
    """Why the current weights must not be checkpointed (agreed over ranks), or None."""
    if run.guard.consecutive:
        return (
            f"the current weights gave a non-finite loss or gradient ({run.guard.consecutive} "
            "consecutive skipped step(s))"
        )
    bad = nonfinite_tensors(dict(run.raw_model.named_parameters()))
    if D.all_reduce(torch.tensor([float(len(bad))], device=run.env.device), run.env, "sum").item():
        return f"the weights hold NaN or inf values ({'; '.join(bad[:3]) or 'on another rank'})"
    return None


# =========================================================================== evaluate


def evaluate(run: Run) -> dict:
    """The task's final evaluation on the whole validation split, a sample,
    summary.json and loss_curve.png (rank 0 writes)."""
    unit = run.task.unit
    summary = {
        "task": run.cfg.task,
        "run_dir": str(run.run_dir),
        "step": run.step,
        f"{unit}_seen": run.seen,
        "skipped_steps": run.guard.total,
        "world_size": run.env.world_size,
        f"train_{unit}_per_s": run.train_count / run.train_seconds if run.train_seconds else None,
        "parameters": num_parameters(run.raw_model),
    }
    if run.stop == STOP_PREEMPT:  # exit promptly: the checkpoint is written, evaluation can wait
        summary["stopped"] = "SIGTERM"
        return summary
    if run.stop == STOP_BUDGET:
        summary["stopped"] = "time budget"
    metrics = _validate(run, final=True)
    sample = _sample(run)
    extras = run.task.summary(_eval_model(run), metrics)
    summary.update({f"val_{k}": v for k, v in metrics.items()}, sample=sample, **extras)
    if run.env.is_main:
        summary["wall_time_s"] = time.perf_counter() - run.t_start
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        run.logger.message(
            f"final validation {run.task.format_metrics({**metrics, **extras})}; step {run.step}, "
            f"{summary[f'train_{unit}_per_s'] or 0:,.0f} train {unit}/s, wall time {summary['wall_time_s']:.0f} s"
        )
        run.logger.close()
        run.logger.plot()
    return summary
