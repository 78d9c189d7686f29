"""The benchmark's reimplementation of the paper's appendix scan computes
causal Latte exactly (the reference point is itself checked)."""

import torch

from latte.bench.paper_scan import paper_scan
from latte.ops import reference


def _inputs(B=2, T=37, H=3, L=5, D=4, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    a = torch.randn(B, T, H, L, generator=g, dtype=f64) * scale
    b = torch.randn(B, T, H, L, generator=g, dtype=f64) * scale
    v = torch.randn(B, T, H, D, generator=g, dtype=f64)
    return a, b, v


def test_paper_scan_matches_float64_reference():
    a, b, v = _inputs()
    y_ref, _ = reference.latte_causal(a, b, v)
    torch.testing.assert_close(paper_scan(a, b, v), y_ref, rtol=1e-10, atol=1e-12)


def test_paper_scan_large_logits_stay_finite_and_exact():
    # the running max keeps every exponent <= 0, as in the listing
    a, b, v = _inputs(T=19, scale=40.0, seed=1)
    y = paper_scan(a, b, v)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, reference.latte_causal(a, b, v)[0], rtol=1e-9, atol=1e-10)


def test_paper_scan_gradients_match_reference():
    a, b, v = (x.requires_grad_(True) for x in _inputs(B=1, T=9, H=2, L=3, D=2, seed=2))
    g_out = torch.randn(1, 9, 2, 2, dtype=torch.float64)
    got = torch.autograd.grad(paper_scan(a, b, v), (a, b, v), g_out)
    want = torch.autograd.grad(reference.latte_causal(a, b, v)[0], (a, b, v), g_out)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-10)
