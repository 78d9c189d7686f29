"""Attention sinks in Macchiato (docs/math.md §4.1): the window plus each
document's first num_sinks tokens under one normaliser, sequence form and
decode steps == the float64 reference, forward and backward."""

import pytest
import torch

from latte.ops import macchiato, macchiato_step
from latte.ops import reference as R
from latte.ops.window.sinks import SinkState, window_sinks_lse
from tests.helpers import grads_of, rel_err

f64 = torch.float64


def inputs(T, H=4, K=2, L=3, E=6, D=5, B=2):
    q, k = torch.randn(B, T, H, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64)
    v = torch.randn(B, T, K, D, dtype=f64)
    a, b = torch.randn(B, T, H, L, dtype=f64), torch.randn(B, T, H, L, dtype=f64) * 2
    return a, b, v, q, k


def padded(B, T, left=5):
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :left] = False  # left padding: the sinks are the first real tokens
    mask[-1, [1, 3, T - 3]] = False  # holes, two among the would-be sinks
    return mask


@pytest.mark.parametrize(
    "T,W,S,soft",
    [(40, 5, 1, None), (40, 5, 4, None), (37, 8, 3, 3.0), (70, 16, 8, None), (12, 20, 4, None), (9, 3, 20, None)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_window_and_sinks_match_reference_forward_and_grad(T, W, S, soft, masked):
    _, _, v, q, k = inputs(T)
    mask = padded(2, T) if masked else None
    real = mask if masked else torch.ones(2, T, dtype=torch.bool)

    def fast(q, k, v):
        y, lse = window_sinks_lse(q, k, v, window_size=W, num_sinks=S, mask=mask, softcap=soft)
        return torch.cat([y[real].flatten(), lse[real].flatten()])

    def ref(q, k, v):
        y, lse = R.sliding_window_attention(q, k, v, W, mask=mask, softcap=soft, num_sinks=S)
        return torch.cat([y[real].flatten(), lse[real].flatten()])

    out, g = grads_of(fast, [q, k, v])
    out_ref, g_ref = grads_of(ref, [q, k, v])
    assert rel_err(out, out_ref) < 1e-12
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-4) < 1e-10


def test_sinks_change_only_queries_past_the_window_and_each_key_counts_once():
    """A window covering the sequence is full attention with or without
    sinks; one-hot values recover p(s|t): the sinks get exactly their
    softmax share, counted once, and rows sum to 1."""
    T, W, S = 30, 6, 3
    _, _, _, q, k = inputs(T, H=2, K=1, B=1)
    v = torch.eye(T, dtype=f64)[None, :, None, :]
    y, _ = window_sinks_lse(q, k, v, window_size=W, num_sinks=S)
    y0, _ = window_sinks_lse(q, k, v, window_size=W, num_sinks=0)
    A = y[0].transpose(0, 1)  # [H, t, s]
    assert torch.allclose(A.sum(-1), torch.ones(2, T, dtype=f64), atol=1e-12)
    e = torch.einsum("the,she->hts", q[0], k[0].expand(-1, 2, -1)) * 6**-0.5
    t, s = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (s <= t) & ((s > t - W) | (s < S))
    assert rel_err(A, torch.softmax(e.masked_fill(~seen, float("-inf")), -1)) < 1e-12
    assert torch.equal(y[:, :W], y0[:, :W]) and (y[:, W:] - y0[:, W:]).abs().max() > 1e-3
    full, _ = window_sinks_lse(q, k, v, window_size=T, num_sinks=S)
    assert rel_err(full, window_sinks_lse(q, k, v, window_size=T, num_sinks=0)[0]) < 1e-15


@pytest.mark.parametrize("mix", ["joint", "gate"])
@pytest.mark.parametrize("T,W,S,C", [(1, 4, 2, 64), (45, 8, 4, 16), (70, 3, 1, 64)])
def test_macchiato_with_sinks_matches_reference(mix, T, W, S, C):
    a, b, v, q, k = inputs(T)
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    beta = torch.randn(4, dtype=f64)
    # no left padding here: the reference's latent rows before any real key are NaN (0/0), in its backward too
    mask = padded(2, T, left=0) if T > 20 else None
    real = mask if mask is not None else torch.ones(2, T, dtype=torch.bool)
    args = [a, b, v, q, k, beta] + ([gate] if gate is not None else [])
    kw = dict(mix=mix, mask=mask, num_sinks=S)

    def fast(a, b, v, q, k, beta, gate=None):
        return macchiato(a, b, v, q, k, window_size=W, gate=gate, beta=beta, chunk_size=C, **kw)[0][real]

    def ref(a, b, v, q, k, beta, gate=None):
        return R.macchiato(a, b, v, q, k, W, gate=gate, beta=beta, **kw)[real]

    out, g = grads_of(fast, args)
    out_ref, g_ref = grads_of(ref, args)
    assert rel_err(out, out_ref) < 1e-11
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-9


@pytest.mark.parametrize("split", [1, 4, 21])
def test_prefill_then_steps_equal_full_and_the_state_is_constant(split):
    """Sinks still being filled at the split (split 1 and 4: left padding of
    5 in row 0) and already filled (21); the state holds each sink once."""
    T, W, S = 40, 5, 3
    a, b, v, q, k = inputs(T)
    mask = padded(2, T)
    step = dict(window_size=W, num_sinks=S)
    kw = dict(chunk_size=8, **step)
    y_full, st_full = macchiato(a, b, v, q, k, mask=mask, output_final_state=True, **kw)
    assert rel_err(y_full[mask], R.macchiato(a, b, v, q, k, W, mask=mask, num_sinks=S)[mask]) < 1e-11
    sl = slice(0, split)
    y, st = macchiato(*(x[:, sl] for x in (a, b, v, q, k)), mask=mask[:, sl], output_final_state=True, **kw)
    ys = [y]
    for t in range(split, T):
        y_t, st = macchiato_step(a[:, t], b[:, t], v[:, t], q[:, t], k[:, t], st, mask_t=mask[:, t], **step)
        assert st.sinks.k.shape == (2, S, 2, 6)  # constant in the context
        ys.append(y_t[:, None])
    assert rel_err(torch.cat(ys, 1)[mask], y_full[mask]) < 1e-12
    for x, x_full in zip(st.sinks, st_full.sinks):
        assert torch.equal(x, x_full)
    first = [mask[i].nonzero()[:S, 0] for i in range(2)]  # the sinks are the first real tokens
    assert all(torch.equal(st.sinks.k[i], k[i, first[i]]) for i in range(2))
    assert torch.equal(st.sinks.offset, torch.tensor([[W] * S] * 2))  # capped at the window


def test_left_padding_is_invisible_with_sinks():
    T, W, S = 30, 4, 2
    a, b, v, q, k = inputs(T)
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :7] = False
    y, _ = macchiato(a, b, v, q, k, window_size=W, chunk_size=8, mask=mask, num_sinks=S)
    y_alone, _ = macchiato(*(x[1:, 7:] for x in (a, b, v, q, k)), window_size=W, chunk_size=8, num_sinks=S)
    assert rel_err(y[1:, 7:], y_alone) < 1e-12


def test_gradients_reach_the_sinks_through_the_state():
    T, split, S = 40, 17, 2
    a, b, v, q, k = inputs(T)
    kw = dict(window_size=6, chunk_size=8, num_sinks=S)

    def full(*xs):
        return macchiato(*xs, **kw)[0][:, split:]

    def split_run(*xs):
        _, st = macchiato(*(x[:, :split] for x in xs), output_final_state=True, **kw)
        return macchiato(*(x[:, split:] for x in xs), initial_state=st, **kw)[0]

    out, g_full = grads_of(full, [a, b, v, q, k])
    out_split, g_split = grads_of(split_run, [a, b, v, q, k])
    assert rel_err(out_split, out) < 1e-12
    for x, xr in zip(g_split, g_full):
        assert rel_err(x, xr, floor=1e-3) < 1e-10
    assert g_split[4][:, :S].abs().max() > 1e-3  # the sinks' keys, far outside the continuation's window


def test_packed_documents_each_keep_their_own_sinks():
    lens = [7, 1, 30, 12]
    T = sum(lens)
    a, b, v, q, k = inputs(T, B=1)
    cu = torch.tensor([0, 7, 8, 38, 50])
    kw = dict(window_size=4, chunk_size=8, num_sinks=2)
    y, st = macchiato(a, b, v, q, k, cu_seqlens=cu, output_final_state=True, **kw)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_doc, st_doc = macchiato(*(x[:, s:e] for x in (a, b, v, q, k)), output_final_state=True, **kw)
        assert rel_err(y[:, s:e], y_doc) < 1e-12
        for x, x_doc in zip(st.sinks, st_doc.sinks):
            assert torch.equal(x[i], x_doc[0])


def test_without_sinks_nothing_changes_and_bad_sinks_are_clear_errors():
    a, b, v, q, k = inputs(20)
    y, st = macchiato(a, b, v, q, k, window_size=4, output_final_state=True)
    assert st.sinks is None
    y0, _ = macchiato(a, b, v, q, k, window_size=4, num_sinks=0)
    assert torch.equal(y, y0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_sinks"):
            macchiato(a, b, v, q, k, window_size=4, num_sinks=bad)
    with pytest.raises(ValueError, match="initial_state.sinks: num_sinks=2 needs"):
        macchiato(a, b, v, q, k, window_size=4, num_sinks=2, initial_state=st)
    _, st2 = macchiato(a, b, v, q, k, window_size=4, num_sinks=2, output_final_state=True)
    with pytest.raises(ValueError, match="state.sinks.k: expected shape"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st2, window_size=4, num_sinks=3)
    broken = st2._replace(sinks=SinkState(*st2.sinks[:3], st2.sinks.offset.int()))
    with pytest.raises(ValueError, match="state.sinks.offset: expected an int64"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], broken, window_size=4, num_sinks=2)


def test_float32_spread_scores_and_bf16_stay_finite():
    a, b, v, q, k = (x.float() for x in inputs(64))
    y_ref = R.macchiato(a * 40, b * 40, v, q * 10, k * 10, 16, num_sinks=4)
    y, _ = macchiato(a * 40, b * 40, v, q * 10, k * 10, window_size=16, num_sinks=4)
    assert torch.isfinite(y).all() and rel_err(y, y_ref) < 1e-4
    yb, _ = macchiato(*(x.bfloat16() for x in (a, b, v, q, k)), window_size=16, num_sinks=4)
    assert yb.dtype == torch.bfloat16 and torch.isfinite(yb).all()


def test_under_bf16_autocast_the_sinks_compute_in_float32():
    a, b, v, q, k = (x.float() for x in inputs(80))
    leaves = [x.clone().requires_grad_() for x in (a, b, v, q, k)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = macchiato(*leaves, window_size=16, chunk_size=16, num_sinks=4)
    y.float().sum().backward()
    ref, _ = macchiato(a, b, v, q, k, window_size=16, chunk_size=16, num_sinks=4)
    assert rel_err(y.float(), ref) < 1e-5
    assert all(torch.isfinite(x.grad).all() for x in leaves)


def test_sinks_merge_with_the_flex_window_too(monkeypatch):
    """The flex_attention window (CUDA; pretended here on CPU) returns the same
    (y, lse) the sinks merge with."""
    import importlib

    M = importlib.import_module("latte.ops.macchiato")
    monkeypatch.setattr(M, "resolve_window", lambda backend, x, **kw: "flex")
    a, b, v, q, k = inputs(90)
    mask = padded(2, 90)
    y, _ = macchiato(a, b, v, q, k, window_size=12, chunk_size=16, mask=mask, num_sinks=3, backend="auto")
    assert rel_err(y[mask], R.macchiato(a, b, v, q, k, 12, mask=mask, num_sinks=3)[mask]) < 1e-12


# sink_q: the sinks scored by their own queries (a converted model's queries rotated to one fixed
# position, so a sink's rotary offset stops growing with the context; docs/math.md §4.1)


@pytest.mark.parametrize("T,W,S,soft", [(40, 5, 4, None), (37, 8, 3, 3.0)])
def test_sink_queries_match_reference_forward_and_grad(T, W, S, soft):
    _, _, v, q, k = inputs(T)
    sq = torch.randn_like(q)
    mask = padded(2, T)

    def fast(q, k, v, sq):
        y, lse = window_sinks_lse(q, k, v, window_size=W, num_sinks=S, mask=mask, softcap=soft, sink_q=sq)
        return torch.cat([y[mask].flatten(), lse[mask].flatten()])

    def ref(q, k, v, sq):
        y, lse = R.sliding_window_attention(q, k, v, W, mask=mask, softcap=soft, num_sinks=S, sink_q=sq)
        return torch.cat([y[mask].flatten(), lse[mask].flatten()])

    out, g = grads_of(fast, [q, k, v, sq])
    out_ref, g_ref = grads_of(ref, [q, k, v, sq])
    assert rel_err(out, out_ref) < 1e-12
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-4) < 1e-10
    assert g[3].abs().max() > 1e-3  # the sink queries are used
    # sink_q = q is the plain sinks model; sink queries change only queries that see a sink outside the window
    same = window_sinks_lse(q, k, v, window_size=W, num_sinks=S, mask=mask, sink_q=q)[0]
    assert torch.equal(same, window_sinks_lse(q, k, v, window_size=W, num_sinks=S, mask=mask)[0])
    other = window_sinks_lse(q, k, v, window_size=W, num_sinks=S, sink_q=sq)[0]
    plain = window_sinks_lse(q, k, v, window_size=W, num_sinks=S)[0]
    assert torch.equal(other[:, :W], plain[:, :W]) and (other[:, W:] - plain[:, W:]).abs().max() > 1e-3


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_with_sink_queries_matches_reference_and_decodes(mix):
    T, W, S, split = 45, 8, 4, 13
    a, b, v, q, k = inputs(T)
    sq = torch.randn_like(q)
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    beta = torch.randn(4, dtype=f64)
    mask = padded(2, T, left=0)
    args = [a, b, v, q, k, beta, sq] + ([gate] if gate is not None else [])
    kw = dict(mix=mix, mask=mask, num_sinks=S)

    def fast(a, b, v, q, k, beta, sq, gate=None):
        return macchiato(a, b, v, q, k, window_size=W, gate=gate, beta=beta, chunk_size=16, sink_q=sq, **kw)[0][mask]

    def ref(a, b, v, q, k, beta, sq, gate=None):
        return R.macchiato(a, b, v, q, k, W, gate=gate, beta=beta, sink_q=sq, **kw)[mask]

    out, g = grads_of(fast, args)
    out_ref, g_ref = grads_of(ref, args)
    assert rel_err(out, out_ref) < 1e-11
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-9
    # prefill then decode steps, each step's sink query given
    step = dict(window_size=W, num_sinks=S, mix=mix, beta=beta)
    y_full, _ = macchiato(a, b, v, q, k, gate=gate, mask=mask, chunk_size=16, sink_q=sq, **step)
    sl = slice(0, split)
    y, st = macchiato(
        *(x[:, sl] for x in (a, b, v, q, k)),
        gate=None if gate is None else gate[:, sl],
        mask=mask[:, sl],
        chunk_size=16,
        sink_q=sq[:, sl],
        output_final_state=True,
        **step,
    )
    ys = [y]
    for t in range(split, T):
        g_t = None if gate is None else gate[:, t]
        y_t, st = macchiato_step(
            a[:, t], b[:, t], v[:, t], q[:, t], k[:, t], st, gate_t=g_t, mask_t=mask[:, t], sink_q_t=sq[:, t], **step
        )
        ys.append(y_t[:, None])
    assert rel_err(torch.cat(ys, 1)[mask], y_full[mask]) < 1e-12


def test_packed_documents_take_their_own_sink_queries_and_bad_shapes_are_named():
    lens = [7, 30, 13]
    T = sum(lens)
    a, b, v, q, k = inputs(T, B=1)
    sq = torch.randn_like(q)
    cu = torch.tensor([0, 7, 37, 50])
    kw = dict(window_size=4, chunk_size=8, num_sinks=2)
    y, _ = macchiato(a, b, v, q, k, cu_seqlens=cu, sink_q=sq, **kw)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        y_doc, _ = macchiato(*(x[:, s:e] for x in (a, b, v, q, k)), sink_q=sq[:, s:e], **kw)
        assert rel_err(y[:, s:e], y_doc) < 1e-12
    with pytest.raises(ValueError, match=r"sink_q: .*\(same as q\)"):
        macchiato(a, b, v, q, k, sink_q=sq[:, :5], **kw)
    with pytest.raises(ValueError, match=r"sink_q_t: .*\(same as q_t\)"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], sink_q_t=sq[:, 0, :1], window_size=4, num_sinks=2)
