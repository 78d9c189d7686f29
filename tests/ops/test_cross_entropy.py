"""The fused, chunked head + cross-entropy against the float64 reference:
value and gradients, ignored targets, chunks that do not divide N, autocast,
the no-gradient path, and bad inputs."""

import pytest
import torch

from latte.ops import linear_cross_entropy, reference
from tests.helpers import grads_of, rel_err


def _inputs(N=37, D=16, V=101, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, D, generator=g) * scale
    W = torch.randn(V, D, generator=g) * 0.3
    t = torch.randint(0, V, (N,), generator=g)
    t[::5] = -100
    return h, W, t


@pytest.mark.parametrize("chunk_rows", [None, 1, 8, 36, 37, 100])
@pytest.mark.parametrize("scale", [1.0, 30.0])  # 30: logits in the hundreds
def test_value_and_gradients_match_float64(chunk_rows, scale):
    h, W, t = _inputs(scale=scale)
    val, grads = grads_of(lambda h, W: linear_cross_entropy(h, W, t, chunk_rows=chunk_rows), [h, W])
    ref, ref_grads = grads_of(lambda h, W: reference.linear_cross_entropy(h, W, t), [h.double(), W.double()])
    assert val.dtype == torch.float32
    assert rel_err(val, ref) < 1e-6
    for a, b in zip(grads, ref_grads):
        assert rel_err(a, b) < 1e-5


def test_gradient_is_scaled_by_the_incoming_gradient():
    h, W, t = _inputs()
    h1, h2 = h.clone().requires_grad_(), h.clone().requires_grad_()
    (3.5 * linear_cross_entropy(h1, W, t)).backward()
    linear_cross_entropy(h2, W, t).backward()
    torch.testing.assert_close(h1.grad, 3.5 * h2.grad)


def test_all_ignored_gives_zero_loss_and_zero_gradient():
    h, W, t = _inputs()
    h.requires_grad_()
    loss = linear_cross_entropy(h, W, torch.full_like(t, -100))
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0


def test_no_grad_path_and_weight_only_gradient():
    h, W, t = _inputs()
    with torch.no_grad():
        v = linear_cross_entropy(h, W, t)
    torch.testing.assert_close(v.double(), reference.linear_cross_entropy(h, W, t), rtol=1e-6, atol=0)
    W = W.clone().requires_grad_()
    linear_cross_entropy(h, W, t).backward()  # h needs no gradient
    W64 = W.detach().double().requires_grad_()
    reference.linear_cross_entropy(h, W64, t).backward()
    assert rel_err(W.grad, W64.grad) < 1e-5


def test_bf16_autocast_matches_the_linear_layer_it_replaces():
    h, W, t = _inputs(N=64, D=32, V=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, W).float(), t, reduction="sum")
        fused = linear_cross_entropy(h, W, t)
    assert fused.dtype == torch.float32
    assert rel_err(fused, plain) < 1e-2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(targets=torch.tensor([0, 101, 1])), r"targets: found 101; targets must be in \[0, 100\]"),
        (dict(targets=torch.tensor([0.0, 1.0, 2.0])), "targets: expected an integer tensor"),
        (dict(targets=torch.tensor([0, 1])), r"\[N\] = \(3,\)"),
        (dict(weight=torch.randn(101, 5)), "widths must match"),
        (dict(hidden=torch.randn(3, 16, dtype=torch.float64)), "dtypes must match"),
        (dict(chunk_rows=0), "chunk_rows: expected an integer >= 1"),
    ],
)
def test_bad_inputs_name_the_problem(kwargs, match):
    args = dict(hidden=torch.randn(3, 16), weight=torch.randn(101, 16), targets=torch.tensor([0, 1, 2]))
    chunk = kwargs.pop("chunk_rows", None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(args["hidden"], args["weight"], args["targets"], chunk_rows=chunk)
