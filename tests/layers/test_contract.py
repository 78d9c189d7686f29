"""The layer contract, checked for every causal layer and configuration:
forward(x, *, state=None, mask=None) -> (y, state);
prefill + decode == one full forward; left padding is invisible and does not
shift positions; states are constant in T (except the KV cache); every
parameter learns."""

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

DIM, HEADS, LATENTS, T = 16, 2, 4, 19  # LATENTS per head
ATOL = 1e-4

LAYERS = {
    "latte-none": lambda: LatteAttention(DIM, HEADS, LATENTS, qk_mixer="none", chunk_size=4),
    "latte-conv": lambda: LatteAttention(DIM, HEADS, LATENTS, qk_mixer="conv", chunk_size=4),
    "latte-conv1": lambda: LatteAttention(DIM, HEADS, LATENTS, qk_mixer="conv", conv_size=1, chunk_size=5),
    "latte-rglru": lambda: LatteAttention(DIM, HEADS, LATENTS, qk_mixer="rglru", chunk_size=4),
    "latte-conv_rglru": lambda: LatteAttention(DIM, HEADS, LATENTS, qk_mixer="conv_rglru", chunk_size=4, bias=True),
    "macchiato-joint-none": lambda: MacchiatoAttention(DIM, HEADS, LATENTS, window_size=4, qk_mixer="none"),
    "macchiato-joint-conv": lambda: MacchiatoAttention(DIM, HEADS, LATENTS, window_size=4, qk_mixer="conv"),
    "macchiato-joint-rglru": lambda: MacchiatoAttention(DIM, HEADS, LATENTS, window_size=4, qk_mixer="rglru"),
    "macchiato-joint-conv_rglru": lambda: MacchiatoAttention(
        DIM, HEADS, LATENTS, window_size=4, num_kv_heads=1, chunk_size=4
    ),
    "macchiato-gate-none": lambda: MacchiatoAttention(DIM, HEADS, LATENTS, window_size=5, mix="gate", qk_mixer="none"),
    "macchiato-gate-conv_rglru": lambda: MacchiatoAttention(
        DIM, HEADS, LATENTS, window_size=4, mix="gate", num_kv_heads=1, head_dim=6, chunk_size=4, bias=True
    ),
    "macchiato-joint-sinks": lambda: MacchiatoAttention(
        DIM, HEADS, LATENTS, window_size=4, num_sinks=2, num_kv_heads=1, chunk_size=4
    ),
    "macchiato-gate-sinks": lambda: MacchiatoAttention(DIM, HEADS, LATENTS, window_size=3, num_sinks=5, mix="gate"),
    "softmax": lambda: SoftmaxAttention(DIM, HEADS),
    "softmax-gqa": lambda: SoftmaxAttention(DIM, HEADS, num_kv_heads=1, bias=True),
    "linear": lambda: LinearAttention(DIM, HEADS, chunk_size=4),
    "linear-conv": lambda: LinearAttention(DIM, HEADS, chunk_size=4, qk_mixer="conv"),
    "linear-conv_rglru": lambda: LinearAttention(DIM, HEADS, chunk_size=5, qk_mixer="conv_rglru", conv_size=4),
    "swa": lambda: SlidingWindowAttention(DIM, HEADS, window_size=4),
    "swa-gqa": lambda: SlidingWindowAttention(DIM, HEADS, window_size=6, num_kv_heads=1),
}
CONSTANT_STATE = [name for name in LAYERS if not name.startswith("softmax")]


def make(name):
    torch.manual_seed(0)
    return LAYERS[name]().eval()


def inputs(B=2, T=T, seed=1):
    return torch.randn(B, T, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("split", [1, 6, 13, T - 1])
def test_prefill_then_decode_equals_full_forward(name, split):
    layer, x = make(name), inputs()
    with torch.no_grad():
        y_full, state_full = layer(x)
        y, state = layer(x[:, :split])
        ys = [y]
        for t in range(split, T):
            y_t, state = layer(x[:, t : t + 1], state=state)
            ys.append(y_t)
    assert y_full.shape == x.shape
    torch.testing.assert_close(torch.cat(ys, 1), y_full, atol=ATOL, rtol=0)
    # the state after decoding equals the state of the full pass
    assert state_nbytes(state) == state_nbytes(state_full)
    if hasattr(state, "pos"):  # the layers with RoPE count positions when used alone
        torch.testing.assert_close(state.pos, state_full.pos)


@pytest.mark.parametrize("name", LAYERS)
def test_chunked_continuation_equals_full_forward(name):
    layer, x = make(name), inputs()
    with torch.no_grad():
        y_full, _ = layer(x)
        ys, state, start = [], None, 0
        for size in (3, 1, 7, 2, 6):  # chunks of T > 1 continue a state too
            y, state = layer(x[:, start : start + size], state=state)
            ys.append(y)
            start += size
    torch.testing.assert_close(torch.cat(ys, 1), y_full, atol=ATOL, rtol=0)
    assert not hasattr(state, "pos") or state.pos.tolist() == [T, T]


@pytest.mark.parametrize("name", LAYERS)
def test_left_padding_is_invisible(name):
    """A left-padded batch (garbage in the padding) gives each sequence's own
    outputs, prefilled in two chunks (one of them all padding for the shortest
    sequence) and then decoded token by token."""
    layer = make(name)
    lengths, extra = [T, 12, 5], 4
    x = inputs(B=3, T=T + extra, seed=2)  # T prompt columns + `extra` decoded tokens
    mask = torch.zeros(3, T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, T - n :] = True
    with torch.no_grad():
        ys, state = [], None
        for lo, hi in ((0, 9), (9, T)):
            y, state = layer(x[:, lo:hi], state=state, mask=mask[:, lo:hi])
            ys.append(y)
        for t in range(T, T + extra):
            y, state = layer(x[:, t : t + 1], state=state)
            ys.append(y)
        y_batch = torch.cat(ys, 1)
        assert not hasattr(state, "pos") or state.pos.tolist() == [n + extra for n in lengths]
        for i, n in enumerate(lengths):
            alone, _ = layer(x[i : i + 1, T - n :])  # the same tokens, unpadded
            torch.testing.assert_close(y_batch[i : i + 1, T - n :], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", LAYERS)
def test_state_size_vs_context(name):
    layer = make(name)
    with torch.no_grad():
        _, short = layer(inputs(B=1, T=64))
        _, long = layer(inputs(B=1, T=512))
        _, stepped = layer(inputs(B=1, T=1), state=long)
    if name in CONSTANT_STATE:
        assert state_nbytes(short) == state_nbytes(long) == state_nbytes(stepped) > 0
    else:  # the KV cache grows with every token
        assert state_nbytes(short) < state_nbytes(long) < state_nbytes(stepped)
        assert state_nbytes(long) == 8 * state_nbytes(short) - 7 * state_nbytes(torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("name", LAYERS)
def test_every_parameter_gets_a_gradient(name):
    layer = make(name).train()
    x = inputs().requires_grad_()
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :4] = False
    y, _ = layer(x, mask=mask)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)) * mask.unsqueeze(-1)  # real outputs only
    (y * w).sum().backward()
    for pname, p in layer.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname
    assert torch.isfinite(x.grad).all()
    assert x.grad[1, :4].abs().max() == 0  # padding influences nothing real


@pytest.mark.parametrize("name", LAYERS)
def test_bfloat16_forward_and_decode_are_finite(name):
    layer = make(name).to(torch.bfloat16)
    x = inputs().to(torch.bfloat16)
    with torch.no_grad():
        y, state = layer(x)
        y_t, _ = layer(x[:, :1], state=state)
    assert y.dtype == y_t.dtype == torch.bfloat16
    assert torch.isfinite(y).all() and torch.isfinite(y_t).all()


@pytest.mark.parametrize("name", LAYERS)
def test_dropout_is_off_in_eval_and_on_in_train(name):
    kwargs_layer = make(name)
    layer = type(kwargs_layer)(**_ctor_kwargs(kwargs_layer), dropout=0.5)
    x = inputs()
    layer.eval()
    assert torch.equal(layer(x)[0], layer(x)[0])
    layer.train()
    assert not torch.equal(layer(x)[0], layer(x)[0])


def _ctor_kwargs(layer):
    """Rebuild a layer's constructor arguments from its attributes."""
    if isinstance(layer, (LatteAttention, MacchiatoAttention)):
        return dict(dim=layer.dim, num_heads=layer.num_heads, latents_per_head=layer.latents_per_head)
    return dict(dim=layer.dim, num_heads=layer.num_heads)


@pytest.mark.parametrize("name", LAYERS)
def test_positions_given_by_a_model_equal_counting_them(name):
    """A model passes the positions it counts once for all layers; the layer
    state then carries no counter of its own, and asking such a state to
    count on alone is an error that says what to pass."""
    layer, x = make(name), inputs(B=3)
    mask = torch.ones(3, T, dtype=torch.bool)
    mask[1, :5] = False
    pos_BT = mask.long().cumsum(1) - mask.long()  # real tokens before each one
    with torch.no_grad():
        y_own, s_own = layer(x[:, :-1], mask=mask[:, :-1])
        y_given, s_given = layer(x[:, :-1], mask=mask[:, :-1], positions=pos_BT[:, :-1])
        torch.testing.assert_close(y_given, y_own, atol=0, rtol=0)
        assert getattr(s_given, "pos", None) is None
        step_own, _ = layer(x[:, -1:], state=s_own)
        step_given, _ = layer(x[:, -1:], state=s_given, positions=pos_BT[:, -1:])
        torch.testing.assert_close(step_given, step_own, atol=0, rtol=0)
        if hasattr(s_given, "pos"):
            with pytest.raises(ValueError, match="pass positions="):
                layer(x[:, -1:], state=s_given)
        with pytest.raises(ValueError, match="positions: expected an integer tensor"):
            layer(x, positions=torch.zeros(3, T))
