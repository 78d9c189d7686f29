"""Setup of a `latte train` run: everything `fit` needs, built in order.

    seed, threads, process group, run folder, checkpoint to resume,
    tokenizer (saved into the run folder), data, model, optimizer,
    loader position, RNG

Exact resume depends on this order (RELIABILITY.md): the data position is one
global sample index and RNG is restored per rank after everything else has
consumed its random numbers.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latte.config_io import build, save_yaml, to_dict
from latte.data import (SampleLoader, TokenWindows, load_documents, load_tokenizer, pack_documents,
                        split_documents, train_bpe)
from latte.models import LatteForCausalLM, num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import (MANIFEST, check_state_against, find_latest_checkpoint, load_checkpoint,
                                    verify_checkpoint)
from latte.train.config import ARCHITECTURE_FIELDS, RunConfig, check_world_size
from latte.train.faults import Faults
from latte.train.metrics import NullLogger, RunLogger
from latte.train.rng import restore_rng_state
from latte.train.step import STOP_NONE, SkipGuard

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
