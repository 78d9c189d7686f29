"""Validation loss of a language model on packed token windows: token-level
losses summed with their counts (over batches and ranks), never averaged
per batch and then averaged again. Used by the trainer's periodic and final
validation and by `latte eval` (latte/eval/perplexity.py builds the
by-position and longer-context evaluations on these sums).

Labels are pre-shifted as `TokenWindows.batch` returns them (labels[:, t] is
the token after input_ids[:, t]), so the model is called with labels=None and
the loss is computed here.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from latte.data import TokenWindows, iter_eval_batches
from latte.models import IGNORE_INDEX


def packed_rows(input_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows [B, T] as one packed row [1, B * T] and its cu_seqlens: a
    document starts at each window's start and at each eos token (the
    separator opens the next document, as a BOS would, so every target of
    the window is kept). `data.document_boundaries` (one host sync)."""
    starts = input_ids == eos_id
    starts[:, 0] = True
    flat = starts.reshape(-1)
    end = torch.tensor([flat.numel()], device=flat.device)
    return input_ids.reshape(1, -1), torch.cat([flat.nonzero().view(-1), end])


@torch.no_grad()
def token_nll(
    model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor, eos_id: int | None = None
) -> torch.Tensor:
    """Per-position next-token loss [B, T] in float32 (0 where labels are -100).
    eos_id: each document of the windows seen alone (`packed_rows`)."""
    B, T = input_ids.shape
    if eos_id is None:
        logits_BTV = model(input_ids).logits
    else:
        ids, cu_seqlens = packed_rows(input_ids, eos_id)
        logits_BTV = model(ids, cu_seqlens=cu_seqlens).logits.view(B, T, -1)
    V = logits_BTV.shape[-1]
    nll = F.cross_entropy(
        logits_BTV.reshape(-1, V).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return nll.reshape(B, T)


def batches_per_rank(num_windows: int, batch_size: int, world_size: int) -> int:
    """The most batches any rank gets from `iter_eval_batches` (rank 0's)."""
    mine = -(-num_windows // world_size)
    return -(-mine // batch_size)


def subset(windows: TokenWindows, max_windows: int | None) -> TokenWindows:
    """The first `max_windows` windows (all when None or 0)."""
    if not max_windows or max_windows >= len(windows):
        return windows
    return TokenWindows(windows.tokens[: max_windows * windows.seq_len + 1], windows.seq_len)


@torch.no_grad()
def nll_sums(
    model: nn.Module,
    windows: TokenWindows,
    *,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
    lockstep: bool = False,
    eos_id: int | None = None,
) -> tuple[float, int]:
    """(sum of token losses, number of tokens) over this rank's share of
    `windows` (every window once across ranks). Sum both over ranks, then
    exp(sum / count) is the perplexity.

    lockstep: every rank runs the same number of forward calls, padding with
    a discarded batch where it has run out (FSDP2 gathers weights in every
    forward, so a rank with one batch fewer would hang the others).
    eos_id: documents seen alone (token_nll)."""
    was_training = model.training
    model.eval()
    total, count, n = 0.0, 0, 0
    try:
        for x, y in iter_eval_batches(windows, batch_size, rank, world_size):
            x, y = x.to(device), y.to(device)
            nll = token_nll(model, x, y, eos_id)
            total += float(nll.double().sum())
            count += int((y != IGNORE_INDEX).sum())
            n += 1
        if lockstep:
            for _ in range(batches_per_rank(len(windows), batch_size, world_size) - n):
                token_nll(model, *(t.to(device) for t in windows.batch([0])), eos_id)
    finally:
        model.train(was_training)
    return total, count


def perplexity(
    model: nn.Module, windows: TokenWindows, *, batch_size: int = 8, device: torch.device | str = "cpu"
) -> dict:
    """Single-process validation: {"loss", "ppl", "tokens", "seconds", "tokens_per_s"}."""
    t0 = time.perf_counter()
    total, count = nll_sums(model, windows, batch_size=batch_size, device=device)
    return summarize(total, count, time.perf_counter() - t0)


def summarize(nll_sum: float, tokens: int, seconds: float) -> dict:
    loss = nll_sum / tokens if tokens else math.nan
    return {
        "loss": loss,
        "ppl": math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf,
        "tokens": int(tokens),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }
