"""exp with a cost that does not depend on its argument (shared by the ops).

On CPU, torch's vectorised exp leaves its fast path for arguments whose
result is subnormal or zero (below about -87.3 in float32, -708 in float64,
-inf included): such lanes cost ~10-40x more. Logits that spread (trained
models, std 10 and more) produce many of them, so every op clamps its exp
arguments at a floor first. A weight below exp(floor), next to weights that
sum to at most 1 (or relative to a row's largest), is then off by at most
exp(floor): 4e-18 in float32, far below its resolution; float64 keeps a
floor of -300. Two factors >= exp(floor) also multiply to a normal float
(products of subnormals are slow on some CPUs too).

The chunked Latte kernel works in base 2 (`exp2_nonpositive_`): its logits
are scaled by log2(e) once, and torch's vectorised exp2 costs about a third
of exp on the project's CPU (and leaves its fast path only below -126 in
float32, far past the floor).
"""

from __future__ import annotations

import torch

_FLOOR = {torch.float64: -300.0}
_DEFAULT_FLOOR = -40.0
LOG2E = 1.4426950408889634  # log2(e): x nats are x * LOG2E bits


def exp_floor(dtype: torch.dtype) -> float:
    return _FLOOR.get(dtype, _DEFAULT_FLOOR)


def exp_nonpositive_(x: torch.Tensor) -> torch.Tensor:
    """exp(clamp(x, floor, 0)) in place, for a log-weight x <= 0 (up to rounding;
    the upper clamp also keeps entries that are masked later finite)."""
    return x.clamp_(min=exp_floor(x.dtype), max=0.0).exp_()


def exp2_nonpositive_(x: torch.Tensor) -> torch.Tensor:
    """2 ** clamp(x, floor * LOG2E, 0) in place: exp_nonpositive_ for an
    exponent in base 2 (the same floor, in bits)."""
    return x.clamp_(min=exp_floor(x.dtype) * LOG2E, max=0.0).exp2_()


def exp_floored(x: torch.Tensor) -> torch.Tensor:
    """exp(max(x, floor)), out of place (differentiable)."""
    return torch.exp(torch.clamp(x, min=exp_floor(x.dtype)))


def limit_spread(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x with every entry more than -floor below the max along dim raised to
    max + floor, so that a fused softmax / log_softmax of it (whose internal
    exp has the same slow lanes) never exponentiates below the floor. Such an
    entry's probability (< exp(floor)) changes by at most exp(floor); its
    gradient, ~0, becomes 0."""
    m = x.detach().amax(dim, keepdim=True)
    return torch.maximum(x, m + exp_floor(x.dtype))


def logaddexp(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """logaddexp(x, y) with the smaller term's exponent clamped (differentiable).
    Either may be -inf, not both at one position."""
    hi = torch.maximum(x, y)
    return hi + torch.log1p(exp_floored(torch.minimum(x, y) - hi))


def logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """torch.logsumexp(x, dim) for finite x, with its exp (and the softmax of
    its gradient) off the slow lanes."""
    m = x.detach().amax(dim, keepdim=True)
    return (m + exp_floored(x - m).sum(dim, keepdim=True).log()).squeeze(dim)
