"""Fixed-length windows over a token array, and a resumable rank-aware loader.

The loader's whole state is one integer, the global sample index. The order
of samples is a pure function of (seed, epoch), so sample number n of the
run is the same whatever the world size, and resuming from a checkpoint
(even on a different number of ranks) continues exactly where it stopped.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import numpy as np
import torch

from latte.data.packing import check_token_ids


class TokenWindows:
    """Sample i is tokens[i*seq_len : i*seq_len + seq_len + 1].

    Windows do not overlap except for one token: the last label of window i
    is the first input of window i+1, so every token but the first is a
    target exactly once per epoch.
    """

    def __init__(self, tokens, seq_len: int):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r}: must be an int >= 1")
        tokens = np.asarray(tokens)  # a view for np.memmap, no copy
        if tokens.ndim != 1:
            raise ValueError(f"tokens: expected a 1-D array, got shape {tokens.shape}")
        if len(tokens) < seq_len + 1:
            raise ValueError(
                f"corpus too short: {len(tokens)} tokens, but seq_len={seq_len} "
                f"needs at least {seq_len + 1} for one sample (inputs + shifted labels)"
            )
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"window {i} out of range for {len(self)} windows")
        start = (i % len(self)) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels), int64 [len(indices), seq_len]; labels[:, t] is
        the token after input_ids[:, t] (already shifted)."""
        rows = np.stack([np.asarray(self[int(i)], dtype=np.int64) for i in indices])
        rows_BS1 = torch.from_numpy(rows)  # [B, seq_len + 1]
        return rows_BS1[:, :-1].contiguous(), rows_BS1[:, 1:].contiguous()

    def check_ids(self, vocab_size: int, *, where: str) -> None:
        check_token_ids(self.tokens, vocab_size, where=where)


def _epoch_seed(seed: int, epoch: int) -> int:
    """A generator seed fixed by (seed, epoch), unrelated between epochs."""
    digest = hashlib.sha256(f"latte-loader\0{seed}\0{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


class SampleLoader:
    """Infinite iterator of (input_ids, labels), int64 [G/W, seq_len].

    Global step k reads global samples [k*G, (k+1)*G) of the infinite
    sequence epoch 0, epoch 1, ... (each epoch a torch.randperm seeded by
    (seed, epoch), or 0..N-1 when shuffle=False); rank r takes the
    contiguous slice [r*G/W, (r+1)*G/W) of those. A batch may straddle an
    epoch boundary. State: {"sample_index": n}, the next global sample.
    """

    def __init__(
        self,
        windows: TokenWindows,
        *,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        start_index: int = 0,
    ):
        _check_rank(rank, world_size)
        if not isinstance(global_batch_size, int) or global_batch_size < 1:
            raise ValueError(f"global_batch_size={global_batch_size!r}: must be an int >= 1")
        if global_batch_size % world_size:
            raise ValueError(f"global_batch_size={global_batch_size} must be divisible by world_size={world_size}")
        if len(windows) < 1:
            raise ValueError("windows is empty: no samples to load")
        self.windows = windows
        self.global_batch_size = global_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.local_batch_size = global_batch_size // world_size
        self.sample_index = 0
        self._orders: dict[int, torch.Tensor] = {}
        self.load_state_dict({"sample_index": start_index})

    @property
    def epoch(self) -> int:
        """The epoch the next sample comes from."""
        return self.sample_index // len(self.windows)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The window indices of `epoch`, in the order they are served."""
        if epoch not in self._orders:
            n = len(self.windows)
            if self.shuffle:
                g = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
                order = torch.randperm(n, generator=g)
            else:
                order = torch.arange(n)
            if len(self._orders) >= 2:  # batches span at most a few epochs
                self._orders.pop(min(self._orders))
            self._orders[epoch] = order
        return self._orders[epoch]

    def global_window_indices(self, start: int, count: int) -> list[int]:
        """Window indices of global samples [start, start + count)."""
        n = len(self.windows)
        return [int(self.epoch_order(p // n)[p % n]) for p in range(start, start + count)]

    def __iter__(self) -> SampleLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.sample_index + self.rank * self.local_batch_size
        indices = self.global_window_indices(start, self.local_batch_size)
        self.sample_index += self.global_batch_size
        return self.windows.batch(indices)

    def state_dict(self) -> dict[str, int]:
        return {"sample_index": self.sample_index}

    def load_state_dict(self, state: dict) -> None:
        n = state.get("sample_index") if isinstance(state, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"loader state sample_index={n!r}: must be an int >= 0 (state was {state!r})")
        self.sample_index = n


def _check_rank(rank: int, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: must be an int >= 1")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank!r}: must be an int in [0, world_size={world_size})")


def iter_eval_batches(
    windows: TokenWindows, batch_size: int, rank: int = 0, world_size: int = 1
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every window exactly once across ranks, in order, no shuffle.

    Rank r takes windows r, r+W, r+2W, ... so ranks differ by at most one
    window; `batch_size` is per rank and the last batch may be smaller.
    Sum losses and token counts, then all-reduce once at the end: ranks may
    run different numbers of batches.
    """
    _check_rank(rank, world_size)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be an int >= 1")
    mine = range(rank, len(windows), world_size)
    for start in range(0, len(mine), batch_size):
        yield windows.batch(mine[start : start + batch_size])


def unigram_perplexity(train_tokens, val_tokens, vocab_size: int) -> float:
    """Perplexity on val of an add-one smoothed unigram model fitted on train.

    The floor any real language model must beat: a model that learned only
    token frequencies scores this.
    """
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r}: must be an int >= 1")
    if len(val_tokens) == 0:
        raise ValueError("val_tokens is empty: perplexity is undefined")
    check_token_ids(train_tokens, vocab_size, where="train_tokens")
    check_token_ids(val_tokens, vocab_size, where="val_tokens")
    counts = np.ones(vocab_size, dtype=np.float64)  # the add-one prior
    chunk = 1 << 24  # bincount widens to int64: chunk to bound memory
    for s in range(0, len(train_tokens), chunk):
        part = np.asarray(train_tokens[s : s + chunk], dtype=np.int64)
        counts += np.bincount(part, minlength=vocab_size)
    log_p = np.log(counts) - math.log(counts.sum())
    nll = 0.0
    for s in range(0, len(val_tokens), chunk):
        nll -= float(log_p[np.asarray(val_tokens[s : s + chunk], dtype=np.int64)].sum())
    return math.exp(nll / len(val_tokens))
