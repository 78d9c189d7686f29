"""qk mixers: RG-LRU init, scan == per-step loop == float64 formula, the
capped sqrt derivative, the conv's causality and state, padding invisibility."""

import pytest
import torch
import torch.nn.functional as F

from latte.layers import RGLRU, DepthwiseConv, QKMixer
from latte.layers.mixers import MAX_SQRT_GRAD, sqrt_bounded_grad


def rglru(dim=12, blocks=3, seed=0):
    torch.manual_seed(seed)
    return RGLRU(dim, blocks)


def test_rglru_alpha_init_range():
    layer = rglru(dim=4096, blocks=8)
    alpha = torch.exp(-F.softplus(layer.lam.detach()))
    assert alpha.min() >= 0.9 - 1e-6 and alpha.max() <= 0.999 + 1e-6
    # alpha^2 uniform on [0.81, 0.998]: mean and spread of a uniform
    a2 = alpha.double() ** 2
    assert abs(a2.mean().item() - (0.81 + 0.998) / 2) < 0.01
    assert abs(a2.std().item() - (0.998 - 0.81) / 12**0.5) < 0.01


def test_rglru_gates_are_block_diagonal():
    layer = rglru()
    x = torch.randn(1, 3, 12)
    y, _ = layer(x)
    x2 = x.clone()
    x2[..., 4:] += 1.0  # change blocks 1 and 2 only
    y2, _ = layer(x2)
    torch.testing.assert_close(y[..., :4], y2[..., :4])  # block 0 untouched
    assert layer.w_r.shape == layer.w_i.shape == (3, 4, 4)


def rglru_reference(layer, x, h0=None, mask=None):
    """The docs/math.md §5 equations, one step at a time, float64."""
    p = {k: v.detach().double() for k, v in layer.named_parameters()}
    B, T, Fw = x.shape
    xb = x.double().view(B, T, 3, 4)
    r = torch.sigmoid(torch.einsum("btgi,gij->btgj", xb, p["w_r"]).reshape(B, T, Fw) + p["c_r"])
    i = torch.sigmoid(torch.einsum("btgi,gij->btgj", xb, p["w_i"]).reshape(B, T, Fw) + p["c_i"])
    alpha = torch.exp(-8.0 * r * F.softplus(p["lam"]))
    h = torch.zeros(B, Fw, dtype=torch.float64) if h0 is None else h0.double()
    ys = []
    for t in range(T):
        h_new = alpha[:, t] * h + torch.sqrt(1 - alpha[:, t] ** 2) * i[:, t] * x[:, t].double()
        h = h_new if mask is None else torch.where(mask[:, t, None], h_new, h)
        ys.append(h)
    return torch.stack(ys, 1), h


def test_rglru_scan_matches_step_loop_and_reference():
    layer = rglru()
    x = torch.randn(2, 41, 12, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 41, dtype=torch.bool)
    mask[1, :9] = False
    mask[0, 20:23] = False  # padding in the middle: identity steps
    h0 = torch.randn(2, 12)
    with torch.no_grad():
        y, h = layer(x, h0, mask)
        ys, h_step = [], h0
        for t in range(41):
            y_t, h_step = layer(x[:, t : t + 1], h_step, mask[:, t : t + 1])
            ys.append(y_t)
    y_ref, h_ref = rglru_reference(layer, x, h0, mask)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(ys, 1), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.double(), h_ref, atol=1e-5, rtol=1e-5)
    assert h.dtype == torch.float32


def rglru_autograd(layer, x, h0, mask):
    """The same equations with plain autograd through every op (float64):
    the reference for the layer's analytic backward."""
    B, T, Fw = x.shape
    xb = x.view(B, T, 3, 4)
    r = torch.sigmoid(torch.einsum("btgi,gij->btgj", xb, layer.w_r).reshape(B, T, Fw) + layer.c_r)
    i = torch.sigmoid(torch.einsum("btgi,gij->btgj", xb, layer.w_i).reshape(B, T, Fw) + layer.c_i)
    alpha = torch.exp(-8.0 * r * F.softplus(layer.lam))
    h, ys = h0, []
    for t in range(T):
        h = torch.where(mask[:, t, None], alpha[:, t] * h + torch.sqrt(1 - alpha[:, t] ** 2) * i[:, t] * x[:, t], h)
        ys.append(h)
    return torch.stack(ys, 1), h


def test_rglru_gradients_match_float64_autograd():
    layer = rglru().double()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 41, 12, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 12, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 41, dtype=torch.bool)
    mask[1, :9] = False
    mask[0, 20:23] = False
    cot_y, cot_h = torch.randn(2, 41, 12, generator=g, dtype=torch.float64), torch.randn(2, 12, generator=g).double()
    leaves = [x, h0, *layer.parameters()]
    grads = []
    for fn in (lambda: layer(x, h0, mask), lambda: rglru_autograd(layer, x, h0, mask)):
        y, h = fn()
        grads.append(torch.autograd.grad((y * cot_y).sum() + (h * cot_h).sum(), leaves))
    for name, gf, gr in zip(["x", "h0"] + [n for n, _ in layer.named_parameters()], *grads):
        torch.testing.assert_close(gf, gr, rtol=1e-10, atol=1e-12, msg=name)


def test_sqrt_derivative_is_capped():
    x = torch.tensor([0.0, 1e-12, 0.25, 1.0], requires_grad=True)
    y = sqrt_bounded_grad(x)
    torch.testing.assert_close(y, x.detach().sqrt())
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, torch.tensor([MAX_SQRT_GRAD, MAX_SQRT_GRAD, 1.0, 0.5]))


def test_rglru_gradient_finite_when_alpha_reaches_one_in_bfloat16():
    layer = rglru().to(torch.bfloat16)
    with torch.no_grad():
        layer.lam.fill_(-200.0)  # softplus(lam) underflows: alpha == 1 exactly
    x = torch.randn(2, 9, 12, dtype=torch.bfloat16, requires_grad=True)
    y, h = layer(x)
    (y.float().sum() + h.sum()).backward()
    for name, p in layer.named_parameters():
        assert torch.isfinite(p.grad).all(), name
    assert torch.isfinite(x.grad).all()
    # the uncapped derivative is infinite there: the cap is what keeps it finite
    one_minus_a2 = torch.zeros(3, requires_grad=True)
    torch.sqrt(one_minus_a2).sum().backward()
    assert not torch.isfinite(one_minus_a2.grad).all()


def test_causal_conv_state_and_causality():
    torch.manual_seed(0)
    conv = DepthwiseConv(6, 4)
    x = torch.randn(2, 15, 6)
    with torch.no_grad():
        y, s = conv(x)
        y1, s1 = conv(x[:, :7])
        y2, s2 = conv(x[:, 7:8], s1)
        y3, s3 = conv(x[:, 8:], s2)
        x_future = x.clone()
        x_future[:, 10:] += 1
        y_future, _ = conv(x_future)
    torch.testing.assert_close(torch.cat([y1, y2, y3], 1), y)
    torch.testing.assert_close(s3, s)
    assert s.shape == (2, 3, 6)
    torch.testing.assert_close(s, x[:, -3:])
    torch.testing.assert_close(y_future[:, :10], y[:, :10])  # no look-ahead
    # against torch's own conv with left zero padding
    ref = F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight, conv.bias, groups=6).transpose(1, 2)
    torch.testing.assert_close(y, ref)


def test_centred_conv_for_encoders():
    torch.manual_seed(0)
    conv = DepthwiseConv(6, 3, causal=False)
    x = torch.randn(1, 8, 6)
    y, state = conv(x)
    assert state is None
    ref = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, groups=6, padding=1).transpose(1, 2)
    torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("kind", ["conv", "rglru", "conv_rglru"])
def test_mixer_left_padding_is_invisible(kind):
    torch.manual_seed(0)
    mixer = QKMixer(12, 3, kind)
    x = torch.randn(1, 10, 12)
    garbage = torch.randn(1, 5, 12) * 10
    mask = torch.tensor([[False] * 5 + [True] * 10])
    with torch.no_grad():
        u, conv, h = mixer(torch.cat([garbage, x], 1), mask=mask)
        u_alone, conv_alone, h_alone = mixer(x)
    torch.testing.assert_close(u[:, 5:], u_alone)
    if conv is not None:
        torch.testing.assert_close(conv, conv_alone)
    if h is not None:
        torch.testing.assert_close(h, h_alone)


def test_none_mixer_is_identity():
    x = torch.randn(2, 5, 12)
    u, conv, h = QKMixer(12, 3, "none")(x)
    assert u is x and conv is None and h is None
    assert list(QKMixer(12, 3, "none").parameters()) == []
