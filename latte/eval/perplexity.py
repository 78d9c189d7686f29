"""Perplexity on packed tokens: overall, by position bucket, and at lengths
beyond the training length (context extrapolation, EVAL.md section 3).

Every number is exp(sum of token losses / number of tokens): losses and counts
are summed first (across batches, buckets and ranks), never averaged per
batch and then averaged again.

Labels are pre-shifted as `TokenWindows.batch` returns them (labels[:, t] is
the token after input_ids[:, t]), so the model is called with labels=None and
the loss is computed here.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from latte.data import TokenWindows, iter_eval_batches
from latte.models import IGNORE_INDEX


@torch.no_grad()
def token_nll(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position next-token loss [B, T] in float32 (0 where labels are -100)."""
    logits_BTV = model(input_ids).logits
    B, T, V = logits_BTV.shape
    nll = F.cross_entropy(logits_BTV.reshape(-1, V).float(), labels.reshape(-1),
                          ignore_index=IGNORE_INDEX, reduction="none")
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
def nll_sums(model: nn.Module, windows: TokenWindows, *, batch_size: int, rank: int = 0,
             world_size: int = 1, device: torch.device | str = "cpu",
             lockstep: bool = False) -> tuple[float, int]:
    """(sum of token losses, number of tokens) over this rank's share of
    `windows` (every window once across ranks). Sum both over ranks, then
    exp(sum / count) is the perplexity.

    lockstep: every rank runs the same number of forward calls, padding with
    a discarded batch where it has run out (FSDP2 gathers weights in every
    forward, so a rank with one batch fewer would hang the others)."""
    was_training = model.training
    model.eval()
    total, count, n = 0.0, 0, 0
    try:
        for x, y in iter_eval_batches(windows, batch_size, rank, world_size):
            x, y = x.to(device), y.to(device)
            nll = token_nll(model, x, y)
            total += float(nll.double().sum())
            count += int((y != IGNORE_INDEX).sum())
            n += 1
        if lockstep:
            for _ in range(batches_per_rank(len(windows), batch_size, world_size) - n):
                token_nll(model, *(t.to(device) for t in windows.batch([0])))
    finally:
        model.train(was_training)
    return total, count


def perplexity(model: nn.Module, windows: TokenWindows, *, batch_size: int = 8,
               device: torch.device | str = "cpu") -> dict:
    """Single-process validation: {"loss", "ppl", "tokens", "seconds", "tokens_per_s"}."""
    t0 = time.perf_counter()
    total, count = nll_sums(model, windows, batch_size=batch_size, device=device)
    return summarize(total, count, time.perf_counter() - t0)


def summarize(nll_sum: float, tokens: int, seconds: float) -> dict:
    loss = nll_sum / tokens if tokens else math.nan
    return {"loss": loss, "ppl": math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf,
            "tokens": int(tokens), "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0}


# --------------------------------------------------------------------------- by position

def position_buckets(max_len: int, first: int = 128, factor: int = 4) -> list[tuple[int, int]]:
    """1-based inclusive position ranges 1-128, 129-512, 513-2048, ... covering
    1..max_len. The same boundaries at every length, so results at several
    lengths line up; the last bucket may reach past max_len (it is then
    clipped to the window: see `perplexity_by_position`)."""
    buckets, lo, hi = [], 1, first
    while lo <= max_len:
        buckets.append((lo, hi))
        lo, hi = hi + 1, hi * factor
    return buckets


@torch.no_grad()
def perplexity_by_position(model: nn.Module, windows: TokenWindows, *, batch_size: int = 8,
                           buckets: list[tuple[int, int]] | None = None,
                           device: torch.device | str = "cpu") -> dict:
    """Perplexity over all of `windows` and per position bucket within a window
    (position 1 = the first token of the window, predicted from no context).

    Returns {"seq_len", "windows", "loss", "ppl", "tokens", "seconds",
    "buckets": [{"bucket": "129-512", "positions": "129-256", "loss", "ppl",
    "tokens"}, ...]}: "positions" is the bucket clipped to the window."""
    T = windows.seq_len
    buckets = buckets or position_buckets(T)
    sums = np.zeros(T, dtype=np.float64)  # loss summed over windows, per position
    counts = np.zeros(T, dtype=np.int64)
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        for x, y in iter_eval_batches(windows, batch_size):
            x, y = x.to(device), y.to(device)
            sums += token_nll(model, x, y).double().sum(0).cpu().numpy()
            counts += (y != IGNORE_INDEX).sum(0).cpu().numpy()
    finally:
        model.train(was_training)
    out = summarize(float(sums.sum()), int(counts.sum()), time.perf_counter() - t0)
    out.update(seq_len=T, windows=len(windows), buckets=[])
    for lo, hi in buckets:
        if lo > T:
            continue
        end = min(hi, T)
        b = summarize(float(sums[lo - 1: end].sum()), int(counts[lo - 1: end].sum()), 0.0)
        out["buckets"].append({"bucket": f"{lo}-{hi}", "positions": f"{lo}-{end}", "loss": b["loss"],
                               "ppl": b["ppl"], "tokens": b["tokens"]})
    return out


def extrapolation(model: nn.Module, tokens, *, train_len: int, multiples: list[int],
                  max_tokens: int = 65536, batch_size: int = 8, device: torch.device | str = "cpu",
                  progress=None) -> list[dict]:
    """Perplexity at window lengths m * train_len for m in `multiples`, all on
    the SAME tokens (the first ~max_tokens of `tokens`, rounded down to a
    multiple of the longest window), so the lengths compare like for like.

    A length the model cannot run (absolute position embeddings beyond their
    limit raise ValueError naming it) is reported as not applicable:
    {"multiple", "seq_len", "error": message}."""
    longest = max(multiples) * train_len
    usable = min(len(tokens) - 1, max(max_tokens, longest))
    span = (usable // longest) * longest
    if span == 0:
        raise ValueError(f"validation split too short: {len(tokens)} tokens, but the longest "
                         f"evaluated window ({max(multiples)} x {train_len} = {longest}) needs {longest + 1}")
    results = []
    for m in multiples:
        L = m * train_len
        windows = TokenWindows(tokens[: span + 1], L)
        try:
            r = perplexity_by_position(model, windows, batch_size=max(1, batch_size // m),
                                       buckets=position_buckets(L), device=device)
        except ValueError as e:  # e.g. max_position_embeddings exceeded
            r = {"seq_len": L, "error": str(e)}
        r["multiple"] = m
        results.append(r)
        if progress is not None:
            progress(r)
    return results
