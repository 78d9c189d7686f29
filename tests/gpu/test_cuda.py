"""The CUDA paths against the float64 reference (skipped without a GPU): the
fast tests/gpu, no `torch.compile` (those are in test_cuda_compile.py, run
after these by the suite's --loan, docs/gpu.md §5.3).

Run on a GPU machine with `python -m pytest -q tests/gpu`; with
TRITON_F32_DEFAULT=ieee in the environment fla's float32 dots are exact
float32 and the tolerances tighten from TF32's (~1e-3) to float32's.
"""

import os

import pytest
import torch

from latte.ops import LatteState, latte_causal, latte_causal_step, macchiato
from latte.ops import reference as R
from latte.ops.backend import fla_missing
from latte.ops.window.flex_window import flex_window
from latte.ops.window.sliding_window import WindowState
from tests.helpers import grads_of, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_fla = pytest.mark.skipif(
    not torch.cuda.is_available() or fla_missing() is not None,
    reason=f"fla-core's kernels are not usable: {fla_missing()}",
)

IEEE = os.environ.get("TRITON_F32_DEFAULT") == "ieee"
FWD, GRAD = (2e-5, 2e-4) if IEEE else (5e-3, 2e-2)  # exact float32 dots, or TF32's 10-bit mantissa
CUDA = "cuda"
f64 = torch.float64


def on_cuda(*xs):
    return [x.float().to(CUDA) for x in xs]


def latte_inputs(T, B=2, H=3, L=16, D=32, scale=1.0, spikes=0.0):
    a = torch.randn(B, T, H, L, dtype=f64)
    b = torch.randn(B, T, H, L, dtype=f64) * scale + spikes * (torch.rand(B, T, H, L) < 0.05)
    return a, b, torch.randn(B, T, H, D, dtype=f64)


def outputs(y, S, z):
    return torch.cat([y.flatten(), S.flatten(), z.flatten()])


@needs_fla
@pytest.mark.parametrize("T", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("scale,spikes", [(1.0, 0.0), (40.0, 0.0), (1.0, 80.0)])
def test_fla_matches_float64_forward_and_gradients(T, scale, spikes):
    torch.manual_seed(0)
    a, b, v = latte_inputs(T, scale=scale, spikes=spikes)
    S0, z0 = torch.randn(2, 3, 16, 32, dtype=f64), torch.randn(2, 3, 16, dtype=f64) * 3

    def fast(a, b, v, S0, z0):
        y, st = latte_causal(a, b, v, initial_state=LatteState(S0, z0), output_final_state=True, backend="fla")
        return outputs(y, st.S, st.z)

    def ref(a, b, v, S0, z0):
        y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0))
        return outputs(y, S, z)

    out, g = grads_of(fast, on_cuda(a, b, v, S0, z0))
    out_ref, g_ref = grads_of(ref, [a, b, v, S0, z0])
    assert rel_err(out.cpu(), out_ref) < FWD
    for name, x, xr in zip("a b v S0 z0".split(), g, g_ref):
        assert rel_err(x.cpu(), xr) < GRAD, name


@needs_fla
@pytest.mark.parametrize("T,scale,spikes", [(65, 40.0, 0.0), (300, 1.0, 80.0)])
def test_fla_eager_construction_matches_float64(monkeypatch, T, scale, spikes):
    """The two-level construction, no longer the default (that is "auto":
    "fused" at these sizes, docs/gpu.md §2.3), to the same bounds."""
    from latte.ops import backend as BK

    monkeypatch.setattr(BK, "_construction", "eager")
    test_fla_matches_float64_forward_and_gradients(T, scale, spikes)


@needs_fla
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_fla_fused_bfloat16_against_its_float32(monkeypatch, scale):
    """The fused construction in bfloat16 (q through a bf16 softmax, k in
    bf16, g in float32) against the same construction in float32 on the
    same bf16-rounded inputs: output and the gradients of a, b, v."""
    from latte.ops import backend as BK

    monkeypatch.setattr(BK, "_construction", "fused")
    torch.manual_seed(5)
    a, b, v = (x.to(CUDA, torch.bfloat16) for x in latte_inputs(256, scale=scale))

    def run(a, b, v):
        return latte_causal(a, b, v, backend="fla")[0].float()

    out, g = grads_of(run, [a, b, v])
    out32, g32 = grads_of(run, [x.float() for x in (a, b, v)])
    bound = 2e-2 if scale == 1.0 else 1e-1  # spread logits: bf16's k and q round coarser
    assert rel_err(out, out32) < bound
    for name, x, xr in zip("a b v".split(), g, g32):
        assert torch.isfinite(x).all() and rel_err(x.float(), xr, floor=1e-2) < 2.5 * bound, name


@needs_fla
def test_fla_packed_documents_and_mask():
    torch.manual_seed(1)
    lengths = [5, 64, 1, 130]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    a, b, v = latte_inputs(sum(lengths), B=1, scale=10.0)
    y = latte_causal(*on_cuda(a, b, v), cu_seqlens=cu.to(CUDA), backend="fla")[0].cpu()
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        y_ref, _ = R.latte_causal(a[:, s:e], b[:, s:e], v[:, s:e])
        assert rel_err(y[:, s:e], y_ref) < FWD
    a, b, v = latte_inputs(100)
    mask = torch.ones(2, 100, dtype=torch.bool)
    mask[0, :9] = False
    mask[1, 70:] = False
    y = latte_causal(*on_cuda(a, b, v), mask=mask.to(CUDA), backend="fla")[0].cpu()
    y_ref, _ = R.latte_causal(a, b, v, mask=mask)
    assert rel_err(y[mask], y_ref[mask]) < FWD


@needs_fla
def test_fla_decode_steps_continue_the_prefill_state():
    torch.manual_seed(2)
    a, b, v = latte_inputs(80, scale=5.0)
    y_ref, _ = R.latte_causal(a, b, v)
    a, b, v = on_cuda(a, b, v)
    y_pre, state = latte_causal(a[:, :50], b[:, :50], v[:, :50], output_final_state=True, backend="fla")
    ys = [y_pre]
    for t in range(50, 80):
        y_t, state = latte_causal_step(a[:, t], b[:, t], v[:, t], state, backend="fla")
        ys.append(y_t.unsqueeze(1))
    assert rel_err(torch.cat(ys, 1).cpu(), y_ref) < FWD


@needs_fla
def test_fla_bfloat16_is_close_and_finite():
    torch.manual_seed(3)
    a, b, v = latte_inputs(256, scale=20.0)
    y = latte_causal(*(x.to(CUDA, torch.bfloat16) for x in (a, b, v)), backend="fla")[0]
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert rel_err(y.float().cpu(), R.latte_causal(a, b, v)[0]) < 5e-2


def test_torch_kernels_run_on_cuda():
    torch.manual_seed(4)
    a, b, v = latte_inputs(200, scale=10.0)
    out, g = grads_of(lambda *x: latte_causal(*x, backend="torch")[0], on_cuda(a, b, v))
    out_ref, g_ref = grads_of(lambda *x: R.latte_causal(*x)[0], [a, b, v])
    assert rel_err(out.cpu(), out_ref) < FWD
    for x, xr in zip(g, g_ref):
        assert rel_err(x.cpu(), xr) < GRAD


@pytest.mark.parametrize("T,W,K", [(1, 4, 2), (100, 16, 2), (300, 128, 1), (513, 200, 4)])
def test_flex_window_matches_float64_with_gradients(T, W, K):
    torch.manual_seed(5)
    q, k, v = (
        torch.randn(2, T, 4, 32, dtype=f64),
        torch.randn(2, T, K, 32, dtype=f64),
        torch.randn(2, T, K, 32, dtype=f64),
    )
    both = lambda y, lse, *_: torch.cat([y.flatten(), lse.flatten()])  # noqa: E731
    out, g = grads_of(lambda q, k, v: both(*flex_window(q, k, v, W, 32**-0.5, None, None)), on_cuda(q, k, v))
    out_ref, g_ref = grads_of(lambda q, k, v: both(*R.sliding_window_attention(q, k, v, W)), [q, k, v])
    assert rel_err(out.cpu(), out_ref) < FWD
    for x, xr in zip(g, g_ref):
        assert rel_err(x.cpu(), xr, floor=1e-4) < GRAD


def test_flex_window_with_cache_and_padding():
    torch.manual_seed(6)
    T, W = 150, 40
    q, k, v = (
        torch.randn(2, T, 4, 32, dtype=f64),
        torch.randn(2, T, 2, 32, dtype=f64),
        torch.randn(2, T, 2, 32, dtype=f64),
    )
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[0, :9] = False
    state = WindowState(
        torch.randn(2, W - 1, 2, 32, dtype=f64), torch.randn(2, W - 1, 2, 32, dtype=f64), torch.rand(2, W - 1) < 0.7
    )
    from latte.ops.window.sliding_window import window_blocked

    want = window_blocked(q, k, v, W, 0.2, mask, state)
    got = flex_window(
        *on_cuda(q, k, v), W, 0.2, mask.to(CUDA), WindowState(*on_cuda(state.k, state.v), state.mask.to(CUDA))
    )
    assert rel_err(got[0].cpu()[mask], want[0][mask]) < FWD and rel_err(got[1].cpu()[mask], want[1][mask]) < FWD


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_on_cuda_matches_float64(backend, mix):
    if backend == "auto" and fla_missing() is not None:
        pytest.skip(f"fla-core's kernels are not usable: {fla_missing()}")
    torch.manual_seed(7)
    B, T, H, K, L, E, W = 2, 200, 4, 2, 16, 32, 64
    a, b = torch.randn(B, T, H, L, dtype=f64), torch.randn(B, T, H, L, dtype=f64) * 5
    q, k, v = torch.randn(B, T, H, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64)
    gate = torch.randn(B, T, H, dtype=f64) if mix == "gate" else None
    beta = torch.randn(H, dtype=f64)
    args = [a, b, v, q, k, beta] + ([gate] if gate is not None else [])

    def run(fn, a, b, v, q, k, beta, gate=None, **kw):
        return fn(a, b, v, q, k, window_size=W, mix=mix, gate=gate, beta=beta, **kw)

    out, g = grads_of(lambda *x: run(macchiato, *x, backend=backend)[0], on_cuda(*args))
    out_ref, g_ref = grads_of(lambda *x: run(R.macchiato, *x), args)
    assert rel_err(out.cpu(), out_ref) < FWD
    for x, xr in zip(g, g_ref):
        assert rel_err(x.cpu(), xr) < GRAD


@needs_fla
@pytest.mark.parametrize("mixer", ["latte", "macchiato"])
def test_model_train_step_same_on_both_backends(mixer):
    from latte.models import LatteConfig, LatteForCausalLM
    from latte.ops import set_backend

    torch.manual_seed(8)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).to(CUDA).eval()  # no dropout: the same function twice
    ids = torch.randint(0, model.config.vocab_size, (2, 96), device=CUDA)
    losses, grads = [], []
    for name in ("torch", "fla"):
        set_backend(name)
        try:
            model.zero_grad()
            loss = model(ids, labels=ids).loss
            loss.backward()
        finally:
            set_backend(None)
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert abs(losses[0] - losses[1]) < 1e-3 * abs(losses[0])
    assert rel_err(grads[1].cpu(), grads[0].cpu()) < GRAD


@pytest.mark.parametrize("mixer", ["latte", "macchiato", "softmax"])
def test_captured_decode_step_gives_the_value_loops_tokens(mixer):
    """The static decoding step captured in a CUDA graph and replayed per
    token (latte/models/static_decode.py) against the step-by-step loop over
    the cache as a value (static=False): the same tokens, greedy with a
    left-padded row, and sampled from the same seed (the generator's state
    registered with the graph)."""
    from latte.models import LatteConfig, LatteForCausalLM

    torch.manual_seed(10)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).to(CUDA).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 20), device=CUDA)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    want = model.generate(ids, 24, do_sample=False, attention_mask=mask, static=False)
    assert torch.equal(model.generate(ids, 24, do_sample=False, attention_mask=mask), want)

    def sampled(static):
        gen = torch.Generator(CUDA).manual_seed(3)
        return model.generate(ids, 16, do_sample=True, top_k=50, generator=gen, static=static)

    assert torch.equal(sampled(True), sampled(False))


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("rule", ["key_norm", "random"])
def test_macchiato_memory_slots_on_cuda_match_float64(backend, rule):
    """Macchiato with memory slots (docs/math.md §4.2) on CUDA, latents on
    fla ("auto") or the torch kernels, against the float64 reference: rules
    whose scores do not depend on the latents, so float32 cannot change
    which tokens are held."""
    from latte.ops.window.memory import Memory

    if backend == "auto" and fla_missing() is not None:
        pytest.skip(f"fla-core's kernels are not usable: {fla_missing()}")
    torch.manual_seed(11)
    B, T, H, K, L, E, W, M = 2, 300, 4, 2, 16, 32, 32, 8
    a, b = torch.randn(B, T, H, L, dtype=f64), torch.randn(B, T, H, L, dtype=f64) * 5
    q, k, v = torch.randn(B, T, H, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64), torch.randn(B, T, K, E, dtype=f64)
    want = R.macchiato_memory(a, b, v, q, k, W, slots=M, rule=rule, seed=7, num_sinks=2)
    got, _ = macchiato(*on_cuda(a, b, v, q, k), window_size=W, memory=Memory(M, rule, 7), num_sinks=2, backend=backend)
    assert rel_err(got.cpu(), want) < FWD


def test_captured_decode_step_with_memory_slots_gives_the_value_loops_tokens():
    """The captured static step of a Macchiato model whose slots fill and
    evict during decoding (the ring window's memory block) gives the value
    loop's greedy tokens."""
    from latte.models import LatteConfig, LatteForCausalLM

    torch.manual_seed(12)
    cfg = LatteConfig.tiny(mixer="macchiato", memory_slots=4, memory_rule="key_norm")
    model = LatteForCausalLM(cfg).to(CUDA).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 20), device=CUDA)
    want = model.generate(ids, 40, do_sample=False, static=False)
    assert torch.equal(model.generate(ids, 40, do_sample=False), want)


def test_captured_steps_keep_their_state_alive():
    """Two captured steps whose callers keep only the replays (as `bench
    decode` does, one graph per context): after more allocations, each
    replay still reads its own state and gives the value loop's tokens."""
    from latte.models import LatteConfig, LatteForCausalLM
    from latte.models.modeling import LatteCache
    from latte.models.static_decode import allocate, capture, decode_step, layer_windows

    torch.manual_seed(13)
    model = LatteForCausalLM(LatteConfig.tiny(mixer="macchiato")).to(CUDA).eval()

    def feed(t, layers, pos):
        out = model(t[:, None], state=LatteCache(layers, 0, pos), use_cache=True)
        return out.logits[:, -1], out.state.layers, out.state.pos

    def pick(x):
        return x.argmax(-1)

    windows = layer_windows([block.mixer for block in model.model.blocks])
    replays, want = [], []
    with torch.no_grad():
        for n in (20, 37):
            ids = torch.randint(0, model.config.vocab_size, (1, n), device=CUDA)
            want.append(model.generate(ids, 6, do_sample=False, static=False)[:, n:])
            st = model(ids, use_cache=True).state
            state = allocate(st.layers, windows, st.pos, st.seen_tokens, 8)
            replays.append(capture(lambda t, s=state: decode_step(feed, s, t, pick, None), want[-1][:, 0]))
            del state, st
        junk = [torch.randn(4096, device=CUDA) for _ in range(64)]  # takes what a freed state would free
        for (first, replay), w in zip(replays, want):
            got = [first]
            for _ in range(4):
                got.append(replay(got[-1]))
            assert torch.equal(torch.stack(got, 1), w[:, 1:])
        del junk
