"""Perplexity helpers: tied to the model's own loss, sums over ranks,
position buckets, and extrapolation past an absolute-position limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from latte.data import TokenWindows
from latte.eval.perplexity import extrapolation, perplexity_by_position, position_buckets
from latte.models import LatteConfig, LatteForCausalLM
from latte.train.validation import batches_per_rank, nll_sums, perplexity, subset


def model(**kw) -> LatteForCausalLM:
    torch.manual_seed(0)
    return LatteForCausalLM(LatteConfig.tiny(mixer="macchiato", **kw)).eval()


def tokens(n=2000, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 64, n).astype(np.uint16)


def test_matches_the_models_own_shifted_loss():
    """Pre-shifted labels used once: equal to the model's loss on the
    unshifted windows (it shifts inside)."""
    m, w = model(), TokenWindows(tokens(), 32)
    rows = torch.stack([torch.from_numpy(np.asarray(w[i], dtype=np.int64)) for i in range(len(w))])
    with torch.no_grad():
        ref = m(rows, labels=rows).loss  # [N, 33] windows: 32 targets each
    r = perplexity(m, w, batch_size=5)
    assert r["tokens"] == len(w) * 32
    assert math.isclose(r["loss"], float(ref), rel_tol=1e-5)
    assert math.isclose(r["ppl"], math.exp(r["loss"]))


def test_sums_over_ranks_equal_one_process():
    m, w = model(), TokenWindows(tokens(), 32)
    one = nll_sums(m, w, batch_size=4)
    parts = [nll_sums(m, w, batch_size=4, rank=r, world_size=3) for r in range(3)]
    assert sum(c for _, c in parts) == one[1]
    assert math.isclose(sum(s for s, _ in parts), one[0], rel_tol=1e-9)


def test_batches_per_rank_and_subset():
    w = TokenWindows(tokens(), 32)  # 62 windows
    assert batches_per_rank(len(w), 4, 2) == 8 and batches_per_rank(5, 2, 2) == 2
    assert len(subset(w, 10)) == 10 and subset(w, 0) is w and subset(w, 1000) is w


def test_position_buckets():
    assert position_buckets(256) == [(1, 128), (129, 512)]
    assert position_buckets(2048) == [(1, 128), (129, 512), (513, 2048)]
    assert position_buckets(100) == [(1, 128)]


def test_by_position_buckets_add_up():
    m, w = model(), TokenWindows(tokens(), 40)
    r = perplexity_by_position(m, w, batch_size=8, buckets=[(1, 10), (11, 80), (81, 100)])
    assert [b["tokens"] for b in r["buckets"]] == [10 * len(w), 30 * len(w)]  # clipped at 40, empty dropped
    assert [(b["bucket"], b["positions"]) for b in r["buckets"]] == [("1-10", "1-10"), ("11-80", "11-40")]
    total = sum(b["loss"] * b["tokens"] for b in r["buckets"]) / r["tokens"]
    assert math.isclose(total, r["loss"], rel_tol=1e-9)


def test_extrapolation_same_tokens_and_absolute_positions_not_applicable():
    toks = tokens(3000)
    res = extrapolation(model(), toks, train_len=32, multiples=[1, 2, 4], max_tokens=1024)
    assert [r["seq_len"] for r in res] == [32, 64, 128]
    assert len({r["tokens"] for r in res}) == 1  # like for like
    assert all(math.isfinite(r["ppl"]) for r in res)
    learned = model(position_embedding="learned", max_position_embeddings=64)
    res = extrapolation(learned, toks, train_len=32, multiples=[1, 2, 4], max_tokens=1024)
    assert "error" not in res[0] and "error" not in res[1]
    assert "max_position_embeddings=64" in res[2]["error"]


def test_extrapolation_refuses_too_little_data():
    with pytest.raises(ValueError, match="validation split too short"):
        extrapolation(model(), tokens(100), train_len=32, multiples=[4])


def test_lockstep_pads_the_ranks_with_fewer_batches():
    """FSDP2 forwards are collective: every rank must run as many as rank 0."""
    m, w = model(), TokenWindows(tokens(33 * 5 + 1), 33)  # 5 windows over 2 ranks: 3 and 2
    calls = []
    hook = m.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    try:
        s1, c1 = nll_sums(m, w, batch_size=1, rank=1, world_size=2, lockstep=True)
    finally:
        hook.remove()
    assert len(calls) == batches_per_rank(5, 1, 2) == 3  # 2 real batches + 1 discarded
    assert c1 == 2 * 33 and (s1, c1) == nll_sums(m, w, batch_size=1, rank=1, world_size=2)
