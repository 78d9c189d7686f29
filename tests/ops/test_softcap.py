"""Soft-capped window scores (Gemma 2: e -> c * tanh(e / c)) and a custom
score scale: blocked kernel, decode step and Macchiato == float64 reference,
forward and gradients."""

import pytest
import torch

from latte.ops import (
    macchiato,
    macchiato_step,
    sliding_window_attention,
    sliding_window_attention_lse,
    sliding_window_step,
)
from latte.ops import (
    reference as R,
)
from tests.helpers import grads_of, rel_err

f64 = torch.float64


def qkv(T, H=4, K=2, E=6, D=5, B=2):
    # scores of a few units: the cap (2.0 below) bends most of them
    return (
        torch.randn(B, T, H, E, dtype=f64) * 2,
        torch.randn(B, T, K, E, dtype=f64) * 2,
        torch.randn(B, T, K, D, dtype=f64),
    )


@pytest.mark.parametrize("T,W", [(1, 4), (37, 5), (130, 70)])
def test_softcapped_window_matches_reference_forward_and_grad(T, W):
    q, k, v = qkv(T)
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, : T // 3] = False
    kw = dict(scale=0.3, softcap=2.0)

    def fast(q, k, v):
        y, lse, _ = sliding_window_attention_lse(q, k, v, window_size=W, mask=mask, **kw)
        return torch.cat([y.flatten(), lse.flatten()])

    def ref(q, k, v):
        y, lse = R.sliding_window_attention(q, k, v, W, mask=mask, **kw)
        return torch.cat([y.flatten(), lse.flatten()])

    out, g = grads_of(fast, [q, k, v])
    out_ref, g_ref = grads_of(ref, [q, k, v])
    assert rel_err(out, out_ref) < 1e-12
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-4) < 1e-10
    # the cap changes the result: the test above is not vacuous
    y_uncapped, _ = R.sliding_window_attention(q, k, v, W, mask=mask, scale=0.3)
    if T > 1:
        assert rel_err(out_ref[: y_uncapped.numel()], y_uncapped.flatten()) > 1e-3
    y32, _ = sliding_window_attention(q.float(), k.float(), v.float(), window_size=W, mask=mask, **kw)
    assert rel_err(y32, out_ref[: y32.numel()].view_as(y32)) < 1e-5


def test_softcapped_steps_equal_blocked():
    q, k, v = qkv(40)
    y_full, st = sliding_window_attention(
        q[:, :15], k[:, :15], v[:, :15], window_size=9, softcap=1.5, output_final_state=True
    )
    ys = [y_full]
    for t in range(15, 40):
        y_t, st = sliding_window_step(q[:, t], k[:, t], v[:, t], window_size=9, softcap=1.5, state=st)
        ys.append(y_t[:, None])
    y_ref, _ = R.sliding_window_attention(q, k, v, 9, softcap=1.5)
    assert rel_err(torch.cat(ys, 1), y_ref) < 1e-12


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_softcapped_macchiato_matches_reference_and_steps(mix):
    T, W = 45, 8
    q, k, v = qkv(T)
    a, b = torch.randn(2, T, 4, 3, dtype=f64), torch.randn(2, T, 4, 3, dtype=f64) * 2
    gate = torch.randn(2, T, 4, dtype=f64) if mix == "gate" else None
    beta = torch.randn(4, dtype=f64)
    kw = dict(window_size=W, mix=mix, scale=0.25, softcap=3.0)
    args = [a, b, v, q, k, beta] + ([gate] if gate is not None else [])

    def fast(a, b, v, q, k, beta, gate=None):
        return macchiato(a, b, v, q, k, gate=gate, beta=beta, chunk_size=16, **kw)[0]

    def ref(a, b, v, q, k, beta, gate=None):
        return R.macchiato(a, b, v, q, k, W, mix, gate, beta, scale=0.25, softcap=3.0)

    out, g = grads_of(fast, args)
    out_ref, g_ref = grads_of(ref, args)
    assert rel_err(out, out_ref) < 1e-11
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr, floor=1e-3) < 1e-9
    _, st = macchiato(
        *(x[:, :20] for x in (a, b, v, q, k)),
        gate=None if gate is None else gate[:, :20],
        beta=beta,
        output_final_state=True,
        **kw,
    )
    ys = []
    for t in range(20, T):
        y_t, st = macchiato_step(
            a[:, t],
            b[:, t],
            v[:, t],
            q[:, t],
            k[:, t],
            beta=beta,
            gate_t=None if gate is None else gate[:, t],
            state=st,
            **kw,
        )
        ys.append(y_t[:, None])
    assert rel_err(torch.cat(ys, 1), out_ref[:, 20:]) < 1e-12


@pytest.mark.parametrize("bad", [0, -1.0, True, "2"])
def test_softcap_must_be_positive(bad):
    q, k, v = qkv(5)
    with pytest.raises(ValueError, match="softcap"):
        sliding_window_attention(q, k, v, window_size=3, softcap=bad)
