"""`latte train`: setup, fit, evaluate. Reads top to bottom.

    setup     (train/setup.py) seed, threads, process group, run folder,
              checkpoint to resume, tokenizer (saved into the run folder),
              data, model, optimizer, loader position, RNG
    fit       optimizer steps (`step.train_step`), logging, validation,
              samples, checkpoints; stops cleanly on SIGTERM / time budget
    evaluate  the whole validation split against the unigram baseline of the
              same tokenizer, a sample, summary.json, the loss-curve PNG

Only rank 0 logs and writes unsharded files; every metric is a sum with its
token count over ranks. Exact resume: lr is a pure function of the step, the
data position is one global sample index, RNG is restored per rank, and the
optimizer is saved with the weights (RELIABILITY.md).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path

import torch

from latte.data import unigram_perplexity
from latte.eval.perplexity import nll_sums, subset, summarize
from latte.models import num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import save_checkpoint
from latte.train.config import RunConfig
from latte.train.faults import kill_self
from latte.train.rng import capture_rng_state
from latte.train.schedule import lr_at
from latte.train.setup import Run, setup
from latte.train.step import STOP_BUDGET, STOP_PREEMPT, train_step

log = logging.getLogger("latte.train")

def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the job described by `cfg`; returns the summary dict."""
    t_start = time.perf_counter()
    env = D.init_distributed()
    try:
        run = setup(cfg, env)
        run.t_start = t_start
        fit(run)
        return evaluate(run)
    finally:
        D.shutdown(env)



# =========================================================================== fit

def fit(run: Run) -> None:
    """Optimizer steps until train.steps, a stop request or a non-finite cap."""
    t = run.cfg.train
    previous = signal.signal(signal.SIGTERM, _on_sigterm(run))
    try:
        while run.step < t.steps and not run.stop:
            _one_step(run)
            done = run.step >= t.steps or bool(run.stop)
            if _due(run.step, t.eval_every) and not done:  # the final validation is in `evaluate`
                _validate(run, periodic=True)
            if _due(run.step, t.sample_every) and not done:
                _sample(run)
            if _due(run.step, t.save_every) or done:
                save(run)
        if run.stop:
            why = ("SIGTERM received (preemption)" if run.stop == STOP_PREEMPT
                   else f"leaving time for the final validation within train.time_budget_minutes="
                        f"{t.time_budget_minutes:g}")
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
    first_sample = run.loader.sample_index
    input_ids, labels = next(run.loader)
    lr = lr_at(run.step, base_lr=o.lr, warmup_steps=o.warmup_steps, total_steps=cfg.train.steps,
               decay=o.decay, min_lr_ratio=o.min_lr_ratio)
    run.faults.maybe_sigterm(run.step)
    if _out_of_time(run):
        run.stop_request = max(run.stop_request, STOP_BUDGET)
    t0 = time.perf_counter()
    result = train_step(run.model, run.optimizer, input_ids, labels, lr=lr, env=env,
                        grad_accum=o.grad_accum, grad_clip=o.grad_clip, precision=cfg.train.precision,
                        stop=run.stop_request, inject_nan=run.faults.nan_loss(run.step, env.rank))
    seconds = time.perf_counter() - t0
    batch = f"global samples [{first_sample}, {first_sample + cfg.train.global_batch_size})"
    run.guard.update(result, run.step, batch)  # raises NonFiniteError (raise mode / cap)
    run.step += 1
    run.tokens_seen += result.tokens
    run.train_seconds += seconds
    run.train_tokens += result.tokens
    tps = result.tokens / max(seconds, 1e-9)
    run.recent_tokens_per_s = tps if not run.recent_tokens_per_s else 0.7 * run.recent_tokens_per_s + 0.3 * tps
    run.stop = result.stop  # agreed over ranks: all stop after this same step
    run.logger.train_step(run.step, result, lr, seconds, time.perf_counter() - run.t_start)


def _out_of_time(run: Run) -> bool:
    """train.time_budget_minutes bounds the WHOLE job: stop training while
    there is still time for this step, its checkpoint and the final
    validation, estimated from the current training speed (which also tracks
    a machine that got busier) and the measured validation/training ratio."""
    budget = run.cfg.train.time_budget_minutes
    if budget is None:
        return False
    left = 60 * budget - (time.perf_counter() - run.t_start)
    if left <= 0 or not run.recent_tokens_per_s:
        return left <= 0
    step_s = run.cfg.train.global_batch_size * run.cfg.data.seq_len / run.recent_tokens_per_s
    final_eval_s = len(run.val_windows) * run.val_windows.seq_len / (run.eval_speedup * run.recent_tokens_per_s)
    return left < 1.25 * (step_s + final_eval_s) + 5.0  # margin: checkpoint, sample, jitter


def _validate(run: Run, *, periodic: bool) -> dict:
    """Validation loss / perplexity summed over ranks. Periodic ones read the
    first train.eval_batches global batches; the final one the whole split."""
    cfg, env = run.cfg, run.env
    max_windows = cfg.train.eval_batches * cfg.train.global_batch_size if periodic else 0
    windows = subset(run.val_windows, max_windows)
    fsdp = env.is_distributed and cfg.train.distributed == "fsdp2"
    model = run.model if fsdp else run.raw_model  # FSDP2 forwards are collective: all ranks, lockstep
    t0 = time.perf_counter()
    total, count = nll_sums(model, windows, batch_size=max(1, cfg.train.global_batch_size // env.world_size),
                            rank=env.rank, world_size=env.world_size, device=env.device, lockstep=fsdp)
    sums = D.all_reduce(torch.tensor([total, float(count)], dtype=torch.float64, device=env.device), env, "sum")
    metrics = summarize(float(sums[0]), int(sums[1]), time.perf_counter() - t0)
    if run.recent_tokens_per_s and metrics["tokens_per_s"]:
        run.eval_speedup = metrics["tokens_per_s"] / run.recent_tokens_per_s
    run.logger.validation(run.step, metrics)
    return metrics


def _sample(run: Run) -> str:
    """A short generation from train.sample_prompt, with its own seeded
    generator (the training RNG streams are left untouched)."""
    cfg, env, t = run.cfg, run.env, run.cfg.train
    fsdp = env.is_distributed and cfg.train.distributed == "fsdp2"
    if not (env.is_main or fsdp) or t.sample_tokens == 0:
        return ""
    ids = run.tokenizer.encode(t.sample_prompt) or [run.tokenizer.eos_id]
    g = torch.Generator(device=env.device).manual_seed(t.seed)
    out = (run.model if fsdp else run.raw_model).generate(
        torch.tensor([ids], device=env.device), t.sample_tokens, temperature=t.sample_temperature,
        top_k=t.sample_top_k or None, generator=g)
    text = run.tokenizer.decode(out[0, len(ids):].tolist())
    run.logger.sample(run.step, t.sample_prompt, text)
    return text


# =========================================================================== checkpoints

def save(run: Run) -> Path:
    """A checkpoint of the current step (collective: every rank calls it)."""
    env, faults = run.env, run.faults
    model_state = D.full_model_state(run.model)  # gathered to rank 0 (FSDP2), name-keyed
    optim_state = D.full_optimizer_state(run.model, run.optimizer)

    def barrier() -> None:
        if faults.kills_during_save(run.step):  # test-only: files written, manifest not yet
            kill_self()
        D.barrier(env)

    trainer_state = {"step": run.step, "tokens_seen": run.tokens_seen, **run.loader.state_dict(),
                     **run.guard.state_dict(), "world_size": env.world_size}
    path = save_checkpoint(
        run.run_dir, run.step, model_state=model_state if env.is_main else {},
        optimizer_state=optim_state if env.is_main else {}, trainer_state=trainer_state,
        rng_state=capture_rng_state(), config=run.cfg, extra_files={run.tokenizer_file.name: run.tokenizer_file},
        rank=env.rank, world_size=env.world_size, barrier=barrier, keep=run.cfg.train.keep)
    run.logger.message(f"step {run.step}: checkpoint {path}")
    faults.maybe_kill_after_save(run.step)
    return path


# =========================================================================== evaluate

def evaluate(run: Run) -> dict:
    """Final validation on the whole split, unigram baseline, a sample,
    summary.json and loss_curve.png (rank 0 writes)."""
    summary = {"run_dir": str(run.run_dir), "step": run.step, "tokens_seen": run.tokens_seen,
               "skipped_steps": run.guard.total, "world_size": run.env.world_size,
               "train_tokens_per_s": run.train_tokens / run.train_seconds if run.train_seconds else None,
               "parameters": num_parameters(run.raw_model)}
    if run.stop == STOP_PREEMPT:  # exit promptly: the checkpoint is written, evaluation can wait
        summary["stopped"] = "SIGTERM"
        run.logger.close()
        return summary
    if run.stop == STOP_BUDGET:
        summary["stopped"] = "time budget"
    val = _validate(run, periodic=False)
    sample = _sample(run)
    summary.update(val_loss=val["loss"], val_ppl=val["ppl"], val_tokens=val["tokens"], sample=sample)
    if run.env.is_main:
        summary["unigram_ppl"] = unigram = unigram_perplexity(
            run.train_windows.tokens, run.val_windows.tokens, run.tokenizer.vocab_size)
        summary["wall_time_s"] = time.perf_counter() - run.t_start
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        run.logger.message(
            f"final validation perplexity {val['ppl']:.2f} (loss {val['loss']:.4f}, {val['tokens']:,} tokens) "
            f"vs unigram baseline {unigram:.2f} with the same tokenizer; step {run.step}, "
            f"{summary['train_tokens_per_s'] or 0:,.0f} train tokens/s, wall time {summary['wall_time_s']:.0f} s")
    run.logger.close()
    if run.env.is_main:
        run.logger.plot()
    return summary
