"""Macchiato's window branch on flex_attention (latte/ops/window/flex_window.py).

On CPU torch runs flex_attention only eagerly for this (its compiled CPU
kernel has no log-normaliser and no backward), so these tests check the
band's block structure, the mask and cache handling and the log-space mix
against the float64 reference, forward only; tests/gpu/ checks the fused
kernel and its gradients on CUDA.
"""

import pytest
import torch

from latte.ops import MacchiatoState, macchiato
from latte.ops import backend as BK
from latte.ops import reference as R
from latte.ops.window.flex_window import BLOCK, band_blocks, flex_window
from latte.ops.window.sliding_window import WindowState, window_blocked
from tests.helpers import rel_err

flex = pytest.importorskip("torch.nn.attention.flex_attention")
f64 = torch.float64


def dense(num, idx, nkv):
    out = torch.zeros(num.shape[-1], nkv, dtype=torch.bool)
    for r in range(num.shape[-1]):
        out[r, idx[0, 0, r, : num[0, 0, r]].long()] = True
    return out


@pytest.mark.parametrize(
    "T,P,W",
    [
        (1, 0, 4),
        (300, 0, 1),
        (300, 0, 128),
        (300, 0, 129),
        (257, 127, 128),
        (1000, 0, 300),
        (130, 299, 300),
        (64, 0, 1000),
    ],
)
def test_band_blocks_cover_exactly_the_band(T, P, W):
    """Every (query, key) of the band lies in a listed block; full blocks hold
    only visible pairs and lie inside both sequences; no block is listed twice."""
    num, idx, fnum, fidx = band_blocks(T, P, W, BLOCK)
    KV = P + T
    nkv = -(-KV // BLOCK)
    part, full = dense(num, idx, nkv), dense(fnum, fidx, nkv)
    assert not (part & full).any()
    i = torch.arange(T)[:, None]
    j = torch.arange(KV)[None, :]
    visible = (j <= i + P) & (j > i + P - W)  # [T, KV]
    blocks = torch.nn.functional.pad(visible, (0, nkv * BLOCK - KV, 0, -(-T // BLOCK) * BLOCK - T))
    any_visible = blocks.view(-1, BLOCK, nkv, BLOCK).any(3).any(1)
    assert torch.equal(any_visible, part | full)
    all_visible = blocks.view(-1, BLOCK, nkv, BLOCK).all(3).all(1)
    assert not (full & ~all_visible).any()


def qkv(T, H=4, K=2, E=6, D=5, B=2):
    return (torch.randn(B, T, H, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64), torch.randn(B, T, K, D, dtype=f64))


def test_flex_window_asks_for_the_main_kernel(monkeypatch):
    """Under "AUTO" a compiled flex_attention takes its decoding kernel for
    fewer than 128 queries, which has no configuration once queries x grouped
    heads pass 128; flex_window
    asks for the main kernel at every length (the GPU regression case is
    tests/gpu's T=100 over 2 grouped heads)."""
    import latte.ops.window.flex_window as FW

    seen = []
    monkeypatch.setattr(FW, "_flex", lambda *a, **kw: seen.append(kw) or flex.flex_attention(*a, **kw))
    for T in (1, 100, 300):
        flex_window(*qkv(T), 16, 0.4, None, None)
    assert [kw["kernel_options"] for kw in seen] == [{"BACKEND": "TRITON"}] * 3


@pytest.mark.parametrize("T,W,K", [(1, 4, 2), (37, 1, 4), (37, 5, 2), (200, 16, 1), (300, 130, 2)])
def test_flex_window_matches_reference(T, W, K):
    q, k, v = qkv(T, K=K)
    y, lse, st = flex_window(q, k, v, W, 6**-0.5, None, None)
    y_ref, lse_ref = R.sliding_window_attention(q, k, v, W)
    assert rel_err(y, y_ref) < 1e-12 and rel_err(lse, lse_ref) < 1e-12
    _, _, st_tiles = window_blocked(q, k, v, W, 6**-0.5, None, None)
    assert all(torch.equal(x, x_t) for x, x_t in zip(st, st_tiles))


def test_flex_window_with_padding_cache_and_lengths_equals_tiles():
    q, k, v = qkv(150)
    W = 40
    mask = torch.ones(2, 150, dtype=torch.bool)
    mask[0, :9] = False
    mask[1, 100:] = False
    P = W - 1
    state = WindowState(torch.randn(2, P, 2, 6, dtype=f64), torch.randn(2, P, 2, 5, dtype=f64), torch.rand(2, P) < 0.7)
    lengths = torch.tensor([150, 100])
    for st in (None, state):
        got = flex_window(q, k, v, W, 0.3, mask, st, lengths)
        want = window_blocked(q, k, v, W, 0.3, mask, st, lengths)
        real = mask
        assert rel_err(got[0][real], want[0][real]) < 1e-12 and rel_err(got[1][real], want[1][real]) < 1e-12
        assert all(torch.equal(x, x_t) for x, x_t in zip(got[2], want[2]))


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_on_the_flex_window_matches_reference(monkeypatch, mix):
    """backend="auto" with the flex window pretended available on CPU: the
    log-space mix of flex's lse with the latents equals the float64 matrix."""
    import importlib

    M = importlib.import_module("latte.ops.macchiato")  # the module, not the function latte.ops exports

    calls = []
    monkeypatch.setattr(M, "resolve_window", lambda backend, x, **kw: "flex")
    monkeypatch.setattr(M, "flex_window", lambda *args: calls.append(1) or flex_window(*args))
    B, T, H, K, L, E, W = 2, 150, 4, 2, 3, 6, 20
    a, b = torch.randn(B, T, H, L, dtype=f64), torch.randn(B, T, H, L, dtype=f64)
    q, k, v = qkv(T, H, K, E, E)
    gate = torch.randn(B, T, H, dtype=f64) if mix == "gate" else None
    beta = torch.randn(H, dtype=f64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :5] = False
    y, st = macchiato(
        a,
        b,
        v,
        q,
        k,
        window_size=W,
        mix=mix,
        gate=gate,
        beta=beta,
        mask=mask,
        chunk_size=16,
        output_final_state=True,
        backend="auto",
    )
    y_ref = R.macchiato(a, b, v, q, k, W, mix=mix, gate=gate, beta=beta, mask=mask)
    assert rel_err(y[mask], y_ref[mask]) < 1e-12
    y2, _ = macchiato(
        a[:, :10],
        b[:, :10],
        v[:, :10],
        q[:, :10],
        k[:, :10],
        window_size=W,
        mix=mix,
        gate=None if gate is None else gate[:, :10],
        beta=beta,
        chunk_size=16,
        initial_state=st,
        backend="auto",
    )
    assert isinstance(st, MacchiatoState) and torch.isfinite(y2).all()
    assert len(calls) == 2


def test_explicit_fla_window_fails_clearly_on_cpu():
    q = torch.zeros(1, 4, 2, 3)
    with pytest.raises(ValueError, match="flex_attention window needs CUDA"):
        BK.resolve_window("fla", q)
