"""Constructor and forward errors are ValueErrors naming the argument."""

import re

import pytest
import torch

from latte.layers import (
    LatteAttention,
    LinearAttention,
    MacchiatoAttention,
    SlidingWindowAttention,
    SoftmaxAttention,
    state_nbytes,
)

CASES = [
    (LatteAttention, (16, 2, 0), {}, "latents_per_head"),
    (LatteAttention, (15, 2, 8), {}, "dim=15 must be divisible by num_heads=2"),
    (LatteAttention, (16, 2, 8), {"qk_mixer": "lstm"}, "qk_mixer: expected one of"),
    (LatteAttention, (16, 2, 8), {"conv_size": 0}, "conv_size"),
    (LatteAttention, (16, 2, 8), {"chunk_size": 0}, "chunk_size"),
    (LatteAttention, (16, 0, 8), {}, "num_heads"),
    (LatteAttention, (16, 2, 8), {"dropout": 1.0}, "dropout"),
    (LatteAttention, (16, 2, 8), {"causal": False, "qk_mixer": "rglru"}, "qk_mixer"),
    (MacchiatoAttention, (16, 2, 8), {"mix": "sum"}, "mix: expected one of"),
    (MacchiatoAttention, (16, 4, 8), {"num_kv_heads": 3}, "num_heads=4 must be divisible by num_kv_heads=3"),
    (MacchiatoAttention, (16, 2, 8), {"window_size": 0}, "window_size"),
    (MacchiatoAttention, (16, 2, 8), {"head_dim": 5}, "head_dim"),
    (MacchiatoAttention, (16, 2, 8), {"rope_theta": -1.0}, "rope_theta"),
    (MacchiatoAttention, (16, 2, 8), {"rope_theta": float("nan")}, "rope_theta: expected a finite number > 0"),
    (SlidingWindowAttention, (16, 2), {"rope_theta": float("inf")}, "rope_theta: expected a finite number > 0"),
    (MacchiatoAttention, (16, 2, -1), {}, "latents_per_head"),
    (MacchiatoAttention, (10, 4, 8), {"head_dim": 4}, "dim=10 must be divisible by num_heads=4"),  # RG-LRU blocks
    (SoftmaxAttention, (16, 4), {"num_kv_heads": 3}, "num_kv_heads=3"),
    (SoftmaxAttention, (10, 4), {}, "dim=10"),
    (LinearAttention, (10, 4), {}, "dim=10"),
    (LinearAttention, (16, 2), {"chunk_size": -1}, "chunk_size"),
    (SlidingWindowAttention, (16, 2), {"window_size": 0}, "window_size"),
    (SlidingWindowAttention, (16, 4), {"num_kv_heads": 3}, "num_kv_heads=3"),
]


@pytest.mark.parametrize("cls, args, kwargs, message", CASES)
def test_constructor_errors(cls, args, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cls(*args, **kwargs)


def test_head_dim_frees_dim_from_num_heads_without_rglru():
    layer = MacchiatoAttention(10, 4, 2, head_dim=4, qk_mixer="conv")
    y, _ = layer(torch.randn(1, 5, 10))
    assert y.shape == (1, 5, 10)


@pytest.mark.parametrize(
    "layer",
    [
        LatteAttention(16, 2, 4),
        MacchiatoAttention(16, 2, 4, window_size=4),
        SoftmaxAttention(16, 2),
        LinearAttention(16, 2),
        SlidingWindowAttention(16, 2, window_size=4),
    ],
    ids=lambda m: type(m).__name__,
)
def test_forward_errors(layer):
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="x: expected"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="x: expected"):
        layer(torch.randn(2, 0, 16))
    with pytest.raises(ValueError, match="mask: expected a bool tensor"):
        layer(x, mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="mask: expected a bool tensor"):
        layer(x, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="state: expected a"):
        layer(x, state=(torch.zeros(2),))
    _, state = layer(x)
    with pytest.raises(ValueError, match="state: holds batch 2, expected batch 1"):
        layer(x[:1], state=state)


@pytest.mark.parametrize(
    "layer",
    [
        LatteAttention(16, 2, 4),
        MacchiatoAttention(16, 2, 4, window_size=4),
        SoftmaxAttention(16, 2),
        LinearAttention(16, 2),
        SlidingWindowAttention(16, 2, window_size=4),
    ],
    ids=lambda m: type(m).__name__,
)
def test_an_empty_batch_is_refused_like_an_empty_sequence(layer):
    """Issue 59: LatteAttention and MacchiatoAttention failed a reshape on B = 0."""
    for shape in ((0, 5, 16), (2, 0, 16)):
        with pytest.raises(ValueError, match=re.escape(f"x: expected [B >= 1, T >= 1, dim=16], got shape {shape}")):
            layer(torch.randn(*shape))


def test_state_nbytes_rejects_unknown_objects():
    assert state_nbytes(None) == 0
    assert state_nbytes((torch.zeros(3), None, [torch.zeros(2, dtype=torch.float64)])) == 28
    with pytest.raises(ValueError, match="state"):
        state_nbytes(object())
