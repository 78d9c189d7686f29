"""backend "fla": causal Latte as a gated linear attention (latte/ops/latte/gla.py).

fla-core's Triton kernels need a GPU, so on CPU the construction (q, k, g,
state mapping, packing, masking) runs through stand-ins with chunk_gla's
signature: an exact float64 GLA loop, and fla-core's own pure-torch
reference (fla/ops/gla/naive.py, float32), both against the float64 Latte
reference, forward and gradients. tests/gpu/ runs the real kernels on CUDA.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from latte.ops import LatteState, latte_causal, latte_causal_step
from latte.ops import backend as BK
from latte.ops import reference as R
from latte.ops.latte import gla
from tests.helpers import grads_of, rel_err


def gla_loop(q, k, v, g, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
    """GLA by its definition, one step at a time, in float64:
    h_t = exp(g_t) h_{t-1} + k_t v_t^T, o_t = scale q_t h_t (chunk_gla's contract)."""
    bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    q, k, v, g = (x.double() for x in (q, k, v, g))
    ys, hs = [], []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        h = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])  # [B, H, L, D]
        if initial_state is not None:
            h = h + (initial_state if cu_seqlens is None else initial_state[n : n + 1]).double()
        for t in range(s, e):
            h = g[:, t].exp().unsqueeze(-1) * h + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
            ys.append(scale * torch.einsum("bhl,bhld->bhd", q[:, t], h))
        hs.append(h)
    return torch.stack(ys, 1), (torch.cat(hs) if output_final_state else None)


def fla_naive():
    """fla-core's naive_recurrent_gla, loaded from its file: the package's
    __init__ imports Triton, which a CPU machine need not have."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install 'latte[cuda]')")
    path = Path(list(spec.submodule_search_locations)[0]) / "ops" / "gla" / "naive.py"
    mod_spec = importlib.util.spec_from_file_location("_fla_gla_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    naive = mod.naive_recurrent_gla

    def chunk(q, k, v, g, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        qs = q * (scale * q.shape[-1] ** 0.5)  # naive_recurrent_gla always scales by K ** -0.5
        bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
        ys, hs = [], []
        for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            h0 = (
                None if initial_state is None else initial_state[n : n + 1] if cu_seqlens is not None else initial_state
            )
            y, h = naive(qs[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], initial_state=h0, output_final_state=True)
            ys.append(y)
            hs.append(h)
        return torch.cat(ys, 1), (torch.cat(hs) if output_final_state else None)

    def recurrent(q, k, v, gk, scale=1.0, initial_state=None, output_final_state=False):
        return chunk(q, k, v, gk, scale, initial_state, output_final_state)

    return chunk, recurrent


@pytest.fixture
def exact(monkeypatch):
    """backend "fla" usable (pretended: no CUDA here) with the exact float64
    GLA loop as its kernels, construction "eager" (test_gla_fused.py: "fused")."""
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "eager")
    monkeypatch.setattr(gla, "_kernels", lambda: (gla_loop, gla_loop))


@pytest.fixture
def naive(monkeypatch):
    """backend "fla" usable (pretended) with fla-core's naive_recurrent_gla as
    its kernels, construction "eager"."""
    kernels = fla_naive()
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "eager")
    monkeypatch.setattr(gla, "_kernels", lambda: kernels)


def fla(a, b, v, **kw):
    return latte_causal(a, b, v, backend="fla", **kw)


def inputs(T, L=5, D=7, B=2, H=3, scale=1.0, spikes=0.0):
    a = torch.randn(B, T, H, L, dtype=torch.float64)
    b = torch.randn(B, T, H, L, dtype=torch.float64) * scale
    if spikes:
        b = b + spikes * (torch.rand(B, T, H, L) < 0.05)
    v = torch.randn(B, T, H, D, dtype=torch.float64)
    return a, b, v


def random_state(B, H, L, D):
    return LatteState(torch.randn(B, H, L, D, dtype=torch.float64), torch.randn(B, H, L, dtype=torch.float64) * 3)


def flat(y, st):
    return torch.cat([y.flatten(), st.S.flatten(), st.z.flatten()])


def fla_flat(a, b, v, S0=None, z0=None, **kw):
    state = None if S0 is None else LatteState(S0, z0)
    return flat(*fla(a, b, v, initial_state=state, output_final_state=True, **kw))


def ref_flat(a, b, v, S0=None, z0=None, mask=None):
    y, (S, z) = R.latte_causal(a, b, v, initial_state=None if S0 is None else (S0, z0), mask=mask)
    return torch.cat([y.flatten(), S.flatten(), z.flatten()])


# (T, scale, spikes): normal logits, std 40, +80 spikes
LOGITS = [(1, 1.0, 0.0), (70, 1.0, 0.0), (70, 40.0, 0.0), (130, 1.0, 80.0)]


@pytest.mark.parametrize("T,scale,spikes", LOGITS)
def test_construction_is_exact_in_float64(exact, T, scale, spikes):
    a, b, v = inputs(T, scale=scale, spikes=spikes)
    S0, z0 = random_state(2, 3, 5, 7)
    for state in ([], [S0, z0]):
        out, g = grads_of(fla_flat, [a, b, v, *state])
        out_ref, g_ref = grads_of(ref_flat, [a, b, v, *state])
        assert rel_err(out, out_ref) < 1e-10
        for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
            assert rel_err(x, xr) < 1e-8, name


@pytest.mark.parametrize("T,scale,spikes", LOGITS)
def test_fla_naive_reference_matches_float64(naive, T, scale, spikes):
    a, b, v = inputs(T, scale=scale, spikes=spikes)
    S0, z0 = random_state(2, 3, 5, 7)
    args32 = [x.float() for x in (a, b, v, S0, z0)]
    out, g = grads_of(fla_flat, args32)
    out_ref, g_ref = grads_of(ref_flat, [a, b, v, S0, z0])
    assert out.dtype == torch.float32
    assert rel_err(out, out_ref) < 2e-5
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr) < 2e-4, name


@pytest.mark.parametrize("split", [1, 33, 69])
def test_continuation_equals_one_pass(naive, split):
    a, b, v = (x.float() for x in inputs(70, scale=10.0))
    y_full, st_full = fla(a, b, v, output_final_state=True)
    y1, st = fla(a[:, :split], b[:, :split], v[:, :split], output_final_state=True)
    y2, st2 = fla(a[:, split:], b[:, split:], v[:, split:], initial_state=st, output_final_state=True)
    assert rel_err(torch.cat([y1, y2], 1), y_full) < 1e-5
    assert rel_err(st2.S, st_full.S) < 1e-5 and rel_err(st2.z, st_full.z) < 1e-6


def test_packed_documents_with_initial_states(naive):
    lengths = [5, 64, 1, 30]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    a, b, v = inputs(sum(lengths), B=1, scale=20.0)
    S0, z0 = random_state(len(lengths), 3, 5, 7)
    out, g = grads_of(lambda *x: fla_flat(*x, cu_seqlens=cu), [x.float() for x in (a, b, v, S0, z0)])

    def per_doc(a, b, v, S0, z0):
        ys, Ss, zs = [], [], []
        for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            y, (S, z) = R.latte_causal(a[:, s:e], b[:, s:e], v[:, s:e], initial_state=(S0[n : n + 1], z0[n : n + 1]))
            ys.append(y)
            Ss.append(S)
            zs.append(z)
        return torch.cat([torch.cat(ys, 1).flatten(), torch.cat(Ss).flatten(), torch.cat(zs).flatten()])

    out_ref, g_ref = grads_of(per_doc, [a, b, v, S0, z0])
    assert rel_err(out, out_ref) < 2e-5
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr) < 2e-4, name


def test_padding_mask_left_and_right(naive):
    a, b, v = inputs(40, scale=5.0)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, :7] = False  # left padding: the first real token meets logits of -1e30 before it
    mask[1, 31:] = False
    mask[1, 12] = False
    y, st = fla(*(x.float() for x in (a, b, v)), mask=mask, output_final_state=True)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v, mask=mask)
    assert rel_err(y[mask], y_ref[mask]) < 2e-5
    assert rel_err(st.S, S_ref) < 2e-5 and rel_err(st.z, z_ref) < 1e-6


@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_decode_steps_equal_reference(naive, scale):
    a, b, v = inputs(20, scale=scale)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :3] = False
    state, ys = None, []
    for t in range(20):
        y, state = latte_causal_step(*(x[:, t].float() for x in (a, b, v)), state, mask_t=mask[:, t], backend="fla")
        ys.append(y)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v, mask=mask)
    assert rel_err(torch.stack(ys, 1)[mask], y_ref[mask]) < 2e-5
    assert rel_err(state.S, S_ref) < 2e-5 and rel_err(state.z, z_ref) < 1e-6


def test_half_precision_inputs_reach_the_kernel_in_their_dtype(monkeypatch):
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "eager")
    seen = []

    def spy(q, k, v, g, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        seen.append((q.dtype, k.dtype, v.dtype, g.dtype))
        return gla_loop(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)

    monkeypatch.setattr(gla, "_kernels", lambda: (spy, spy))
    a, b, v = (x.bfloat16() for x in inputs(9))
    y, st = fla(a, b, v, output_final_state=True)
    assert seen == [(torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32)]
    assert y.dtype == torch.bfloat16 and st.z.dtype == torch.float32


# ---- backend choice ----------------------------------------------------------


def test_explicit_fla_fails_clearly_on_cpu():
    a, b, v = (x.float() for x in inputs(8))
    with pytest.raises(ValueError, match="backend='fla': its kernels need CUDA tensors, got device cpu"):
        latte_causal(a, b, v, backend="fla")
    with pytest.raises(ValueError, match="backend='fla'"):
        latte_causal_step(a[:, 0], b[:, 0], v[:, 0], backend="fla")
    with pytest.raises(ValueError, match=r"backend: expected one of \('torch', 'fla', 'auto'\), got 'cuda'"):
        latte_causal(a, b, v, backend="cuda")


def test_auto_and_default_use_torch_on_cpu():
    a, b, v = (x.float() for x in inputs(8))
    y_torch = latte_causal(a, b, v, backend="torch")[0]
    assert torch.equal(latte_causal(a, b, v, backend="auto")[0], y_torch)
    assert torch.equal(latte_causal(a, b, v)[0], y_torch)
    assert BK.resolve_latent("auto", a) == "torch" and BK.resolve_window("auto", a) == "tiles"


def test_fla_backend_dispatches_when_usable(monkeypatch, exact):
    """Where fla is usable (here: pretended), latte_causal and the step run gla.py."""
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    a, b, v = inputs(12)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v)
    for name in ("fla", "auto"):
        y, st = latte_causal(a, b, v, backend=name, output_final_state=True)
        assert rel_err(y, y_ref) < 1e-10 and rel_err(st.z, z_ref) < 1e-12
        y1, _ = latte_causal_step(a[:, 0], b[:, 0], v[:, 0], backend=name)
        assert rel_err(y1, y_ref[:, 0]) < 1e-10


def test_process_default(monkeypatch):
    a = torch.zeros(1, 2, 1, 1)
    monkeypatch.setattr(BK, "_env_default", "fla")
    assert BK.get_backend() == "fla"
    BK.set_backend("torch")
    try:
        assert BK.get_backend() == "torch" and BK.resolve_latent(None, a) == "torch"
    finally:
        BK.set_backend(None)
    monkeypatch.setattr(BK, "_env_default", "gpu")
    with pytest.raises(ValueError, match="LATTE_BACKEND"):
        BK.get_backend()
    with pytest.raises(ValueError, match="backend: expected one of"):
        BK.set_backend("triton")


@pytest.fixture
def compiled(monkeypatch):
    """The "compiled" construction in force; calls of the compiled function counted."""
    calls = []
    real = gla._compiled_inputs

    def counted():
        calls.append(1)
        return real()

    monkeypatch.setattr(gla, "_compiled_inputs", counted)
    monkeypatch.setattr(BK, "_construction", "compiled")
    return calls


def test_compiled_construction_is_exact_in_float64(exact, compiled):
    """torch.compile's fused q/k/g (inductor, here its CPU code) against the
    float64 reference, forward and gradients: spikes, an initial state and
    left padding in one call (one graph), then packed documents (a second)."""
    a, b, v = inputs(130, scale=1.0, spikes=80.0)
    S0, z0 = random_state(2, 3, 5, 7)
    mask = torch.ones(2, 130, dtype=torch.bool)
    mask[0, :9] = False
    out, g = grads_of(lambda *x: fla_flat(*x, mask=mask), [a, b, v, S0, z0])
    out_ref, g_ref = grads_of(lambda *x: ref_flat(*x, mask=mask), [a, b, v, S0, z0])
    assert compiled and rel_err(out, out_ref) < 1e-10
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x, xr) < 1e-8, name
    cu = torch.tensor([0, 5, 70, 71, 130])
    a1, b1, v1 = (x[:1] for x in (a, b, v))
    state = random_state(4, 3, 5, 7)
    y, st = fla(a1, b1, v1, initial_state=state, output_final_state=True, cu_seqlens=cu)
    assert len(compiled) == 2
    BK.set_fla_construction("eager")  # (the fixture's monkeypatch restores the default after)
    y_eager, st_eager = fla(a1, b1, v1, initial_state=state, output_final_state=True, cu_seqlens=cu)
    assert len(compiled) == 2  # the eager call did not use it
    assert rel_err(y, y_eager) < 1e-12 and rel_err(st.S, st_eager.S) < 1e-12


def test_compiled_construction_is_not_nested_in_a_compiled_caller(exact, compiled, monkeypatch):
    """Inside a caller torch.compile traces, the construction is traced with
    it (a compiled function called while tracing would break the graph)."""
    a, b, v = inputs(9)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    fla(a, b, v)
    assert not compiled
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(
        gla, "_compiled_inputs", lambda: lambda *x, **kw: compiled.append(1) or gla.kernel_inputs(*x, **kw)
    )
    fla(a, b, v)
    assert compiled == [1]


def test_fla_construction_default_and_errors(monkeypatch):
    monkeypatch.setattr(BK, "_env_construction", None)
    assert BK._construction is None and BK.get_fla_construction() == "auto"  # nothing before left it set
    with BK.using_fla_construction("compiled"):
        assert BK.get_fla_construction() == "compiled"
    assert BK._construction is None
    monkeypatch.setattr(BK, "_env_construction", "compiled")
    assert BK.get_fla_construction() == "compiled"
    BK.set_fla_construction("eager")
    try:
        assert BK.get_fla_construction() == "eager"
    finally:
        BK.set_fla_construction(None)
    monkeypatch.setattr(BK, "_env_construction", "fusion")
    with pytest.raises(
        ValueError,
        match=r"LATTE_FLA_CONSTRUCTION \(environment\): expected one of "
        r"\('auto', 'fused', 'eager', 'compiled'\), got 'fusion'",
    ):
        BK.get_fla_construction()
    with pytest.raises(ValueError, match="fla construction: expected one of"):
        BK.set_fla_construction("inductor")


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_latents_on_gla_match_reference(monkeypatch, exact, mix):
    import importlib

    M = importlib.import_module("latte.ops.macchiato")  # the module, not the function latte.ops exports
    monkeypatch.setattr(M, "resolve_latent", lambda backend, x: "fla")
    monkeypatch.setattr(M, "resolve_window", lambda backend, x, **kw: "tiles")
    B, T, H, L, E, W = 2, 50, 4, 3, 6, 9
    a, b = torch.randn(B, T, H, L, dtype=torch.float64), torch.randn(B, T, H, L, dtype=torch.float64) * 10
    q, k, v = (torch.randn(B, T, H, E, dtype=torch.float64) for _ in range(3))
    gate = torch.randn(B, T, H, dtype=torch.float64) if mix == "gate" else None
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :4] = False
    y = M.macchiato(a, b, v, q, k, window_size=W, mix=mix, gate=gate, mask=mask, backend="fla")[0]
    y_ref = R.macchiato(a, b, v, q, k, W, mix=mix, gate=gate, mask=mask)
    assert rel_err(y[mask], y_ref[mask]) < 1e-10


# ---- the two-level log-normaliser (issue 42) ----------------------------------


@pytest.mark.parametrize("T,chunk", [(1, 4), (13, 4), (64, 8), (70, 7), (130, 64)])
@pytest.mark.parametrize("before", ["none", "state", "empty state"])
def test_two_level_log_normaliser_equals_one_scan(T, chunk, before):
    """log_normalisers (inside chunks, then over chunk totals) against one
    T-long logcumsumexp, forward and gradients, float64, with spread logits
    and masked (NEG) keys; z_before: none (-inf), a state, an empty state."""
    from latte.ops._checks import NEG

    bc = torch.randn(2, T, 3, 4, dtype=torch.float64) * 20
    bc[0, : T // 3] = NEG  # left padding
    zb = {"none": torch.full((2, 1, 3, 4), float("-inf"), dtype=torch.float64)}.get(before)
    if zb is None:
        zb = torch.randn(2, 1, 3, 4, dtype=torch.float64) * 5 if before == "state" else torch.full((2, 1, 3, 4), NEG)
        zb = zb.double()

    def two(bc, zb):
        return gla.log_normalisers(bc, zb, chunk=chunk)

    def one(bc, zb):
        return torch.logaddexp(torch.logcumsumexp(bc, 1), zb.clamp(min=NEG))

    out, (g_bc, g_zb) = grads_of(two, [bc, zb])
    out_ref, (g_bc_ref, g_zb_ref) = grads_of(one, [bc, zb])
    assert torch.isfinite(out).all() and torch.isfinite(g_bc).all() and torch.isfinite(g_zb).all()
    assert rel_err(out, out_ref) < 1e-12
    real = bc > NEG / 2  # a masked key's own gradient is dropped by the masking (gla_inputs)
    assert rel_err(g_bc[real], g_bc_ref[real], floor=1.0) < 1e-10
    if before == "state":
        assert rel_err(g_zb, g_zb_ref, floor=1.0) < 1e-10


def test_kernel_output_keeps_its_dtype(monkeypatch):
    """bf16 in: the kernel's bf16 output is returned as it is (no float32 round trip)."""
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(BK, "_construction", "eager")

    def bf16_kernel(q, k, v, g, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
        y, h = gla_loop(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
        return y.to(v.dtype), h.float()

    monkeypatch.setattr(gla, "_kernels", lambda: (bf16_kernel, bf16_kernel))
    a, b, v = (x.bfloat16() for x in inputs(70))
    y, S, z = gla.gla_chunked(a, b, v)
    assert y.dtype == torch.bfloat16 and S.dtype == torch.float32 and z.dtype == torch.float32
    y_ref = R.latte_causal(a, b, v)[0]
    assert rel_err(y, y_ref) < 2e-2
