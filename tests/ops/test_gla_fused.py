"""backend "fla", construction "fused" (latte/ops/latte/gla.py: fused_chunked,
fused_step; the custom ops of gla_ops.py): fla's gate and chunk_gla as
torch.library ops, checked on the CPU through their pure-torch stand-ins
(the same op names) against the float64 reference, forward and gradients.
With LATTE_FLA_INTERPRET=1 (and TRITON_INTERPRET=1) in the environment the
same tests run fla's real Triton kernels, under Triton's CPU interpreter
(patched: tests/gpu/interpret_fla.py), instead of the stand-ins; the
float64 cases then skip (fla computes in float32). `python
tests/gpu/interpret_fla.py` runs them all so (minutes);
tests/ops/test_gla_interpret.py a capped float32 subset in the suite.
"""

import os

import pytest
import torch

from latte.ops import LatteState, latte_causal, latte_causal_step
from latte.ops import backend as BK
from latte.ops import reference as R
from latte.ops.latte import gla, gla_ops
from tests.helpers import grads_of, rel_err
from tests.ops.test_gla_backend import LOGITS, fla_flat, inputs, random_state, ref_flat

f64 = torch.float64
INTERPRET = os.environ.get("LATTE_FLA_INTERPRET") == "1"
stand_ins_only = pytest.mark.skipif(INTERPRET, reason="float64: fla's kernels compute in float32")

if INTERPRET:  # fla's kernels on CPU tensors, through Triton's interpreter
    from tests.gpu.interpret_fla import patch_triton

    patch_triton()


@pytest.fixture
def fused(monkeypatch):
    """backend "fla" usable (pretended: no CUDA here), construction "fused";
    the custom ops run fla's kernels under the interpreter with
    LATTE_FLA_INTERPRET=1, else their pure-torch stand-ins."""
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "fused")
    monkeypatch.setattr(gla_ops, "CPU_IMPL", "triton" if INTERPRET else "reference")


def check(out, g, out_ref, g_ref, tol_out, tol_grad, names="a b v S0 z0"):
    """Gradients relative to their largest entry, at least 1e-2 (a's gradient
    at T = 1 is 0 exactly, float32's rounding of it ~1e-8)."""
    assert rel_err(out, out_ref) < tol_out
    for name, x, xr in zip(names.split(), g, g_ref):
        assert rel_err(x, xr, floor=1e-2 if x.dtype == torch.float32 else 1e-12) < tol_grad, name


@pytest.mark.parametrize("T,scale,spikes", LOGITS)
@pytest.mark.parametrize(
    "dtype,tol", [pytest.param(f64, (1e-10, 1e-8), marks=stand_ins_only), (torch.float32, (2e-5, 2e-4))]
)
def test_fused_matches_reference(fused, T, scale, spikes, dtype, tol):
    a, b, v = inputs(T, scale=scale, spikes=spikes)
    S0, z0 = random_state(2, 3, 5, 7)
    for state in ([], [S0, z0]):
        out, g = grads_of(fla_flat, [x.to(dtype) for x in (a, b, v, *state)])
        out_ref, g_ref = grads_of(ref_flat, [a, b, v, *state])
        check(out, g, out_ref, g_ref, *tol)


@pytest.mark.parametrize("offset", [1e3, 1e4])
@pytest.mark.parametrize("centred", [True, False])
def test_common_offset(fused, monkeypatch, offset, centred):
    """Key logits sharing a large offset, float32: centring keeps the
    reference's precision; without it (measured here, stated in docs/gpu.md
    §2.3) the error grows with the offset's float32 spacing."""
    if not centred:
        monkeypatch.setattr(gla, "_HALF", gla._HALF + (torch.float32,))  # skips centring as for bf16
    a, b, v = inputs(70, scale=3.0)
    b = (b + offset).float().double()  # the reference sees float32's values: only the arithmetic differs
    out, g = grads_of(fla_flat, [x.float() for x in (a, b, v)])
    out_ref, g_ref = grads_of(ref_flat, [a, b, v])
    err = max([rel_err(out, out_ref)] + [rel_err(x, xr) for x, xr in zip(g, g_ref)])
    print(f"offset {offset:g} centred {centred}: worst relative error {err:.1e}")
    if centred:
        assert err < 1e-5
    else:
        assert err > 1e-5  # the loss centring avoids is real


@pytest.mark.skipif(INTERPRET, reason="Triton 3.9's interpreter gets chunk_gla wrong in bf16 (its dots)")
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_half_precision_keys_need_no_centring(fused, offset):
    """bf16 key logits are not centred (docs/gpu.md §2.3): against float64 on
    the same bf16 values, the output stays at bf16's own rounding (~4e-3)."""
    a, b, v = inputs(70, scale=3.0)
    a, b, v = (x.bfloat16() for x in (a, b + offset, v))
    y = latte_causal(a, b, v, backend="fla")[0]
    y_ref = R.latte_causal(a.double(), b.double(), v.double())[0]
    assert y.dtype == torch.bfloat16 and rel_err(y.float(), y_ref) < 1e-2


def test_packed_documents_with_initial_states_and_mask(fused):
    lengths = [5, 64, 1, 30]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    a, b, v = inputs(sum(lengths), B=1, scale=20.0)
    S0, z0 = random_state(len(lengths), 3, 5, 7)
    mask = torch.ones(1, sum(lengths), dtype=torch.bool)
    mask[0, 5:9] = False  # left padding of the second document
    mask[0, 80:] = False  # right padding of the last

    def fast(a, b, v, S0, z0):
        kw = dict(initial_state=LatteState(S0, z0), output_final_state=True, cu_seqlens=cu, mask=mask)
        y, st = latte_causal(a, b, v, backend="fla", **kw)
        return torch.cat([y.masked_fill(~mask[:, :, None, None], 0.0).flatten(), st.S.flatten(), st.z.flatten()])

    out, g = grads_of(fast, [x.float() for x in (a, b, v, S0, z0)])

    def per_doc(a, b, v, S0, z0):
        ys, Ss, zs = [], [], []
        for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            st = (S0[n : n + 1], z0[n : n + 1])
            y, (S, z) = R.latte_causal(a[:, s:e], b[:, s:e], v[:, s:e], initial_state=st, mask=mask[:, s:e])
            ys.append(y.masked_fill(~mask[:, s:e, None, None], 0.0))
            Ss.append(S)
            zs.append(z)
        return torch.cat([torch.cat(ys, 1).flatten(), torch.cat(Ss).flatten(), torch.cat(zs).flatten()])

    out_ref, g_ref = grads_of(per_doc, [a, b, v, S0, z0])
    check(out, g, out_ref, g_ref, 2e-5, 2e-4)


@pytest.mark.parametrize("spikes", [0.0, 80.0])
def test_left_padding_then_spikes(fused, spikes):
    """Left padding, then +80 spikes: the first real token's gate (z jumps from
    NEG) is clamped at G_FLOOR; padded tokens add nothing; gradients too."""
    a, b, v = inputs(40, scale=5.0, spikes=spikes)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, :7] = False
    mask[1, 31:] = False
    mask[1, 12] = False
    b[0, 7] += 80.0  # a spike on the first real token

    def fast(a, b, v):
        y, st = latte_causal(a, b, v, mask=mask, backend="fla", output_final_state=True)
        return torch.cat([y.masked_fill(~mask[:, :, None, None], 0.0).flatten(), st.S.flatten(), st.z.flatten()])

    def ref(a, b, v):
        """The reference on each row's real tokens alone (its masked outputs
        are NaN after left padding, and so are its gradients)."""
        ys, Ss, zs = [], [], []
        for r in range(2):
            idx = mask[r].nonzero()[:, 0]
            y_r, (S, z) = R.latte_causal(a[r : r + 1, idx], b[r : r + 1, idx], v[r : r + 1, idx])
            ys.append(torch.zeros_like(v[r]).index_put((idx,), y_r[0]))
            Ss.append(S)
            zs.append(z)
        return torch.cat([torch.stack(ys).flatten(), torch.cat(Ss).flatten(), torch.cat(zs).flatten()])

    out, g = grads_of(fast, [x.float() for x in (a, b, v)])
    out_ref, g_ref = grads_of(ref, [a, b, v])
    check(out, g, out_ref, g_ref, 2e-5, 2e-4, "a b v")  # padding gets no gradient in either
    k, gate, _, _ = torch.ops.latte.additive_gate(
        b[:1].float().masked_fill(~mask[:1, :, None, None], -1e30), None, None, torch.float32, False
    )
    assert gate[0, 7].min() < gla.G_FLOOR  # the raw gate of the first real token, before the clamp


def test_fully_padded_row_ends_in_the_empty_state(fused):
    a, b, v = (x.float() for x in inputs(20))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1] = False
    y, st = latte_causal(a, b, v, mask=mask, backend="fla", output_final_state=True)
    assert torch.equal(st.S[1], torch.zeros_like(st.S[1]))
    assert torch.equal(st.z[1], torch.full_like(st.z[1], float("-inf")))
    y_ref, (S_ref, z_ref) = R.latte_causal(a[:1].double(), b[:1].double(), v[:1].double())
    assert rel_err(st.S[:1], S_ref) < 2e-5 and rel_err(st.z[:1], z_ref) < 1e-6
    # and continuing from it is continuing from nothing
    y2, st2 = latte_causal(
        a[1:], b[1:], v[1:], backend="fla", initial_state=LatteState(st.S[1:], st.z[1:]), output_final_state=True
    )
    y3, st3 = latte_causal(a[1:], b[1:], v[1:], backend="fla", output_final_state=True)
    assert rel_err(y2, y3) < 1e-6 and rel_err(st2.S, st3.S) < 1e-6


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_decode_steps(fused, scale):
    a, b, v = inputs(20, scale=scale)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, 9] = False
    state, ys = None, []
    for t in range(20):
        y, state = latte_causal_step(*(x[:, t].float() for x in (a, b, v)), state, mask_t=mask[:, t], backend="fla")
        ys.append(y)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v, mask=mask)
    assert rel_err(torch.stack(ys, 1)[mask], y_ref[mask]) < 2e-5
    assert rel_err(state.S, S_ref) < 2e-5 and rel_err(state.z, z_ref) < 1e-6


def test_size_rule_keeps_the_two_level_construction_for_long_lone_sequences(monkeypatch):
    """ "auto": the fused gate unless it would run few programs (N x H*L/32)
    each scanning a long sequence; explicit names are kept whatever the size."""
    monkeypatch.setattr(BK, "_construction", None)
    monkeypatch.setattr(BK, "_env_construction", None)
    assert gla.construction(1, 65536, 16, 128) == "eager"  # 64 programs, 64K tokens each
    assert gla.construction(4, 16384, 16, 128) == "fused"  # 256 programs
    assert gla.construction(1, 8192, 16, 128) == "fused"  # short enough
    assert gla.construction(1, 1, 1, 4) == "fused"  # a decoding step
    with BK.using_fla_construction("fused"):
        assert gla.construction(1, 65536, 16, 128) == "fused"
    with BK.using_fla_construction("compiled"):
        assert gla.construction(4, 16384, 16, 128) == "compiled"


def test_auto_runs_the_construction_the_rule_names(monkeypatch):
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "auto")
    ran = []
    monkeypatch.setattr(gla, "fused_chunked", lambda *x: ran.append("fused") or (None, None, None))
    monkeypatch.setattr(gla, "_inputs", lambda *x, **kw: ran.append("eager") or (None,) * 4)
    monkeypatch.setattr(gla, "_call", lambda *x, **kw: (None, None))
    monkeypatch.setattr(gla, "_kernels", lambda: (None, None))
    a = torch.zeros(1, 40, 2, 4)
    gla.gla_chunked(a, a, a)
    monkeypatch.setattr(gla, "GATE_MAX_SERIAL_T", 32)  # 1 program scanning 40 tokens: too long now
    gla.gla_chunked(a, a, a)
    assert ran == ["fused", "eager"]


@stand_ins_only
def test_custom_ops_gradcheck_and_fake():
    """The CPU stand-ins' registered backward against finite differences
    (float64, small shapes: each perturbation reruns a Python loop), and
    their fake implementations against them (opcheck)."""
    x, z0 = torch.randn(2, 5, 2, 3, dtype=f64), torch.randn(2, 1, 2, 3, dtype=f64)
    cu = torch.tensor([0, 2, 2, 5])
    for args in [(x, z0, None), (x, None, None), (x[:1], torch.randn(3, 1, 2, 3, dtype=f64), cu)]:
        diff = [t.clone().requires_grad_() if t is not None and t is not cu else t for t in args]
        inputs = tuple(t for t in diff if t is not None and t is not cu)

        def gate(*ts, diff=diff):
            it = iter(ts)
            full = [next(it) if t is not None and t is not cu else t for t in diff]
            return torch.ops.latte.additive_gate(*full, f64, True)[:3]

        assert torch.autograd.gradcheck(gate, inputs)
    torch.library.opcheck(torch.ops.latte.additive_gate.default, (x, z0, None, f64, True))
    q, k, v = (torch.randn(2, 4, 2, 3, dtype=f64, requires_grad=True) for _ in range(3))
    g = (-torch.rand(2, 4, 2, 3, dtype=f64)).requires_grad_()
    h0 = torch.randn(2, 2, 3, 3, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: torch.ops.latte.chunk_gla(*t, None, 1.0)[:2], (q, k, v, g, h0))
    assert torch.autograd.gradcheck(lambda *t: torch.ops.latte.fused_recurrent_gla(*t, 1.0), (q, k, v, g, h0))
    packed = tuple(t[:1].detach().requires_grad_() for t in (q, k, v, g))
    cu = torch.tensor([0, 1, 4])
    assert torch.autograd.gradcheck(lambda *t: torch.ops.latte.chunk_gla(*t, cu, 1.0)[:2], (*packed, h0))
    torch.library.opcheck(torch.ops.latte.chunk_gla.default, (q, k, v, g, h0, None, 1.0))
    assert gla_ops.CPU_IMPL == "reference"


def test_custom_ops_fake_matches_real_float32(fused):
    """Each op's fake (meta) implementation gives the shapes and dtypes of
    the real one (fla's kernels with LATTE_FLA_INTERPRET=1), bf16 and float32
    inputs, with and without optional tensors."""
    x = torch.randn(2, 70, 2, 16)
    for dt in (torch.float32, torch.bfloat16):
        for z0 in (None, torch.randn(2, 1, 2, 16)):
            torch.library.opcheck(torch.ops.latte.additive_gate.default, (x.to(dt), z0, None, dt, True))
    q, k, v = (torch.randn(2, 70, 2, 16).to(torch.bfloat16) for _ in range(3))
    g = -torch.rand(2, 70, 2, 16)
    # (chunk_gla's A, its intra-chunk scores kept for the backward, is written
    # by fla below the diagonal blocks only: two runs differ above, so the
    # check comparing two runs' outputs is left out for the real kernels)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    for h0 in (None, torch.randn(2, 2, 16, 16)):
        torch.library.opcheck(torch.ops.latte.chunk_gla.default, (q, k, v, g, h0, None, 1.0), test_utils=tests)
        torch.library.opcheck(
            torch.ops.latte.fused_recurrent_gla.default, (q[:, :1], k[:, :1], v[:, :1], g[:, :1], h0, 1.0)
        )


def test_decode_step_gradients(fused):
    """Gradients through the step (the gate on one token, fused_recurrent_gla's
    registered backward) from a prefill state, against the float64 reference."""
    a, b, v = inputs(9, scale=10.0)

    def fast(a, b, v):
        _, st = latte_causal(a[:, :8], b[:, :8], v[:, :8], backend="fla", output_final_state=True)
        y, st = latte_causal_step(a[:, 8], b[:, 8], v[:, 8], st, backend="fla")
        return torch.cat([y.flatten(), st.S.flatten(), st.z.flatten()])

    def ref(a, b, v):
        y, (S, z) = R.latte_causal(a, b, v)
        return torch.cat([y[:, -1].flatten(), S.flatten(), z.flatten()])

    out, g = grads_of(fast, [x.float() for x in (a, b, v)])
    out_ref, g_ref = grads_of(ref, [a, b, v])
    check(out, g, out_ref, g_ref, 2e-5, 2e-4, "a b v")


@stand_ins_only
@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_latents_on_the_fused_construction(fused, monkeypatch, mix):
    import importlib

    M = importlib.import_module("latte.ops.macchiato")  # the module, not the function latte.ops exports
    monkeypatch.setattr(M, "resolve_latent", lambda backend, x: "fla")
    monkeypatch.setattr(M, "resolve_window", lambda backend, x, **kw: "tiles")
    B, T, H, L, E, W = 2, 50, 4, 3, 6, 9
    a, b = torch.randn(B, T, H, L, dtype=f64), torch.randn(B, T, H, L, dtype=f64) * 10
    q, k, v = (torch.randn(B, T, H, E, dtype=f64) for _ in range(3))
    gate = torch.randn(B, T, H, dtype=f64) if mix == "gate" else None
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :4] = False
    y = M.macchiato(a, b, v, q, k, window_size=W, mix=mix, gate=gate, mask=mask, backend="fla")[0]
    y_ref = R.macchiato(a, b, v, q, k, W, mix=mix, gate=gate, mask=mask)
    assert rel_err(y[mask], y_ref[mask]) < 1e-10


def test_gradients_of_sums_reach_the_kernels_contiguous(fused):
    """A loss that sums y and the final z hands the backward expanded
    (stride 0) gradients; fla's kernels index them as contiguous, so the ops
    make them so."""
    a, b, v = inputs(20, scale=5.0)
    S0, z0 = random_state(2, 3, 5, 7)

    def loss(a, b, v, S0, z0, fast):
        if fast:
            y, st = latte_causal(a, b, v, backend="fla", initial_state=LatteState(S0, z0), output_final_state=True)
            S, z = st.S, st.z
        else:
            y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0))
        return y.sum() + z.sum() + S.sum()

    args = [x.float().requires_grad_() for x in (a, b, v, S0, z0)]
    g = torch.autograd.grad(loss(*args, True), args)
    args_ref = [x.clone().requires_grad_() for x in (a, b, v, S0, z0)]
    g_ref = torch.autograd.grad(loss(*args_ref, False), args_ref)
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr, floor=1e-2) < 2e-4, name
