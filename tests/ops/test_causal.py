"""causal Latte: chunked == recurrent == float64 reference, forward and gradients."""

import pytest
import torch

from latte.ops import LatteState, latte_causal, latte_causal_step
from latte.ops import reference as R
from latte.ops.distributions import DISTRIBUTIONS
from latte.ops.distributions import logits as dist_logits
from latte.ops.distributions import mask as dist_mask
from tests.helpers import grads_of, rel_err

# (T, Lh, Dv, chunk): the odd shapes of the contract, chunks that do and do not divide T
CASES = [
    (1, 5, 60, 64),
    (2, 1, 1, 64),
    (63, 32, 64, 16),
    (64, 5, 60, 64),
    (65, 1, 64, 64),
    (65, 32, 1, 7),
    (257, 5, 64, 64),
    (257, 32, 60, 100),
]


def inputs(T, L, D, B=2, H=3, scale=1.0, dtype=torch.float64):
    a = torch.randn(B, T, H, L, dtype=dtype)
    b = torch.randn(B, T, H, L, dtype=dtype) * scale
    v = torch.randn(B, T, H, D, dtype=dtype)
    return a, b, v


def random_state(B, H, L, D, dtype=torch.float64):
    return LatteState(torch.randn(B, H, L, D, dtype=dtype), torch.randn(B, H, L, dtype=dtype) * 3)


@pytest.mark.parametrize("T,L,D,C", CASES)
def test_forward_matches_reference(T, L, D, C):
    a, b, v = inputs(T, L, D)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v)
    y, st = latte_causal(a, b, v, chunk_size=C, output_final_state=True)
    assert rel_err(y, y_ref) < 1e-10
    assert rel_err(st.S, S_ref) < 1e-10 and rel_err(st.z, z_ref) < 1e-10
    y32, st32 = latte_causal(a.float(), b.float(), v.float(), chunk_size=C, output_final_state=True)
    assert y32.dtype == torch.float32 and st32.S.dtype == torch.float32
    assert rel_err(y32, y_ref) < 1e-4


@pytest.mark.parametrize("T,L,D,C", CASES[2:7])
def test_gradients_match_reference_with_initial_state(T, L, D, C):
    a, b, v = inputs(T, L, D)
    S0, z0 = random_state(2, 3, L, D)

    def fast(a, b, v, S0, z0):
        y, st = latte_causal(a, b, v, chunk_size=C, initial_state=LatteState(S0, z0), output_final_state=True)
        return torch.cat([y.flatten(), st.S.flatten(), st.z.flatten()])

    def ref(a, b, v, S0, z0):
        y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0))
        return torch.cat([y.flatten(), S.flatten(), z.flatten()])

    out, g = grads_of(fast, [a, b, v, S0, z0])
    out_ref, g_ref = grads_of(ref, [a, b, v, S0, z0])
    assert rel_err(out, out_ref) < 1e-10
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr) < 1e-9, name


def test_float32_gradients_close_to_float64_reference():
    a, b, v = inputs(130, 8, 16, scale=5.0)
    _, g_ref = grads_of(lambda a, b, v: R.latte_causal(a, b, v)[0], [a, b, v])
    _, g = grads_of(lambda a, b, v: latte_causal(a, b, v, chunk_size=32)[0], [x.float() for x in (a, b, v)])
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr) < 1e-4


@pytest.mark.parametrize("split", [1, 15, 16, 17, 40, 63])
def test_state_continuation_equals_one_pass(split):
    a, b, v = inputs(64, 5, 7)
    y_full, st_full = latte_causal(a, b, v, chunk_size=16, output_final_state=True)
    y1, st = latte_causal(a[:, :split], b[:, :split], v[:, :split], chunk_size=16, output_final_state=True)
    y2, st2 = latte_causal(
        a[:, split:], b[:, split:], v[:, split:], chunk_size=16, initial_state=st, output_final_state=True
    )
    assert rel_err(torch.cat([y1, y2], 1), y_full) < 1e-12
    assert rel_err(st2.S, st_full.S) < 1e-12 and rel_err(st2.z, st_full.z) < 1e-12


def test_recurrent_steps_equal_chunked():
    a, b, v = inputs(70, 5, 7, scale=10.0)
    y_full, st_full = latte_causal(a, b, v, chunk_size=16, output_final_state=True)
    state, ys = None, []
    for t in range(70):
        y_t, state = latte_causal_step(a[:, t], b[:, t], v[:, t], state)
        ys.append(y_t)
    assert rel_err(torch.stack(ys, 1), y_full) < 1e-12
    assert rel_err(state.S, st_full.S) < 1e-12


def test_step_state_size_is_constant():
    a, b, v = inputs(300, 4, 6)
    state = None
    sizes = set()
    for t in range(300):
        _, state = latte_causal_step(a[:, t], b[:, t], v[:, t], state)
        sizes.add(sum(x.numel() for x in state))
    assert sizes == {2 * 3 * 4 * (6 + 1)}  # B * H * Lh * (Dv + 1)


def test_packed_documents_do_not_see_each_other():
    lens = [5, 1, 40, 17]
    a, b, v = inputs(sum(lens), 4, 6, B=1)
    cu = torch.tensor([0, 5, 6, 46, 63])
    y, st = latte_causal(a, b, v, chunk_size=16, cu_seqlens=cu, output_final_state=True)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_doc, st_doc = latte_causal(a[:, s:e], b[:, s:e], v[:, s:e], chunk_size=16, output_final_state=True)
        assert rel_err(y[:, s:e], y_doc) < 1e-12
        assert rel_err(st.S[i], st_doc.S[0]) < 1e-12


def test_mask_removes_tokens_exactly():
    a, b, v = inputs(40, 4, 6, B=1)
    mask = torch.ones(1, 40, dtype=torch.bool)
    mask[0, [0, 1, 7, 20, 21, 22, 39]] = False
    y, st = latte_causal(a, b, v, chunk_size=8, mask=mask, output_final_state=True)
    keep = mask[0]
    y_kept, st_kept = latte_causal(a[:, keep], b[:, keep], v[:, keep], chunk_size=8, output_final_state=True)
    assert rel_err(y[:, keep], y_kept) < 1e-12
    assert rel_err(st.S, st_kept.S) < 1e-12


@pytest.mark.parametrize("mix_one_hot", [True])
def test_rows_are_probability_vectors(mix_one_hot):
    T = 37
    a, b, _ = inputs(T, 5, 1, B=1, H=2, scale=4.0)
    v = torch.eye(T, dtype=torch.float64)[None, :, None, :].expand(1, T, 2, T)  # one-hot values
    y, _ = latte_causal(a, b, v, chunk_size=8)
    A = y[0].permute(1, 0, 2)  # [H, t, s]
    assert (A >= -1e-15).all()
    assert A.triu(1).abs().max() < 1e-15
    assert torch.allclose(A.sum(-1), torch.ones(2, T, dtype=torch.float64), atol=1e-12)
    assert rel_err(A, R.latte_causal_matrix(a, b)[0]) < 1e-10


EXTREMES = {
    "std40": lambda b: b * 40,
    "spike80_late_in_chunk": lambda b: b.index_fill(1, torch.tensor([14, 15, 46, 47]), 80.0),
    "minus1e4": lambda b: b * 0 - 1e4,
    "all_equal": lambda b: b * 0 + 3.0,
    "huge_negative_then_large": lambda b: torch.cat([b[:, :20] - 500, b[:, 20:] + 60], 1),
}


@pytest.mark.parametrize("kind", list(EXTREMES))
def test_extreme_logits_finite_and_exact(kind):
    a, b, v = inputs(64, 8, 16)
    b = EXTREMES[kind](b)
    a = a * (40 if kind == "std40" else 1)
    y_ref, _ = R.latte_causal(a, b, v)
    y, _ = latte_causal(a.float(), b.float(), v.float(), chunk_size=16)
    assert torch.isfinite(y).all()
    assert rel_err(y, y_ref) < 1e-4
    _, g = grads_of(lambda a, b, v: latte_causal(a, b, v, chunk_size=16)[0], [a.float(), b.float(), v.float()])
    _, g_ref = grads_of(lambda a, b, v: R.latte_causal(a, b, v)[0], [a, b, v])
    for x, xr in zip(g, g_ref):
        assert torch.isfinite(x).all()
        assert rel_err(x, xr, floor=1.0) < 1e-3  # dy, v ~ 1: gradients are O(1)


def test_bf16_inputs_stay_finite_and_close():
    a, b, v = inputs(96, 8, 16, scale=30.0, dtype=torch.float32)
    y32, _ = latte_causal(a, b, v, chunk_size=32)
    y16, st = latte_causal(a.bfloat16(), b.bfloat16(), v.bfloat16(), chunk_size=32, output_final_state=True)
    assert y16.dtype == torch.bfloat16 and st.S.dtype == torch.float32
    assert torch.isfinite(y16).all()
    # bf16 rounding of the inputs (8 bits of mantissa) dominates the error
    y_rounded, _ = latte_causal(a.bfloat16().float(), b.bfloat16().float(), v.bfloat16().float(), chunk_size=32)
    assert rel_err(y16, y_rounded) < 1e-2
    assert rel_err(y16, y32) < 0.1


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("scale", [1.0, 40.0, 100.0])
def test_gradients_with_state_and_mask_for_spread_logits(monkeypatch, scale, keep):
    """z grows by far more than exp's range inside chunks and sub-chunks (std
    40, 100): the one intra-chunk form stays exact, forward and backward,
    whether the backward reuses the forward's weights or rebuilds them."""
    import latte.ops.latte.chunked as K

    if not keep:
        monkeypatch.setattr(K, "_KEEP_ELEMS", 0)
    a, b, v = inputs(50, 6, 5, scale=scale)
    S0, z0 = random_state(2, 3, 6, 5)
    mask = torch.rand(2, 50) > 0.2

    def fast(a, b, v, S0, z0):
        y, st = latte_causal(
            a, b, v, chunk_size=16, initial_state=LatteState(S0, z0), mask=mask, output_final_state=True
        )
        return torch.cat([y[mask].flatten(), st.S.flatten(), st.z.flatten()])

    def ref(a, b, v, S0, z0):
        y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0), mask=mask)
        return torch.cat([y[mask].flatten(), S.flatten(), z.flatten()])

    out, g = grads_of(fast, [a, b, v, S0, z0])
    out_ref, g_ref = grads_of(ref, [a, b, v, S0, z0])
    assert rel_err(out, out_ref) < 1e-10
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-8, name


def test_log_normalisers_exact_for_any_growth():
    """z from the running-max recurrence against float64 logcumsumexp, in
    float32, where z jumps by ~90 inside a chunk, a chunk starts far below its
    own max from an empty state, and masked tokens follow a finite state.
    The kernel works in base 2: logits in, normalisers out, times log2(e)."""
    from latte.ops._checks import NEG
    from latte.ops._exp import LOG2E
    from latte.ops.latte.intra_chunk import log_normalisers

    G, T, L, C = 6, 96, 4, 16
    b = torch.randn(G, T, L) * 3
    b[0, 40] = 100.0
    b[2, :8] = -200.0
    b[3] *= 40
    b[1, :10] = NEG
    z0 = torch.full((G, L), float("-inf"))
    z0[1] = 5.0
    sub_chunk_major = b.view(G, T // 8, 8, L).transpose(0, 1).contiguous()  # [M, G, 8, L]
    z = torch.empty_like(sub_chunk_major)
    r, z_last = log_normalisers(sub_chunk_major * LOG2E, z0 * LOG2E, C // 8, z)  # sub-chunks of 8
    z_ref = torch.logaddexp(torch.logcumsumexp(b.double(), 1), z0.double().unsqueeze(1)) * LOG2E  # [G, T, L]
    assert torch.allclose(z.transpose(0, 1).reshape(G, T, L).double(), z_ref, rtol=1e-6, atol=1e-5)
    r_ref = torch.cat([z0.double()[:, None], z_ref[:, 7:-1:8]], 1)  # z before each sub-chunk: [G, T / 8, L]
    r_time = r.transpose(0, 1)
    assert torch.equal(r_time[:, 0], z0 * LOG2E)
    assert torch.allclose(r_time[:, 1:].double(), r_ref[:, 1:], rtol=1e-6, atol=1e-5)
    assert torch.allclose(z_last.double(), z_ref[:, -1], rtol=1e-6, atol=1e-5)


SHAPES = {"sweep": (4, 64, 2, 32, 32), "long": (2, 640, 1, 8, 8)}  # B, T, H, Lh, Dv (sweep: B=64 in training)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_input_distributions_match_reference(shape, dist):
    """The benchmark distributions (std 1 ... 100 key and query logits, +80
    spikes, all-padding rows) at the research-sweep and a long shape: float32
    and float64 against the float64 reference, forward and gradients."""
    B, T, H, L, D = SHAPES[shape]
    a, b = (dist_logits(torch.randn(B, T, H, L, dtype=torch.float64), dist) for _ in range(2))
    v = torch.randn(B, T, H, D, dtype=torch.float64)
    mask = dist_mask(dist, B, T)
    real = torch.ones(B, T, dtype=torch.bool) if mask is None else mask
    rows = real.any(1)  # the reference has no distribution for a row without tokens
    cot = torch.randn(B, T, H, D, dtype=torch.float64) * real[..., None, None]

    def fast(a, b, v):
        return latte_causal(a, b, v, mask=mask)[0]

    for dtype, tol_y, tol_g in ((torch.float32, 1e-4, 1e-3), (torch.float64, 1e-10, 1e-9)):
        leaves = [x.to(dtype).requires_grad_() for x in (a, b, v)]
        y = fast(*leaves)
        g = torch.autograd.grad(y, leaves, cot.to(dtype))
        assert torch.isfinite(y).all() and all(torch.isfinite(x).all() for x in g)
        ref_leaves = [x[rows].clone().requires_grad_() for x in (a, b, v)]
        y_ref = R.latte_causal(*ref_leaves, mask=None if mask is None else mask[rows])[0]
        g_ref = torch.autograd.grad(y_ref, ref_leaves, cot[rows])
        assert rel_err(y[rows][real[rows]], y_ref[real[rows]]) < tol_y
        for x, xr in zip(g, g_ref):
            assert rel_err(x[rows], xr, floor=1.0) < tol_g
        if mask is not None:
            assert g[1][~mask].abs().max() == 0  # padded keys get no gradient


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_many_segments_equal_reference(monkeypatch, scale, keep):
    """Long sequences run in segments of chunks (states carried forward, reverse
    states backward); force one or two chunks per segment at test sizes. The
    backward either reuses the forward's factors and diagonal weights (small
    calls) or rebuilds them (keep=False: what long sequences do)."""
    import latte.ops.latte.chunked as K

    if not keep:
        monkeypatch.setattr(K, "_KEEP_ELEMS", 0)
    a, b, v = inputs(45, 6, 5, scale=scale)
    S0, z0 = random_state(2, 3, 6, 5)
    mask = torch.rand(2, 45) > 0.2
    with K.segment_elems(6 * 8 * 8):  # G=6, C=8, width 8 -> 1 chunk per segment
        assert len(K._segments(6, 6, 8, 8)) == 6
    assert len(K._segments(6, 6, 8, 8)) == 1  # the block's budget ends with it

    def fast(a, b, v, S0, z0):
        y, st = latte_causal(
            a, b, v, chunk_size=8, initial_state=LatteState(S0, z0), mask=mask, output_final_state=True
        )
        return torch.cat([y[mask].flatten(), st.S.flatten(), st.z.flatten()])

    def ref(a, b, v, S0, z0):
        y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0), mask=mask)
        return torch.cat([y[mask].flatten(), S.flatten(), z.flatten()])

    with K.segment_elems(6 * 8 * 8):
        out, g = grads_of(fast, [a, b, v, S0, z0])
    out_ref, g_ref = grads_of(ref, [a, b, v, S0, z0])
    assert rel_err(out, out_ref) < 1e-10
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-8, name


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize(
    "chunks,with_state,scale", [(2, True, 1.0), (3, False, 40.0), (5, True, 40.0), (37, True, 1.0)]
)
def test_log_depth_chunk_scan_equals_reference(monkeypatch, chunks, with_state, scale, keep):
    """The chunk-to-chunk scan (log2(n) steps over n chunks, forward and
    reverse): chunk counts that are and are not powers of two, the last
    chunk partly padding, with and without an initial state, masked tokens,
    one segment; forward, final state and every gradient against float64."""
    import latte.ops.latte.chunked as K

    if not keep:
        monkeypatch.setattr(K, "_KEEP_ELEMS", 0)
    T = chunks * 8 - 3
    a, b, v = inputs(T, 4, 3, scale=scale)
    state = random_state(2, 3, 4, 3) if with_state else None
    mask = torch.rand(2, T) > 0.2
    mask[:, 0] = True
    leaves = [a, b, v] + (list(state) if with_state else [])

    def fast(a, b, v, *st):
        y, out = latte_causal(
            a, b, v, chunk_size=8, initial_state=LatteState(*st) if st else None, mask=mask, output_final_state=True
        )
        return torch.cat([y[mask].flatten(), out.S.flatten(), out.z.flatten()])

    def ref(a, b, v, *st):
        y, (S, z) = R.latte_causal(a, b, v, initial_state=st or None, mask=mask)
        return torch.cat([y[mask].flatten(), S.flatten(), z.flatten()])

    out, g = grads_of(fast, leaves)
    out_ref, g_ref = grads_of(ref, leaves)
    assert rel_err(out, out_ref) < 1e-10
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-8


def test_aten_ops_per_forward_backward_grow_at_most_by_a_log_factor():
    """Issue 42: on a GPU every ATen op is a launch. From T = 1K to 16K (16x
    the chunks, one segment) the ops of one forward+backward grow <= 1.5x
    (the log-depth chunk scan adds a few per doubling); a call after the
    first builds no tensor from Python data (lift_fresh: torch.tensor(list))."""
    from latte.bench import op_count

    shape = (1, 1, 2, 2)
    small = op_count.count(op_count.fwd_bwd(1024, shape))
    large = op_count.count(op_count.fwd_bwd(16384, shape))
    assert large.total <= 1.5 * small.total, (small.total, large.total)
    assert large.by_op["aten.lift_fresh"] == 0 and small.by_op["aten.lift_fresh"] == 0


def test_aten_ops_under_a_gpus_segments_grow_at_most_by_a_log_factor_at_the_bench_shape():
    """Issue 42's CPU target at `latte bench ops`'s shape (H 8, Lh 32, Dv 64),
    counted on `meta` tensors under an 80 GB GPU's segment policy: from T = 1K
    to 16K the ops of one forward+backward grow <= 1.5x. The same count under
    segments of 16 MB per temporary (the CPU's: 8 segments at 16K) grows far
    more, so the bound is the segment policy's and the batched chunk scan's,
    and this test fails if a GPU's segments shrink to the CPU's."""
    from latte.bench import op_count
    from latte.ops.latte import chunked as K

    shape = op_count.SHAPES["bench ops (B1 H8 Lh32 Dv64)"]
    assert shape == (1, 8, 32, 64)

    def ratio(elems):
        small, large = (op_count.count(op_count.fwd_bwd(T, shape, "meta"), elems).total for T in (1024, 16384))
        return large / small

    assert op_count.POLICIES[op_count.CUDA_POLICY] == ("meta", K.cuda_segment_elems(80 * 10**9))
    assert ratio(K.cuda_segment_elems()) <= 1.5
    assert ratio(1 << 22) > 1.5  # per 16 MB: the count grows with the segments


def test_segment_elems_is_scoped_and_checked():
    """The segment budget fixed by segment_elems holds inside its block only
    (restored after an error too) and overrides the device's policy."""
    from latte.ops.latte import chunked as K

    default = K._segment_elems(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="inside"):
        with K.segment_elems(7):
            assert K._segment_elems(torch.device("cpu")) == K._segment_elems(torch.device("meta")) == 7
            with K.segment_elems(9):
                assert K._segment_elems(None) == 9
            assert K._segment_elems(None) == 7
            raise RuntimeError("inside")
    assert K._segment_elems(torch.device("cpu")) == default == K._SEGMENT_ELEMS
    assert K.cuda_segment_elems(80 * 10**9) == 80 * 10**9 // 4 // 256
    assert K.cuda_segment_elems(10**6) == K._SEGMENT_ELEMS  # never below the CPU's
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="elems must be an int >= 1"):
            with K.segment_elems(bad):
                pass


def test_op_count_reports_each_shape_under_each_policy():
    """`latte bench ops --count-ops`'s rows and table: the CPU policy for
    each shape, the GPU policy for the bench and issue-42 shapes, by T."""
    from latte.bench import op_count

    res = op_count.run(seqs=[64, 128])
    got = [(r["shape"], r["policy"]) for r in res["results"]]
    assert got == [row for row in op_count.ROWS for _ in (64, 128)]
    assert {p for _, p in got} == {"cpu", op_count.CUDA_POLICY}
    md = op_count.markdown(res)
    assert md.count("(1.00x)") == len(op_count.ROWS) and op_count.CUDA_POLICY in md


@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_scan_equals_the_sums_it_stands_for(reverse):
    """_chunk_scan_ (Brent-Kung, strided in-place steps) against the O(n^2)
    sums Y_k = sum_i 2^(E_i - E_k) Y_i over i <= k (reverse: i >= k), for
    every n up to 40 (powers of two and not)."""
    from latte.ops.latte.chunked import _chunk_scan_

    for n in range(1, 41):
        Y = torch.randn(n, 2, 3, 4, dtype=torch.float64)
        E = torch.sort(torch.randn(n, 2, 3, dtype=torch.float64) * 3, 0).values
        i, k = torch.arange(n)[None, :], torch.arange(n)[:, None]
        keep = (i >= k) if reverse else (i <= k)
        diff = (E[None, :] - E[:, None]) * (-1 if reverse else 1)  # [k, i]: E_i - E_k (reverse: E_k - E_i)
        W = torch.where(keep[..., None, None], torch.exp2(diff), torch.zeros(()))
        ref = torch.einsum("kigl,igld->kgld", W, Y)
        out = Y.clone()
        _chunk_scan_(out, E, reverse)
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12), n
