"""linear_attention: chunked == step-by-step == float64 O(T^2) reference,
forward and gradients; masks, states and the bidirectional form."""

import pytest
import torch

from latte.ops import LinearAttentionState, linear_attention, linear_attention_step
from latte.ops import reference as R
from latte.ops.linear_attention import EPS

f64 = torch.float64


def make(B=2, T=23, H=3, E=4, D=5, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.elu(torch.randn(B, T, H, E, generator=g)) + 1
    k = torch.nn.functional.elu(torch.randn(B, T, H, E, generator=g)) + 1
    v = torch.randn(B, T, H, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 23, 64])
def test_forward_matches_reference(chunk_size):
    q, k, v = make()
    y, state = linear_attention(q, k, v, chunk_size=chunk_size, output_final_state=True)
    y_ref, (S, z) = R.linear_attention(q, k, v)
    assert y.dtype == torch.float32 and state.S.dtype == torch.float32
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.S.double(), S, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(state.z.double(), z, atol=1e-4, rtol=1e-5)


def test_mask_and_initial_state_match_reference():
    q, k, v = make(seed=1)
    mask = torch.rand(2, 23, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[:, 0] = True
    S0 = torch.rand(2, 3, 4, 5)
    z0 = torch.rand(2, 3, 4) + 1
    init = LinearAttentionState(S0, z0)
    y, state = linear_attention(q, k, v, chunk_size=5, mask=mask, initial_state=init, output_final_state=True)
    y_ref, (S, z) = R.linear_attention(q, k, v, initial_state=init, mask=mask)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.S.double(), S, atol=1e-4, rtol=1e-5)


def test_bidirectional_matches_reference_and_ignores_padding():
    q, k, v = make(seed=2)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[0, :6] = False  # left padding
    mask[1, -4:] = False  # right padding
    y, state = linear_attention(q, k, v, causal=False, mask=mask)
    assert state is None
    y_ref, _ = R.linear_attention(q, k, v, causal=False, mask=mask)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    alone, _ = linear_attention(q[:1, 6:], k[:1, 6:], v[:1, 6:], causal=False)
    torch.testing.assert_close(y[:1, 6:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_reference(causal):
    q, k, v = (t.double().requires_grad_() for t in make(B=1, T=13, seed=3))
    w = torch.randn(1, 13, 3, 5, dtype=f64, generator=torch.Generator().manual_seed(4))
    y, _ = linear_attention(q, k, v, causal=causal, chunk_size=4)
    grads = torch.autograd.grad((y * w).sum(), (q, k, v))
    y_ref, _ = R.linear_attention(q, k, v, causal=causal)
    grads_ref = torch.autograd.grad((y_ref * w).sum(), (q, k, v))
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-8)


def test_gradcheck_float64():
    q, k, v = (t.double().requires_grad_() for t in make(B=1, T=6, H=1, E=2, D=2, seed=5))
    assert torch.autograd.gradcheck(lambda q, k, v: linear_attention(q, k, v, chunk_size=4)[0], (q, k, v))


def test_chunked_equals_step_by_step():
    q, k, v = make(seed=6)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[1, :7] = False
    y, final = linear_attention(q, k, v, chunk_size=4, mask=mask, output_final_state=True)
    state, ys = None, []
    for t in range(23):
        y_t, state = linear_attention_step(q[:, t], k[:, t], v[:, t], state, mask_t=mask[:, t])
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys, 1)[mask], y[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.S, final.S, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(state.z, final.z, atol=1e-4, rtol=1e-5)


def test_prefill_then_continue_equals_one_pass():
    q, k, v = make(seed=7)
    y, _ = linear_attention(q, k, v, chunk_size=4)
    y1, s = linear_attention(q[:, :10], k[:, :10], v[:, :10], chunk_size=3, output_final_state=True)
    y2, _ = linear_attention(q[:, 10:], k[:, 10:], v[:, 10:], chunk_size=6, initial_state=s)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, atol=1e-5, rtol=1e-5)


def test_bfloat16_inputs_keep_a_float32_state():
    q, k, v = make(dtype=torch.bfloat16)
    y, state = linear_attention(q, k, v, output_final_state=True)
    assert y.dtype == torch.bfloat16 and state.S.dtype == torch.float32
    y_ref, _ = R.linear_attention(q, k, v)
    torch.testing.assert_close(y.double(), y_ref, atol=3e-2, rtol=3e-2)


def test_errors_name_the_argument():
    q, k, v = make()
    with pytest.raises(ValueError, match="q, k"):
        linear_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="sequence lengths"):
        linear_attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match="mask"):
        linear_attention(q, k, v, mask=torch.ones(2, 23))
    with pytest.raises(ValueError, match="causal=False"):
        linear_attention(q, k, v, causal=False, output_final_state=True)
    with pytest.raises(ValueError, match="initial_state.S"):
        linear_attention(q, k, v, initial_state=LinearAttentionState(torch.zeros(2, 3, 4, 4), torch.zeros(2, 3, 4)))
    with pytest.raises(ValueError, match="state"):
        linear_attention_step(q[:, 0], k[:, 0], v[:, 0], (torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 4)))


def test_reference_uses_the_same_eps():
    assert R.EPS == EPS
