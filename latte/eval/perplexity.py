"""Perplexity on packed tokens by position bucket, and at lengths beyond the
training length (context extrapolation, docs/evaluation.md section 3).

Every number is exp(sum of token losses / number of tokens): losses and counts
are summed first (across batches and buckets), never averaged per batch and
then averaged again. The token losses and the overall validation perplexity
are the trainer's (latte/train/validation.py).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from latte.data import TokenWindows, iter_eval_batches
from latte.models import IGNORE_INDEX
from latte.reporting import md_table
from latte.train.validation import summarize, token_nll

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
def perplexity_by_position(
    model: nn.Module,
    windows: TokenWindows,
    *,
    batch_size: int = 8,
    buckets: list[tuple[int, int]] | None = None,
    device: torch.device | str = "cpu",
) -> dict:
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
        b = summarize(float(sums[lo - 1 : end].sum()), int(counts[lo - 1 : end].sum()), 0.0)
        out["buckets"].append(
            {
                "bucket": f"{lo}-{hi}",
                "positions": f"{lo}-{end}",
                "loss": b["loss"],
                "ppl": b["ppl"],
                "tokens": b["tokens"],
            }
        )
    return out


def extrapolation(
    model: nn.Module,
    tokens,
    *,
    train_len: int,
    multiples: list[int],
    max_tokens: int = 65536,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    progress=None,
) -> list[dict]:
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
        raise ValueError(
            f"validation split too short: {len(tokens)} tokens, but the longest "
            f"evaluated window ({max(multiples)} x {train_len} = {longest}) needs {longest + 1}"
        )
    results = []
    for m in multiples:
        L = m * train_len
        windows = TokenWindows(tokens[: span + 1], L)
        try:
            r = perplexity_by_position(
                model, windows, batch_size=max(1, batch_size // m), buckets=position_buckets(L), device=device
            )
        except ValueError as e:  # e.g. max_position_embeddings exceeded
            r = {"seq_len": L, "error": str(e)}
        r["multiple"] = m
        results.append(r)
        if progress is not None:
            progress(r)
    return results


def extrapolation_summary(groups) -> tuple[list[dict], str]:
    """(records, markdown table) of `latte eval`'s native ppl cells, one per
    (model, length) holding tokens, ppl and ppl_<bucket> (or error).
    `groups`: per model, (the fields naming it in records, its label, its
    cells)."""
    records = [r for _, _, cells in groups for r in cells]
    buckets = sorted({k for r in records for k in r if k.startswith("ppl_")}, key=lambda k: int(k[4:].split("-")[0]))
    rows = []
    for _, name, cells in groups:
        for r in cells:
            if "error" in r:
                rows.append([name, str(r["seq_len"]), "not applicable: " + r["error"]] + [""] * (len(buckets) + 1))
                continue
            by = [f"{r[b]:.2f}" if b in r else "" for b in buckets]
            rows.append([name, str(r["seq_len"]), f"{r['tokens']:,}", f"{r['ppl']:.2f}", *by])
    head = ["model", "length", "tokens", "ppl"] + [f"positions {b[4:]}" for b in buckets]
    note = "\n\n(perplexity by position within each window; the same tokens at every length)"
    return records, md_table(head, rows) + note
