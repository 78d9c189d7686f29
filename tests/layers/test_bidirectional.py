"""Bidirectional (causal=False) layers: no state, padding invisible, and the
token t really sees the future."""

import pytest
import torch

from latte.layers import LatteAttention, LinearAttention, SoftmaxAttention
from latte.ops import reference

DIM, HEADS = 16, 2

LAYERS = {
    "latte-none": lambda: LatteAttention(DIM, HEADS, 4, causal=False),
    "latte-conv": lambda: LatteAttention(DIM, HEADS, 4, causal=False, qk_mixer="conv", conv_size=3),
    "latte-conv4": lambda: LatteAttention(DIM, HEADS, 4, causal=False, qk_mixer="conv", conv_size=4),
    "softmax": lambda: SoftmaxAttention(DIM, HEADS, causal=False),
    "softmax-norope": lambda: SoftmaxAttention(DIM, HEADS, causal=False, rope_theta=None, num_kv_heads=1),
    "linear": lambda: LinearAttention(DIM, HEADS, causal=False),
}


def make(name):
    torch.manual_seed(0)
    return LAYERS[name]().eval()


@pytest.mark.parametrize("name", LAYERS)
def test_padding_does_not_change_real_outputs(name):
    layer = make(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 12, DIM, generator=g)
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[0, :5] = False  # left padding
    mask[1, 8:] = False  # right padding
    with torch.no_grad():
        y, state = layer(x, mask=mask)
        assert state is None
        for i in range(3):
            alone, _ = layer(x[i : i + 1][:, mask[i]])
            torch.testing.assert_close(y[i][mask[i]], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", LAYERS)
def test_sees_the_future_and_has_no_state(name):
    layer = make(name)
    x = torch.randn(1, 10, DIM)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        y, _ = layer(x)
        y2, _ = layer(x2)
    assert not torch.allclose(y[:, 0], y2[:, 0])
    with pytest.raises(ValueError, match="state"):
        layer(x, state=(torch.zeros(1),))


def test_latte_bidirectional_layer_matches_reference_op():
    layer = make("latte-none")
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    layer.double()
    with torch.no_grad():
        y, _ = layer(x)
        a = layer.a_proj(x).view(2, 9, HEADS, 4)
        b = layer.b_proj(x).view(2, 9, HEADS, 4)
        v = layer.v_proj(x).view(2, 9, HEADS, 8)
        ref = layer.o_proj(reference.latte_bidirectional(a, b, v).flatten(2))
    torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("kind", ["rglru", "conv_rglru"])
def test_causal_only_mixer_is_rejected(kind):
    with pytest.raises(ValueError, match="qk_mixer.*causal"):
        LatteAttention(DIM, HEADS, 4, causal=False, qk_mixer=kind)


def test_default_mixer_depends_on_causality():
    assert LatteAttention(DIM, HEADS, 4).qk_mixer == "conv_rglru"
    assert LatteAttention(DIM, HEADS, 4, causal=False).qk_mixer == "none"
