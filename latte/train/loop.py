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
import os
import signal
import time

from latte.files import atomic_write
from latte.models import num_parameters
from latte.train import distributed as D
from latte.train.config import RunConfig
from latte.train.metrics import process_walls
from latte.train.schedule import lr_at
from latte.train.setup import Run, setup
from latte.train.step import STOP_BUDGET, STOP_PREEMPT, train_step


def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the job described by `cfg`; returns the summary dict."""
    t_start = time.perf_counter()
    env = D.init_distributed()
    run, clean = None, False
    try:
        run = setup(cfg, env)
        run.clock.t_start = run.progress.t_start = t_start
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
    t, progress = run.cfg.train, run.progress
    previous = signal.signal(signal.SIGTERM, _on_sigterm(run))
    try:
        while progress.step < t.steps and not run.stop.agreed:
            _one_step(run)
            done = progress.step >= t.steps or bool(run.stop.agreed)
            if run.clock.probe_due(PROBE_AFTER) and t.time_budget_minutes and not done:
                _probe_eval(run)
            if progress.step in t.eval_whole_at and not done:
                _validate_whole(run)
            elif _due(progress.step, t.eval_every) and not done:  # the final validation is in `evaluate`
                _validate(run, final=False)
            if _due(progress.step, t.sample_every) and not done:
                _sample(run)
            if _due(progress.step, t.save_every) or done:
                run.checkpointer.save(progress.step)
        if run.stop.agreed:
            predicted = run.clock.predicted_final_s
            why = (
                "SIGTERM received (preemption)"
                if run.stop.agreed == STOP_PREEMPT
                else f"leaving time for the final validation within train.time_budget_minutes={t.time_budget_minutes:g}"
                + (f" (predicted to take {predicted:.0f} s)" if predicted is not None else "")
            )
            run.logger.message(f"stopped cleanly after step {progress.step}: {why}")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def _on_sigterm(run: Run):
    def handler(signum, frame):  # finish the step, checkpoint, exit 0
        run.stop.requested = STOP_PREEMPT

    return handler


def _one_step(run: Run) -> None:
    cfg, env, progress, clock = run.cfg, run.env, run.progress, run.clock
    o = cfg.optim
    first_sample = run.data.batches.sample_index
    batch = next(run.data.batches)
    lr = lr_at(
        progress.step,
        base_lr=o.lr,
        warmup_steps=o.warmup_steps,
        total_steps=cfg.train.steps,
        decay=o.decay,
        min_lr_ratio=o.min_lr_ratio,
    )
    run.hooks.before_step(progress.step)
    if clock.out_of_time(cfg.train.time_budget_minutes, lambda: run.task.eval_size(final=True)):
        run.stop.requested = max(run.stop.requested, STOP_BUDGET)
    t0 = time.perf_counter()
    result = train_step(
        run.weights.step_model,
        run.weights.optimizer,
        batch,
        task=run.task,
        lr=lr,
        env=env,
        grad_accum=o.grad_accum,
        grad_clip=o.grad_clip,
        precision=cfg.train.precision,
        stop=run.stop.requested,
        loss_hook=run.hooks.loss_hook(progress.step),
    )
    seconds = time.perf_counter() - t0
    batch_text = f"global samples [{first_sample}, {first_sample + cfg.train.global_batch_size})"
    run.logger.train_step(progress.step + 1, result, lr, seconds, time.perf_counter() - clock.t_start)
    run.guard.update(result, progress.step, batch_text)  # raises NonFiniteError (raise mode / cap)
    progress.step += 1
    progress.seen += result.count
    clock.step_done(result.count, seconds)
    # agreed over ranks: all stop after this same step. A request that came
    # during the step (after its collective) is carried by the next step's;
    # a single process needs no agreement and stops after this one.
    run.stop.agreed = result.stop if env.is_distributed else max(result.stop, run.stop.requested)


# A budgeted run times one validation batch after each step of its process from
# this one on (the first step carries the warm-up) until `state.PROBE_BATCHES` are
# timed, unless a validation has measured the evaluation speed already.
PROBE_AFTER = 2


def _probe_eval(run: Run) -> None:
    """Times the task's evaluation on one global batch (forward only, nothing
    logged) beside the step just taken; `Clock.out_of_time` estimates the
    final evaluation from the median of these. Every rank calls it at the
    same step (evaluation may be collective)."""
    t = run.cfg.train
    batches, t.eval_batches = t.eval_batches, 1
    try:
        t0 = time.perf_counter()
        run.task.evaluate(_eval_model(run), final=False)
        seconds = time.perf_counter() - t0
        size = run.task.eval_size(final=False)
    finally:
        t.eval_batches = batches
    run.clock.probe_done(size, seconds)


def _eval_model(run: Run):
    """FSDP2 forwards are collective: every rank runs the wrapped model in
    lockstep; otherwise the plain module (no DDP hooks) on each rank."""
    return run.weights.model if run.task.lockstep else run.weights.raw_model


def _validate(run: Run, *, final: bool) -> dict:
    t0 = time.perf_counter()
    metrics = run.task.evaluate(_eval_model(run), final=final)
    seconds = time.perf_counter() - t0
    run.clock.eval_done(run.task.eval_size(final=final), seconds)
    run.logger.validation(run.progress.step, metrics, run.task.format_metrics(metrics))
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
        run.logger.sample(run.progress.step, text)
    return text


# =========================================================================== evaluate


def evaluate(run: Run) -> dict:
    """The task's final evaluation on the whole validation split, a sample,
    summary.json and loss_curve.png (rank 0 writes)."""
    unit, clock = run.task.unit, run.clock
    summary = {
        "task": run.cfg.task,
        "run_dir": str(run.run_dir),
        "step": run.progress.step,
        f"{unit}_seen": run.progress.seen,
        "skipped_steps": run.guard.total,
        "world_size": run.env.world_size,
        f"train_{unit}_per_s": clock.train_count / clock.train_seconds if clock.train_seconds else None,
        "parameters": num_parameters(run.weights.raw_model),
    }
    if run.stop.agreed == STOP_PREEMPT:  # exit promptly: the checkpoint is written, evaluation can wait
        summary["stopped"] = "SIGTERM"
        return summary
    if run.stop.agreed == STOP_BUDGET:
        summary["stopped"] = "time budget"
    metrics = _validate(run, final=True)
    sample = _sample(run)
    extras = run.task.summary(_eval_model(run), metrics)
    summary.update({f"val_{k}": v for k, v in metrics.items()}, sample=sample, **extras)
    if run.env.is_main:
        summary.update(_wall_times(run))
        atomic_write(run.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        resumed = "" if run.progress.wall_before == 0 else f" ({summary['process_wall_time_s']:.0f} s in this process)"
        run.logger.message(
            f"final validation {run.task.format_metrics({**metrics, **extras})}; step {run.progress.step}, "
            f"{summary[f'train_{unit}_per_s'] or 0:,.0f} train {unit}/s, "
            f"wall time {summary['wall_time_s']:.0f} s{resumed}"
        )
        note = budget_note(summary, run.cfg.train.steps, run.cfg.train.time_budget_minutes)
        if note:
            run.logger.message(note)
        run.logger.close()
        run.logger.plot()
    return summary


def _wall_times(run: Run) -> dict:
    """wall_time_s: the run's, over every process that trained it (each up
    to its last checkpoint, then this one to the end); process_wall_time_s:
    this process's. A run resumed from a checkpoint older than trainer_state's
    "wall_s" has its earlier processes estimated from metrics.csv."""
    process = time.perf_counter() - run.clock.t_start
    walls = {"process_wall_time_s": process}
    if run.progress.wall_before is not None:
        return {"wall_time_s": run.progress.wall_before + process, **walls}
    start = run.progress.step - run.clock.session_steps
    earlier = sum(process_walls(run.run_dir / "metrics.csv", start))
    return {"wall_time_s": earlier + process, "wall_time_estimated": True, **walls}


def budget_note(summary: dict, steps: int, minutes: float | None) -> str | None:
    """What to do when the time budget cut training so short that the model
    ends no better than unigram statistics (None otherwise): the usual cause
    is a machine busy with other work, which the train speed and load show."""
    ppl, unigram = summary.get("val_ppl"), summary.get("unigram_ppl")
    if summary.get("stopped") != "time budget" or ppl is None or unigram is None or ppl < unigram:
        return None
    speed = summary.get("train_tokens_per_s") or 0
    return (
        f"note: perplexity {ppl:.2f} is no better than the unigram baseline {unigram:.2f}: "
        f"train.time_budget_minutes={minutes:g} allowed {summary['step']} of {steps} steps at {speed:,.0f} "
        f"train tokens/s (1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores). "
        "A machine busy with other work is the usual cause: rerun when it is quiet, or raise the budget."
    )
