"""`latte train`: setup, fit, evaluate. Reads top to bottom.

    setup     seed, threads, process group, run folder, checkpoint to resume,
              tokenizer (saved into the run folder), data, model, optimizer,
              loader position, RNG
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
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latte.config_io import build, save_yaml, to_dict
from latte.data import (SampleLoader, TokenWindows, load_documents, load_tokenizer, pack_documents,
                        split_documents, train_bpe, unigram_perplexity)
from latte.eval.perplexity import nll_sums, subset, summarize
from latte.models import LatteForCausalLM, num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import (MANIFEST, check_state_against, find_latest_checkpoint, load_checkpoint,
                                    save_checkpoint, verify_checkpoint)
from latte.train.rng import capture_rng_state, restore_rng_state
from latte.train.config import ARCHITECTURE_FIELDS, RunConfig, check_world_size
from latte.train.faults import Faults, kill_self
from latte.train.metrics import NullLogger, RunLogger
from latte.train.schedule import lr_at
from latte.train.step import STOP_BUDGET, STOP_NONE, STOP_PREEMPT, SkipGuard, train_step

log = logging.getLogger("latte.train")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.tiktoken")


@dataclass
class Run:
    """Everything `fit` and `evaluate` need, built by `setup`."""

    cfg: RunConfig
    env: D.DistEnv
    run_dir: Path
    tokenizer: object
    tokenizer_file: Path
    train_windows: TokenWindows
    val_windows: TokenWindows
    model: nn.Module  # wrapped (DDP / FSDP2) when distributed
    optimizer: torch.optim.Optimizer
    loader: SampleLoader
    guard: SkipGuard
    logger: RunLogger | NullLogger
    faults: Faults
    step: int = 0  # optimizer steps completed (skipped ones included)
    tokens_seen: int = 0
    t_start: float = 0.0
    train_seconds: float = 0.0  # spent in optimizer steps this session
    train_tokens: int = 0  # tokens of those steps
    recent_tokens_per_s: float = 0.0  # moving average of the last steps
    eval_speedup: float = 3.0  # validation tokens/s over training tokens/s (forward only), measured
    stop_request: int = STOP_NONE  # what THIS rank asks for (SIGTERM, time budget)
    stop: int = STOP_NONE  # agreed by all ranks: stop after the current step

    @property
    def raw_model(self) -> nn.Module:
        return D.unwrap(self.model)


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


# =========================================================================== setup

def setup(cfg: RunConfig, env: D.DistEnv) -> Run:
    check_world_size(cfg, env.world_size)
    _seed_everything(cfg.train.seed)
    _set_threads(cfg.train.num_threads, env)
    run_dir = Path(cfg.train.run_dir).expanduser()
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    D.barrier(env)

    ckpt_path = D.broadcast_object(_checkpoint_to_resume(cfg, run_dir) if env.is_main else None, env)
    ckpt = load_checkpoint(ckpt_path, verify=False) if ckpt_path else None  # verified on rank 0 above
    if ckpt is not None:
        _compare_configs(ckpt.config, cfg, ckpt.path, env)
    if env.is_main:
        save_yaml(cfg, run_dir / "config.yaml")

    train_docs, val_docs = split_corpus(cfg)
    tokenizer, tokenizer_file = _tokenizer(cfg, train_docs, run_dir, ckpt, env)
    train_windows, val_windows = _data(cfg, train_docs, val_docs, tokenizer, env)
    vocab_size = cfg.model.vocab_size or tokenizer.vocab_size
    for name, w in (("train split", train_windows), ("validation split", val_windows)):
        w.check_ids(vocab_size, where=f"{cfg.data.source} {name}")  # before any compute

    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank (FSDP2 shards them)
    model = LatteForCausalLM(cfg.model.to_latte_config(vocab_size)).to(env.device)
    no_decay = _no_decay_names(model)
    if ckpt is not None:
        check_state_against(model.state_dict(), ckpt.model_state, where=str(ckpt.path))
    model = D.wrap_model(model, cfg.train.distributed, env)
    optimizer = _adamw(model, no_decay, cfg)

    state = {"step": 0, "tokens_seen": 0, "sample_index": 0, "skipped_steps": 0, "consecutive_skips": 0}
    if ckpt is not None:
        D.load_full_state(model, optimizer, ckpt.model_state, ckpt.optimizer_state)
        _apply_optim_hparams(optimizer, cfg)  # the config wins over the saved param_groups
        state.update(ckpt.trainer_state)
    loader = SampleLoader(train_windows, global_batch_size=cfg.train.global_batch_size, rank=env.rank,
                          world_size=env.world_size, seed=cfg.train.seed, start_index=state["sample_index"])
    _restore_rng(ckpt, cfg, env, state["step"])
    del ckpt  # the loaded tensors now live in the model and optimizer

    logger = (RunLogger(run_dir, start_step=state["step"], total_steps=cfg.train.steps,
                        log_every=cfg.train.log_every, tensorboard=cfg.train.tensorboard)
              if env.is_main else NullLogger())
    run = Run(cfg, env, run_dir, tokenizer, tokenizer_file, train_windows, val_windows, model, optimizer,
              loader, SkipGuard(cfg.train.on_nonfinite, cfg.train.max_consecutive_skips,
                                total=state["skipped_steps"], consecutive=state["consecutive_skips"]),
              logger, Faults.from_env(), step=state["step"], tokens_seen=state["tokens_seen"])
    logger.message(_describe(run, ckpt_path))
    return run


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _set_threads(num_threads: int | None, env: D.DistEnv) -> None:
    if num_threads is None and env.is_distributed and env.device.type == "cpu":
        num_threads = max(1, (os.cpu_count() or 1) // env.local_world_size)  # ranks share the cores
    if num_threads is not None:
        torch.set_num_threads(num_threads)


def _checkpoint_to_resume(cfg: RunConfig, run_dir: Path) -> Path | None:
    """resume: "auto" -> newest verified step in run_dir (None: fresh start);
    "never" -> None, refusing a run_dir that already holds checkpoints; a path
    -> that step folder (verified) or the newest verified step of that run."""
    resume = cfg.train.resume
    if resume == "auto":
        return find_latest_checkpoint(run_dir)
    if resume == "never":
        committed = sorted(p.name for p in run_dir.glob("step-*") if (p / MANIFEST).is_file())
        if committed:
            raise ValueError(f"train.resume='never' but {run_dir} already holds checkpoints "
                             f"({', '.join(committed[-2:])}); use resume: auto or a new train.run_dir")
        return None
    path = Path(resume).expanduser()
    if (path / MANIFEST).is_file():
        verify_checkpoint(path)
        return path
    found = find_latest_checkpoint(path) if path.is_dir() else None
    if found is None:
        raise ValueError(f"train.resume={resume!r}: not a checkpoint folder, nor a run folder "
                         "holding a verified checkpoint")
    return found


def _compare_configs(saved: dict, cfg: RunConfig, where: Path, env: D.DistEnv) -> None:
    """Architecture fields must match the checkpoint (ValueError naming all of
    them); any other change is allowed with a warning."""
    try:
        old = to_dict(build(RunConfig, saved, where=f"{where}/config.yaml"))
    except ValueError as e:
        raise ValueError(f"{where}: the saved config no longer validates, cannot resume from it:\n{e}") from None
    new = to_dict(cfg)
    errors, changed = [], []
    for section in new:
        for key, value in new[section].items():
            if old[section].get(key) == value or (section, key) == ("train", "resume"):
                continue
            line = f"{section}.{key}: checkpoint {old[section].get(key)!r}, config {value!r}"
            arch = (section == "model" and key in ARCHITECTURE_FIELDS) or \
                   (section == "data" and key in ("tokenizer", "vocab_size"))
            (errors if arch else changed).append(line)
    if errors:
        raise ValueError(f"cannot resume from {where}: the config changes the model architecture "
                         f"({len(errors)} field{'s' * (len(errors) > 1)}):\n  " + "\n  ".join(errors)
                         + "\nstart a new train.run_dir (or set train.resume: never) to train this config")
    if changed and env.is_main:
        log.warning("resuming from %s with a changed config:\n  %s", where, "\n  ".join(changed))


def _tokenizer(cfg: RunConfig, train_docs, run_dir: Path, ckpt, env: D.DistEnv):
    """The checkpoint's tokenizer when resuming; else train a BPE on the
    training split ("bpe") or load the given file. Rank 0 obtains it and
    writes it into run_dir; the other ranks read that copy."""
    if env.is_main:
        if ckpt is not None:
            saved = [ckpt.path / n for n in TOKENIZER_FILES if (ckpt.path / n).is_file()]
            if not saved:
                raise ValueError(f"{ckpt.path}: holds no tokenizer file ({' or '.join(TOKENIZER_FILES)})")
            tok = load_tokenizer(saved[0])
        elif cfg.data.tokenizer == "bpe":
            t0 = time.perf_counter()
            tok = train_bpe((d.text for d in train_docs), vocab_size=cfg.data.vocab_size)
            print(f"trained a {tok.vocab_size}-token BPE on the training split in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        else:
            tok = load_tokenizer(cfg.data.tokenizer)
        path = tok.save(run_dir)
    D.barrier(env)
    path = D.broadcast_object(str(path) if env.is_main else None, env)
    return (tok if env.is_main else load_tokenizer(path)), Path(path)


def split_corpus(cfg: RunConfig):
    """(train documents, validation documents) of data.source."""
    docs = load_documents(cfg.data.source, text_field=cfg.data.text_field)
    chars = sum(len(d.text) for d in docs)
    if chars == 0:
        raise ValueError(f"data.source={cfg.data.source!r} is empty: {len(docs)} document(s), 0 characters")
    return split_documents(docs, val_fraction=cfg.data.val_fraction, seed=cfg.data.split_seed)


def pack_split(cfg: RunConfig, tokenizer, split: str):
    """The packed tokens (memmap) of the "train" or "validation" split."""
    train_docs, val_docs = split_corpus(cfg)
    docs = train_docs if split == "train" else val_docs
    return pack_documents(docs, tokenizer, cache_dir=Path(cfg.data.cache_dir).expanduser())


def _data(cfg: RunConfig, train_docs, val_docs, tokenizer, env: D.DistEnv) -> tuple[TokenWindows, TokenWindows]:
    """Packed token windows of both splits. Rank 0 packs (and caches) first;
    the others then open the cached memmaps. Refuses a corpus too short for
    one window per split, with the counts."""
    def pack() -> dict:
        cache = Path(cfg.data.cache_dir).expanduser()
        return {"train": pack_documents(train_docs, tokenizer, cache_dir=cache),
                "validation": pack_documents(val_docs, tokenizer, cache_dir=cache)}

    splits = pack() if env.is_main else None
    D.barrier(env)
    splits = splits or pack()  # ranks > 0: cache hits
    need = cfg.data.seq_len + 1
    counts = {name: (len(splits[name]), len(docs)) for name, docs in (("train", train_docs), ("validation", val_docs))}
    if min(n for n, _ in counts.values()) < need:
        raise ValueError(
            f"corpus too short for data.seq_len={cfg.data.seq_len} (one window needs {need} tokens per split): "
            + ", ".join(f"the {name} split has {n} tokens in {d} document(s)" for name, (n, d) in counts.items())
            + f" (data.source={cfg.data.source!r}); use a larger corpus, a smaller seq_len or another val_fraction")
    return TokenWindows(splits["train"], cfg.data.seq_len), TokenWindows(splits["validation"], cfg.data.seq_len)


def _no_decay_names(model: nn.Module) -> set[str]:
    """Names of parameters without weight decay: norms, biases (anything
    below 2-D) and embeddings (GPT-2 / nanoGPT practice)."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {n for n, p in model.named_parameters() if p.ndim < 2 or id(p) in embedding_ids}


def _adamw(model: nn.Module, no_decay: set[str], cfg: RunConfig) -> torch.optim.Optimizer:
    decay, plain = [], []
    for name, p in model.named_parameters():  # DDP prefixes "module."; FSDP2 keeps the names
        (plain if name.removeprefix("module.") in no_decay else decay).append(p)
    o = cfg.optim
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=o.betas, eps=o.eps)


def _apply_optim_hparams(optimizer: torch.optim.Optimizer, cfg: RunConfig) -> None:
    for group, wd in zip(optimizer.param_groups, (cfg.optim.weight_decay, 0.0)):
        group.update(betas=cfg.optim.betas, eps=cfg.optim.eps, weight_decay=wd)


def _restore_rng(ckpt, cfg: RunConfig, env: D.DistEnv, step: int) -> None:
    """Per-rank streams (dropout differs between ranks). Resuming: the saved
    state of this rank, or a fresh seed for a rank the saving run lacked."""
    saved = ckpt.rng_state(env.rank) if ckpt is not None else None
    if saved is not None:
        restore_rng_state(saved)
    else:
        _seed_everything(cfg.train.seed * 1_000_003 + 7919 * env.rank + step)


def _describe(run: Run, ckpt_path) -> str:
    c, env = run.cfg, run.env
    n = num_parameters(run.raw_model)
    how = f"resuming from {ckpt_path} (step {run.step})" if ckpt_path else "starting fresh"
    return (f"run {run.run_dir}: {how}; model {c.model.mixer} dim {c.model.dim} x {c.model.num_layers} layers, "
            f"{n / 1e6:.2f}M parameters; vocab {run.tokenizer.vocab_size}; train {len(run.train_windows.tokens):,} "
            f"tokens, validation {len(run.val_windows.tokens):,} tokens; {env.world_size} rank(s) "
            f"({c.train.distributed if env.is_distributed else 'single process'}), {torch.get_num_threads()} threads; "
            f"batch {c.train.global_batch_size} x {c.data.seq_len} tokens")


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
