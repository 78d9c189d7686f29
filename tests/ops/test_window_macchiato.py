"""Sliding window and Macchiato: blocked/step == float64 reference, rows sum to 1."""

import pytest
import torch

from latte.ops import (
    MacchiatoState,
    macchiato,
    macchiato_step,
    sliding_window_attention,
    sliding_window_attention_lse,
    sliding_window_step,
)
from latte.ops import (
    reference as R,
)
from latte.ops.window.sliding_window import full_window_state
from tests.helpers import grads_of, rel_err

f64 = torch.float64


def qkv(T, H=4, K=2, E=6, D=5, B=2, dtype=f64):
    return (
        torch.randn(B, T, H, E, dtype=dtype),
        torch.randn(B, T, K, E, dtype=dtype),
        torch.randn(B, T, K, D, dtype=dtype),
    )


@pytest.mark.parametrize("T,W,K", [(1, 4, 2), (37, 1, 4), (37, 5, 2), (64, 16, 1), (70, 128, 2)])
def test_window_matches_reference_forward_and_grad(T, W, K):
    q, k, v = qkv(T, K=K)
    y, lse, _ = sliding_window_attention_lse(q, k, v, window_size=W)
    y_ref, lse_ref = R.sliding_window_attention(q, k, v, W)
    assert rel_err(y, y_ref) < 1e-12 and rel_err(lse, lse_ref) < 1e-12

    # gradients through both outputs (Macchiato's joint mix uses lse);
    # floor: with T = 1 or W = 1 the exact dq, dk are 0 and ours are ~1e-17
    def both(y, lse, *_):
        return torch.cat([y.flatten(), lse.flatten()])

    _, g = grads_of(lambda q, k, v: both(*sliding_window_attention_lse(q, k, v, window_size=W)), [q, k, v])
    _, g_ref = grads_of(lambda q, k, v: both(*R.sliding_window_attention(q, k, v, W)), [q, k, v])
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-4) < 1e-10
    y32, _ = sliding_window_attention(q.float(), k.float(), v.float(), window_size=W)
    assert rel_err(y32, y_ref) < 1e-5


def test_window_float32_scores_far_below_the_max_and_masked_keys_exactly_zero():
    """The kernel clamps exp arguments at a floor (CPU exp is ~50x slower on
    underflowing lanes) and zeroes masked entries after the exp: scores
    hundreds below their row's max still match float64, and a masked key's
    weight is exactly 0 (a huge value there would show any exp(floor) leak)."""
    torch.manual_seed(3)
    q, k, v = qkv(70)
    q, k = q * 6, k * 6  # scores spread over hundreds
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[0, 20] = False
    v_bad = v.clone()
    v_bad[0, 20] = 1e35
    y_ref, _ = R.sliding_window_attention(q, k, v, 16, mask=mask)
    q32, k32, v32 = (x.float().requires_grad_() for x in (q, k, v_bad))
    y, _ = sliding_window_attention(q32, k32, v32, window_size=16, mask=mask)
    real = mask.clone()
    assert rel_err(y[real], y_ref[real]) < 1e-5
    dy = torch.randn_like(y) * real[..., None, None]
    gq, gk = torch.autograd.grad(y, (q32, k32), dy)
    q64, k64 = (x.clone().requires_grad_() for x in (q, k))
    gq_ref, gk_ref = torch.autograd.grad(
        R.sliding_window_attention(q64, k64, v, 16, mask=mask)[0], (q64, k64), dy.double()
    )
    assert rel_err(gq, gq_ref, floor=1e-3) < 1e-4 and rel_err(gk, gk_ref, floor=1e-3) < 1e-4


@pytest.mark.parametrize("W", [20, 130])
def test_window_many_segments_with_padding_in_some_equal_reference(monkeypatch, W):
    """One query block per segment, padding in some segments only (the
    per-key mask and the own-key exception run in those, the band alone in
    the others); W = 130 spans three key tiles per block."""
    import latte.ops.window.window_tiles as WT

    monkeypatch.setattr(WT, "_SEGMENT_ELEMS", 1)
    q, k, v = qkv(200)  # Q = 64: four blocks
    mask = torch.ones(2, 200, dtype=torch.bool)
    mask[0, 70:75] = False  # block 1 of row 0
    mask[1, 199] = False  # the last block of row 1
    args = [q, k, v]

    def fast(q, k, v):
        y, lse, _ = sliding_window_attention_lse(q, k, v, window_size=W, mask=mask)
        return torch.cat([y[mask].flatten(), lse[mask].flatten()])

    def ref(q, k, v):
        y, lse = R.sliding_window_attention(q, k, v, W, mask=mask)
        return torch.cat([y[mask].flatten(), lse[mask].flatten()])

    out, g = grads_of(fast, args)
    out_ref, g_ref = grads_of(ref, args)
    assert rel_err(out, out_ref) < 1e-12
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-4) < 1e-10


def test_window_mask_and_continuation_and_steps():
    q, k, v = qkv(50)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[0, :6] = False  # left padding
    mask[1, [10, 11, 30]] = False
    y_full, _ = sliding_window_attention(q, k, v, window_size=7, mask=mask)
    y_ref, _ = R.sliding_window_attention(q, k, v, 7, mask=mask)
    assert rel_err(y_full, y_ref) < 1e-12
    y1, st = sliding_window_attention(
        q[:, :23], k[:, :23], v[:, :23], window_size=7, mask=mask[:, :23], output_final_state=True
    )
    ys = [y1]
    for t in range(23, 50):
        y_t, st = sliding_window_step(q[:, t], k[:, t], v[:, t], window_size=7, mask_t=mask[:, t], state=st)
        ys.append(y_t[:, None])
    assert rel_err(torch.cat(ys, 1), y_full) < 1e-12
    assert st.k.shape[1] == 6  # a window - 1 buffer, whatever the context


def inputs_mac(T, H=4, K=2, L=3, E=6, D=5, B=2, dtype=f64):
    q, k, v = qkv(T, H, K, E, D, B, dtype)
    a = torch.randn(B, T, H, L, dtype=dtype)
    b = torch.randn(B, T, H, L, dtype=dtype) * 2
    return a, b, v, q, k


@pytest.mark.parametrize("mix", ["joint", "gate"])
@pytest.mark.parametrize("T,W,C", [(1, 4, 64), (45, 8, 16), (70, 3, 64)])
def test_macchiato_matches_reference(mix, T, W, C):
    a, b, v, q, k = inputs_mac(T)
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    beta = torch.randn(4, dtype=f64)
    args = [a, b, v, q, k, beta] + ([gate] if gate is not None else [])

    def fast(a, b, v, q, k, beta, gate=None):
        return macchiato(a, b, v, q, k, window_size=W, mix=mix, gate=gate, beta=beta, chunk_size=C)[0]

    def ref(a, b, v, q, k, beta, gate=None):
        return R.macchiato(a, b, v, q, k, W, mix, gate, beta)

    out, g = grads_of(fast, args)
    out_ref, g_ref = grads_of(ref, args)
    assert rel_err(out, out_ref) < 1e-11
    for x, xr in zip(g, g_ref):  # floor: d/db is exactly 0 at T = 1
        assert rel_err(x, xr, floor=1e-3) < 1e-9


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_rows_are_probability_vectors(mix):
    T, H = 30, 2
    a, b, _, q, k = inputs_mac(T, H=H, K=1, B=1)
    v = torch.eye(T, dtype=f64)[None, :, None, :]  # one-hot values: y recovers p(s|t)
    gate = torch.randn(1, T, H, dtype=f64) if mix == "gate" else None
    y, _ = macchiato(a, b * 5, v, q, k, window_size=6, mix=mix, gate=gate, chunk_size=8)
    A = y[0].transpose(0, 1)  # [H, t, s]
    assert (A >= -1e-15).all() and A.triu(1).abs().max() < 1e-15
    assert torch.allclose(A.sum(-1), torch.ones(H, T, dtype=f64), atol=1e-12)
    assert rel_err(A, R.macchiato_matrix(a, b * 5, q, k, 6, mix, gate)[0]) < 1e-10


def test_very_negative_beta_is_pure_sliding_window():
    a, b, v, q, k = inputs_mac(40)
    y, _ = macchiato(a, b, v, q, k, window_size=8, beta=torch.full((4,), -1e4, dtype=f64))
    y_swa, _ = sliding_window_attention(q, k, v, window_size=8)
    assert rel_err(y, y_swa) < 1e-12


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_prefill_then_steps_equal_full(mix):
    T, split = 60, 21
    a, b, v, q, k = inputs_mac(T)
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :9] = False  # a left-padded prompt
    kw = dict(window_size=5, mix=mix, chunk_size=8)
    y_full, st_full = macchiato(a, b, v, q, k, gate=gate, mask=mask, output_final_state=True, **kw)
    sl = slice(0, split)
    y, st = macchiato(
        a[:, sl],
        b[:, sl],
        v[:, sl],
        q[:, sl],
        k[:, sl],
        gate=None if gate is None else gate[:, sl],
        mask=mask[:, sl],
        output_final_state=True,
        **kw,
    )
    assert isinstance(st, MacchiatoState)
    ys = [y]
    for t in range(split, T):
        y_t, st = macchiato_step(
            a[:, t],
            b[:, t],
            v[:, t],
            q[:, t],
            k[:, t],
            window_size=5,
            mix=mix,
            gate_t=None if gate is None else gate[:, t],
            mask_t=mask[:, t],
            state=st,
        )
        ys.append(y_t[:, None])
    assert rel_err(torch.cat(ys, 1), y_full) < 1e-12
    assert rel_err(st.latte.S, st_full.latte.S) < 1e-12
    # padding is invisible: row 1 equals the same tokens without their padding
    y_alone, _ = macchiato(*(x[1:, 9:] for x in (a, b, v, q, k)), gate=None if gate is None else gate[1:, 9:], **kw)
    assert rel_err(y_full[1:, 9:], y_alone) < 1e-12


def test_macchiato_extreme_logits_and_bf16_finite():
    a, b, v, q, k = inputs_mac(64, dtype=torch.float32)
    y_ref = R.macchiato(a * 40, b * 40, v, q * 10, k * 10, 16)
    y, _ = macchiato(a * 40, b * 40, v, q * 10, k * 10, window_size=16)
    assert torch.isfinite(y).all() and rel_err(y, y_ref) < 1e-4
    yb, _ = macchiato(*(x.bfloat16() for x in (a * 40, b * 40, v, q, k)), window_size=16)
    assert yb.dtype == torch.bfloat16 and torch.isfinite(yb).all()


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_gradients_flow_through_the_state_exactly(mix):
    """Loss on the continuation only: gradients w.r.t. the prefix inputs reach
    them through the returned state (latent and window) and must equal those
    of one full pass."""
    T, split = 40, 17
    a, b, v, q, k = inputs_mac(T)
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    args = [a, b, v, q, k] + ([gate] if gate is not None else [])
    kw = dict(window_size=6, mix=mix, chunk_size=8)

    def full(*xs):
        g = xs[5] if len(xs) > 5 else None
        return macchiato(*xs[:5], gate=g, **kw)[0][:, split:]

    def split_run(*xs):
        g = xs[5] if len(xs) > 5 else None
        pre = [x[:, :split] for x in xs[:5]]
        post = [x[:, split:] for x in xs[:5]]
        _, st = macchiato(*pre, gate=None if g is None else g[:, :split], output_final_state=True, **kw)
        return macchiato(*post, gate=None if g is None else g[:, split:], initial_state=st, **kw)[0]

    out, g_full = grads_of(full, args)
    out_split, g_split = grads_of(split_run, args)
    assert rel_err(out_split, out) < 1e-12
    for x, xr in zip(g_split, g_full):
        assert rel_err(x, xr, floor=1e-3) < 1e-10
    for i in (1, 2, 4):  # prefix keys and values (b, v, k) really receive gradient
        assert g_split[i][:, :split].abs().max() > 1e-3


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_packed_documents_equal_separate_runs(mix):
    lens = [7, 1, 30, 12]
    T = sum(lens)
    a, b, v, q, k = inputs_mac(T, B=1)
    gate = torch.randn(1, T, 4, dtype=f64) if mix == "gate" else None
    cu = torch.tensor([0, 7, 8, 38, 50])
    kw = dict(window_size=5, mix=mix, chunk_size=8)
    y, st = macchiato(a, b, v, q, k, gate=gate, cu_seqlens=cu, output_final_state=True, **kw)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        sl = slice(s, e)
        y_doc, st_doc = macchiato(
            a[:, sl],
            b[:, sl],
            v[:, sl],
            q[:, sl],
            k[:, sl],
            gate=None if gate is None else gate[:, sl],
            output_final_state=True,
            **kw,
        )
        assert rel_err(y[:, sl], y_doc) < 1e-12
        assert rel_err(st.latte.S[i], st_doc.latte.S[0]) < 1e-12
        # a document's state holds its own min(W - 1, length) tokens; a packed call's rows have
        # the slots of the longest document, the others' front ones empty: the same state
        packed, alone = st.window, full_window_state(st_doc.window, 5)
        assert torch.equal(packed.mask[i], alone.mask[0])
        assert torch.equal(packed.k[i], alone.k[0]) and torch.equal(packed.v[i], alone.v[0])


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_under_bf16_autocast_matches_float32(mix):
    """The window kernel computes in float32 inside an autocast region (its
    matmuls must not drop to bf16 against float32 buffers)."""
    a, b, v, q, k = (x.float() for x in inputs_mac(80))
    gate = torch.randn(2, 80, 4) if mix == "gate" else None
    leaves = [x.clone().requires_grad_() for x in (a, b, v, q, k)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = macchiato(*leaves, window_size=16, mix=mix, gate=gate, chunk_size=16)
    y.float().sum().backward()
    ref, _ = macchiato(a, b, v, q, k, window_size=16, mix=mix, gate=gate, chunk_size=16)
    assert rel_err(y.float(), ref) < 1e-5
    assert all(torch.isfinite(x.grad).all() for x in leaves)
