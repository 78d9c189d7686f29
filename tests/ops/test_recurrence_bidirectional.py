"""linear_recurrence and bidirectional Latte against their float64 references."""

import pytest
import torch

from latte.ops import latte_bidirectional, linear_recurrence
from latte.ops import reference as R
from tests.helpers import grads_of, rel_err

f64 = torch.float64


@pytest.mark.parametrize("T,C", [(1, 64), (5, 2), (64, 8), (100, 7), (257, 64)])
def test_linear_recurrence_matches_loop(T, C):
    x = torch.randn(2, T, 3, 4, dtype=f64)
    log_a = -torch.rand(2, T, 3, 4, dtype=f64) * 3
    h0 = torch.randn(2, 3, 4, dtype=f64)

    def fast(x, log_a, h0):
        h, last = linear_recurrence(x, log_a, initial_state=h0, output_final_state=True, chunk_size=C)
        return torch.cat([h.flatten(), last.flatten()])

    def ref(x, log_a, h0):
        h, last = R.linear_recurrence(x, log_a, h0)
        return torch.cat([h.flatten(), last.flatten()])

    out, g = grads_of(fast, [x, log_a, h0])
    out_ref, g_ref = grads_of(ref, [x, log_a, h0])
    assert rel_err(out, out_ref) < 1e-12
    for gx, gr in zip(g, g_ref):
        assert rel_err(gx, gr) < 1e-11


def test_linear_recurrence_extreme_decays_are_exact():
    x = torch.randn(1, 50, 6)
    log_a = torch.zeros(1, 50, 6)
    log_a[0, 10] = float("-inf")  # a full reset
    log_a[0, 20] = -1e30
    log_a[0, 30:] = -1e-7  # almost no decay: cumulative sums would lose it
    h, _ = linear_recurrence(x, log_a, chunk_size=16)
    h_ref, _ = R.linear_recurrence(x, log_a)
    assert torch.isfinite(h).all() and rel_err(h, h_ref) < 1e-6
    _, g = grads_of(lambda x, la: linear_recurrence(x, la, chunk_size=16)[0], [x, log_a])
    assert all(torch.isfinite(t).all() for t in g)


def bidir_inputs(T=33, B=2, H=3, L=5, D=7):
    return (
        torch.randn(B, T, H, L, dtype=f64),
        torch.randn(B, T, H, L, dtype=f64) * 4,
        torch.randn(B, T, H, D, dtype=f64),
    )


def test_bidirectional_matches_reference():
    a, b, v = bidir_inputs()
    out, g = grads_of(lambda a, b, v: latte_bidirectional(a, b, v), [a, b, v])
    out_ref, g_ref = grads_of(lambda a, b, v: R.latte_bidirectional(a, b, v), [a, b, v])
    assert rel_err(out, out_ref) < 1e-12
    for x, xr in zip(g, g_ref):
        assert rel_err(x, xr) < 1e-11
    y32 = latte_bidirectional(a.float(), (b * 10).float(), v.float())
    assert rel_err(y32, R.latte_bidirectional(a, b * 10, v)) < 1e-5
    A = R.latte_bidirectional_matrix(a, b)
    assert torch.allclose(A.sum(-1), torch.ones_like(A[..., 0]))


def test_bidirectional_padding_does_not_change_real_outputs():
    a, b, v = bidir_inputs()
    mask = torch.ones(2, 33, dtype=torch.bool)
    mask[0, 25:] = False
    mask[1, :4] = False
    y = latte_bidirectional(a, b, v, mask=mask)
    garbage = [x.clone() for x in (a, b, v)]
    for x in garbage:
        x[~mask] = 1e3 * torch.randn_like(x[~mask])
    y2 = latte_bidirectional(*garbage, mask=mask)
    assert rel_err(y2[mask], y[mask]) < 1e-12
    assert rel_err(y[0, :25], latte_bidirectional(a[:1, :25], b[:1, :25], v[:1, :25])[0]) < 1e-12


def test_bidirectional_is_permutation_equivariant():
    a, b, v = bidir_inputs()
    perm = torch.randperm(33)
    y = latte_bidirectional(a, b, v)
    y_p = latte_bidirectional(a[:, perm], b[:, perm], v[:, perm])
    assert rel_err(y_p, y[:, perm]) < 1e-12
