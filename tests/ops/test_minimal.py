"""The readable chunked form (latte/ops/latte/minimal.py) == the float64 reference,
forward and gradients, for several chunk sizes and spread key logits."""

import pytest
import torch

from latte.ops import reference as R
from latte.ops.latte.minimal import latte_causal_minimal
from tests.helpers import grads_of, rel_err

# (T, chunk, key logit std): chunks that do and do not divide T; at std 20-40
# some exp(b) overflow float32 (above e^88), so float32 agrees only because
# every weight is taken as a difference of logits
CASES = [(1, 4, 10.0), (37, 1, 10.0), (37, 8, 40.0), (64, 16, 20.0), (65, 64, 40.0), (50, 100, 30.0)]


def inputs(T, scale, B=2, H=3, L=5, D=4):
    a = torch.randn(B, T, H, L, dtype=torch.float64) * 3
    b = torch.randn(B, T, H, L, dtype=torch.float64) * scale
    v = torch.randn(B, T, H, D, dtype=torch.float64)
    S0 = torch.randn(B, H, L, D, dtype=torch.float64)
    z0 = torch.randn(B, H, L, dtype=torch.float64) * scale
    return a, b, v, S0, z0


def flat(y, state):
    return torch.cat([y.flatten(), state[0].flatten(), state[1].flatten()])


@pytest.mark.parametrize("T,C,scale", CASES)
def test_forward_and_final_state_match_reference(T, C, scale):
    a, b, v, _, _ = inputs(T, scale)
    y_ref, (S_ref, z_ref) = R.latte_causal(a, b, v)
    y, (S, z) = latte_causal_minimal(a, b, v, chunk_size=C)
    assert y.shape == y_ref.shape
    assert rel_err(y, y_ref) < 1e-10
    assert rel_err(S, S_ref) < 1e-10 and rel_err(z, z_ref) < 1e-10
    y32, (S32, z32) = latte_causal_minimal(a.float(), b.float(), v.float(), chunk_size=C)
    assert y32.dtype == torch.float32
    assert rel_err(y32, y_ref) < 1e-4 and rel_err(S32, S_ref) < 1e-4 and rel_err(z32, z_ref) < 1e-5


@pytest.mark.parametrize("T,C,scale", CASES)
@pytest.mark.parametrize("with_state", [False, True])
def test_gradients_match_reference(T, C, scale, with_state):
    a, b, v, S0, z0 = inputs(T, scale)

    def mini(a, b, v, S0, z0):
        return flat(*latte_causal_minimal(a, b, v, chunk_size=C, initial_state=(S0, z0) if with_state else None))

    def ref(a, b, v, S0, z0):
        return flat(*R.latte_causal(a, b, v, initial_state=(S0, z0) if with_state else None))

    out, grads = grads_of(mini, [a, b, v, S0, z0])
    out_ref, grads_ref = grads_of(ref, [a, b, v, S0, z0])
    assert rel_err(out, out_ref) < 1e-10
    for name, g, g_ref in zip("a b v S0 z0".split(), grads, grads_ref):
        if g_ref is None:  # S0, z0 without a state
            assert g is None, name
            continue
        assert torch.isfinite(g).all(), name
        assert rel_err(g, g_ref) < 1e-9, name


def test_state_carries_one_pass_into_two():
    a, b, v, _, _ = inputs(40, 40.0)
    y, state = latte_causal_minimal(a, b, v, chunk_size=8)
    y1, mid = latte_causal_minimal(a[:, :17], b[:, :17], v[:, :17], chunk_size=8)
    y2, end = latte_causal_minimal(a[:, 17:], b[:, 17:], v[:, 17:], chunk_size=8, initial_state=mid)
    assert rel_err(torch.cat([y1, y2], 1), y) < 1e-12
    assert rel_err(end[0], state[0]) < 1e-12 and rel_err(end[1], state[1]) < 1e-12
