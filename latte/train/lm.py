"""Language modelling, the first task (`task: lm`, the default): a
`LatteForCausalLM` trained on next-token prediction over a text corpus.

    prepare      split the corpus by document, get the tokenizer (trained BPE,
                 a file, or the resumed checkpoint's copy), pack both splits
    batches      fixed windows of data.seq_len + 1 tokens, a resumable
                 global sample index (latte.data.SampleLoader)
    loss         summed next-token loss over the targets (the model's fused
                 head + cross-entropy), counted in tokens
    evaluate     validation loss and perplexity (train/validation.py); the
                 final one on the whole split, with the unigram baseline of
                 the same tokenizer in the summary
    sample       a short generation from train.sample_prompt
    checkpoint   the weights, plus the tokenizer file
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from latte.data import (
    SampleLoader,
    Tokenizer,
    TokenWindows,
    load_documents,
    load_tokenizer,
    pack_documents,
    split_documents,
    train_bpe,
    unigram_perplexity,
)
from latte.data.corpus import source_files
from latte.files import sha256_file
from latte.models import IGNORE_INDEX, LatteForCausalLM, num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint
from latte.train.config import ARCHITECTURE_FIELDS, LMRunConfig
from latte.train.init_from import init_files
from latte.train.task import Batch, Task
from latte.train.validation import nll_sums, packed_rows, subset, summarize

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.tiktoken")


class LanguageModelingTask(Task):
    name = "lm"
    config_class = LMRunConfig
    unit = "tokens"
    cfg: LMRunConfig

    tokenizer: Tokenizer
    tokenizer_file: Path
    train_windows: TokenWindows
    val_windows: TokenWindows

    # ------------------------------------------------------------------ setup

    def prepare(self, run_dir: Path, checkpoint: Checkpoint | None) -> None:
        cfg, env = self.cfg, self.env
        train_docs, val_docs = split_corpus(cfg)
        self.tokenizer, self.tokenizer_file = _tokenizer(cfg, train_docs, run_dir, checkpoint, env)
        self.train_windows, self.val_windows = _data(cfg, train_docs, val_docs, self.tokenizer, env)
        self.caches = cache_files(self.train_windows, self.val_windows)
        for name, w in (("train split", self.train_windows), ("validation split", self.val_windows)):
            w.check_ids(self.vocab_size, where=f"{cfg.data.source} {name}")  # before any compute

    def prepare_inference(self, checkpoint: Checkpoint) -> None:
        self.tokenizer = load_tokenizer(checkpoint_tokenizer(checkpoint))

    @property
    def vocab_size(self) -> int:
        return self.cfg.model.vocab_size or self.tokenizer.vocab_size

    def build_model(self) -> LatteForCausalLM:
        return LatteForCausalLM(self.cfg.model.to_latte_config(self.vocab_size))

    def train_batches(self, start_index: int) -> WindowBatches:
        t = self.cfg.train
        return WindowBatches(
            SampleLoader(
                self.train_windows,
                global_batch_size=t.global_batch_size,
                rank=self.env.rank,
                world_size=self.env.world_size,
                seed=t.seed,
                start_index=start_index,
            )
        )

    def checkpoint_files(self) -> dict[str, Path]:
        return {self.tokenizer_file.name: self.tokenizer_file}

    def architecture_fields(self) -> set[str]:
        return {f"model.{name}" for name in ARCHITECTURE_FIELDS} | {"data.tokenizer", "data.vocab_size"}

    def check_init(self, folder: Path, checkpoint: Checkpoint | None) -> None:
        """train.init_from's tokenizer (the file its checkpoint or export
        holds, when it holds one) must be this run's, byte for byte: the
        embedding rows it starts from are that tokenizer's ids."""
        name = self.tokenizer_file.name
        theirs = checkpoint.file(name) if checkpoint is not None and checkpoint.has(name) else folder / name
        if theirs.is_file() and sha256_file(theirs) != sha256_file(self.tokenizer_file):
            raise ValueError(
                f"train.init_from={self.cfg.train.init_from!r}: {theirs} is not this run's tokenizer "
                f"({self.tokenizer_file}, from data.tokenizer={self.cfg.data.tokenizer!r}): its embeddings would "
                "read other tokens; give the tokenizer it was trained with as data.tokenizer"
            )

    def input_files(self) -> dict[str, Path]:
        """The corpus files, a tokenizer file (data.tokenizer a path), the
        weight files of train.init_from and, once prepared, the packed token
        caches of both splits."""
        files = {f"data.source:{p.resolve()}": p for p in source_files(self.cfg.data.source)}
        tok = tokenizer_path(self.cfg.data.tokenizer)
        if tok is not None:
            files["data.tokenizer"] = tok
        return {**files, **init_files(self.cfg.train.init_from), **getattr(self, "caches", {})}

    # ------------------------------------------------------------------ training

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return summed_loss(model, batch["input_ids"], batch["labels"], eos_id=self.boundary_id)

    @property
    def boundary_id(self) -> int | None:
        """The token that starts a document (data.document_boundaries), else None."""
        return self.tokenizer.eos_id if self.cfg.data.document_boundaries else None

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model: nn.Module, *, final: bool) -> dict[str, float]:
        """Validation loss / perplexity summed over ranks. Periodic ones read
        the first train.eval_batches global batches; the final one the whole split."""
        t, env = self.cfg.train, self.env
        windows = subset(self.val_windows, 0 if final else t.eval_batches * t.global_batch_size)
        t0 = time.perf_counter()
        total, count = nll_sums(
            model,
            windows,
            batch_size=max(1, t.global_batch_size // env.world_size),
            rank=env.rank,
            world_size=env.world_size,
            device=env.device,
            lockstep=self.lockstep,
            eos_id=self.boundary_id,
        )
        total, count = self.sum_over_ranks(total, count)
        m = summarize(total, int(count), time.perf_counter() - t0)
        return {"loss": m["loss"], "ppl": m["ppl"], "tokens": m["tokens"], "tokens_per_s": m["tokens_per_s"]}

    def eval_size(self, *, final: bool) -> int:
        t = self.cfg.train
        windows = subset(self.val_windows, 0 if final else t.eval_batches * t.global_batch_size)
        return len(windows) * windows.seq_len

    def format_metrics(self, m: dict) -> str:
        text = f"perplexity {m['ppl']:.2f} (loss {m['loss']:.4f}, {m['tokens']:,} tokens"
        text += f", {m['tokens_per_s']:,.0f} tok/s)" if "tokens_per_s" in m else ")"
        if "unigram_ppl" in m:
            text += f" vs unigram baseline {m['unigram_ppl']:.2f} with the same tokenizer"
        return text

    def sample(self, model: nn.Module) -> str | None:
        """A short generation from train.sample_prompt, with its own seeded
        generator (the training RNG streams are left untouched). None when
        the weights are not finite (nothing sensible to sample from)."""
        t = self.cfg.train
        if t.sample_tokens == 0:
            return None
        raw = D.unwrap(model)
        if not all(bool(torch.isfinite(getattr(p, "_local_tensor", p)).all()) for p in raw.parameters()):
            return f"{t.sample_prompt}(no sample: the weights hold NaN or inf values)"
        ids = self.tokenizer.encode(t.sample_prompt) or [self.tokenizer.eos_id]
        g = torch.Generator(device=self.env.device).manual_seed(t.seed)
        out = raw.generate(
            torch.tensor([ids], device=self.env.device),
            t.sample_tokens,
            temperature=t.sample_temperature,
            top_k=t.sample_top_k or None,
            generator=g,
        )
        return t.sample_prompt + self.tokenizer.decode(out[0, len(ids) :].tolist())

    def summary(self, model: nn.Module, metrics: dict) -> dict:
        if not self.env.is_main:
            return {}
        return {
            "train_tokens": len(self.train_windows.tokens),  # epochs = tokens_seen / train_tokens
            "unigram_ppl": unigram_perplexity(
                self.train_windows.tokens, self.val_windows.tokens, self.tokenizer.vocab_size
            ),
        }

    def describe(self, model: nn.Module) -> str:
        c = self.cfg
        return (
            f"model {c.model.mixer} dim {c.model.dim} x {c.model.num_layers} layers, "
            f"{num_parameters(D.unwrap(model)) / 1e6:.2f}M parameters; vocab {self.tokenizer.vocab_size}; "
            f"train {len(self.train_windows.tokens):,} tokens, validation {len(self.val_windows.tokens):,} "
            f"tokens; batch {c.train.global_batch_size} x {c.data.seq_len} tokens"
        )


class WindowBatches:
    """SampleLoader's (input_ids, labels) pairs as task batches."""

    def __init__(self, loader: SampleLoader):
        self.loader = loader

    @property
    def sample_index(self) -> int:
        return self.loader.sample_index

    def __iter__(self) -> WindowBatches:
        return self

    def __next__(self) -> Batch:
        input_ids, labels = next(self.loader)
        return {"input_ids": input_ids, "labels": labels}


def summed_loss(
    model: nn.Module, input_ids_BT: torch.Tensor, labels_BT: torch.Tensor, *, eos_id: int | None = None
) -> torch.Tensor:
    """Sum of the next-token losses (float32) for labels that are ALREADY
    shifted (labels[:, t] is the token after input_ids[:, t]), so they are
    given as shift_labels (labels would be shifted a second time); -100 is
    ignored. The model computes the mean with its fused head +
    cross-entropy (no [B, T, V] logits) inside its forward, so that DDP and
    FSDP2 see one ordinary forward; times the target count it is the sum.
    eos_id: the windows as one packed row of documents (`packed_rows`), so
    no token attends across a document boundary."""
    count = (labels_BT != IGNORE_INDEX).sum()
    if eos_id is None:
        mean = model(input_ids_BT, shift_labels=labels_BT, return_logits=False).loss
    else:
        ids, cu_seqlens = packed_rows(input_ids_BT, eos_id)
        mean = model(ids, shift_labels=labels_BT.reshape(1, -1), return_logits=False, cu_seqlens=cu_seqlens).loss
    return mean * count.clamp(min=1)


# --------------------------------------------------------------------------- data and tokenizer


def checkpoint_tokenizer(checkpoint: Checkpoint) -> Path:
    """The tokenizer file of a checkpoint (verified against its manifest)."""
    for name in TOKENIZER_FILES:
        if checkpoint.has(name):
            return checkpoint.file(name)
    raise ValueError(
        f"{checkpoint.path}: holds no tokenizer file listed in its manifest ({' or '.join(TOKENIZER_FILES)})"
    )


def _tokenizer(cfg: LMRunConfig, train_docs, run_dir: Path, ckpt: Checkpoint | None, env: D.DistEnv):
    """The checkpoint's tokenizer when resuming; else train a BPE on the
    training split ("bpe") or load the given file. Rank 0 obtains it and
    writes it into run_dir; the other ranks read that copy."""
    if env.is_main:
        if ckpt is not None:
            tok = load_tokenizer(checkpoint_tokenizer(ckpt))
        elif cfg.data.tokenizer == "bpe":
            t0 = time.perf_counter()
            tok = train_bpe((d.text for d in train_docs), vocab_size=cfg.data.vocab_size)
            print(
                f"trained a {tok.vocab_size}-token BPE on the training split in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
            )
        else:
            tok = load_tokenizer(cfg.data.tokenizer)
        path = tok.save(run_dir)
    D.barrier(env)
    path = D.broadcast_object(str(path) if env.is_main else None, env)
    return (tok if env.is_main else load_tokenizer(path)), Path(path)


def tokenizer_path(tokenizer: str) -> Path | None:
    """The file `load_tokenizer(tokenizer)` reads (None for "bpe", "base"
    or a path that names none: loading says why)."""
    path = Path(tokenizer).expanduser()
    if tokenizer in ("bpe", "base") or not path.exists():
        return None
    if path.is_dir():
        found = (
            [path / TOKENIZER_FILES[0]] if (path / TOKENIZER_FILES[0]).is_file() else sorted(path.glob("*.tiktoken"))
        )
        return found[0] if len(found) == 1 else None
    return path


def cache_files(train: TokenWindows, val: TokenWindows) -> dict[str, Path]:
    """The packed token files both splits were read from (memmaps of the cache)."""
    out = {}
    for name, windows in (("train", train), ("validation", val)):
        tokens = windows.tokens
        while tokens is not None and not isinstance(tokens, np.memmap):  # a view of the memmap
            tokens = getattr(tokens, "base", None)
        if tokens is not None and tokens.filename:
            out[f"cache:{name}"] = Path(tokens.filename)
    return out


def split_corpus(cfg: LMRunConfig):
    """(train documents, validation documents) of data.source."""
    docs = load_documents(cfg.data.source, text_field=cfg.data.text_field)
    chars = sum(len(d.text) for d in docs)
    if chars == 0:
        raise ValueError(f"data.source={cfg.data.source!r} is empty: {len(docs)} document(s), 0 characters")
    return split_documents(docs, val_fraction=cfg.data.val_fraction, seed=cfg.data.split_seed)


def pack_split(cfg: LMRunConfig, tokenizer, split: str):
    """The packed tokens (memmap) of the "train" or "validation" split."""
    train_docs, val_docs = split_corpus(cfg)
    docs = train_docs if split == "train" else val_docs
    return pack_documents(docs, tokenizer, cache_dir=Path(cfg.data.cache_dir).expanduser())


def _data(cfg: LMRunConfig, train_docs, val_docs, tokenizer, env: D.DistEnv) -> tuple[TokenWindows, TokenWindows]:
    """Packed token windows of both splits. Rank 0 packs (and caches) first;
    the others then open the cached memmaps. Refuses a corpus too short for
    one window per split, with the counts."""

    def pack() -> dict:
        cache = Path(cfg.data.cache_dir).expanduser()
        return {
            "train": pack_documents(train_docs, tokenizer, cache_dir=cache),
            "validation": pack_documents(val_docs, tokenizer, cache_dir=cache),
        }

    splits = pack() if env.is_main else None
    D.barrier(env)
    splits = splits or pack()  # ranks > 0: cache hits
    need = cfg.data.seq_len + 1
    counts = {name: (len(splits[name]), len(docs)) for name, docs in (("train", train_docs), ("validation", val_docs))}
    if min(n for n, _ in counts.values()) < need:
        raise ValueError(
            f"corpus too short for data.seq_len={cfg.data.seq_len} (one window needs {need} tokens per split): "
            + ", ".join(f"the {name} split has {n} tokens in {d} document(s)" for name, (n, d) in counts.items())
            + f" (data.source={cfg.data.source!r}); use a larger corpus, a smaller seq_len or another val_fraction"
        )
    return TokenWindows(splits["train"], cfg.data.seq_len), TokenWindows(splits["validation"], cfg.data.seq_len)
