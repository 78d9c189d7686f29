"""Student's t distribution for the experiments' confidence intervals: the
central probability in closed form and its quantiles by bisection, exact
to floating point for any integer degrees of freedom (no scipy needed).
Used by the MQAR seed comparison (experiments/mqar/report.py) and the
conversion recipes' curve (experiments/pilots/study.py)."""

from __future__ import annotations

import math


def t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer df >= 1, t >= 0, in closed form
    (Abramowitz and Stegun 26.7.3-26.7.4)."""
    if df < 1 or t < 0:
        raise ValueError(f"t_central: need df >= 1 and t >= 0, got df={df}, t={t}")
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(q: float, df: int) -> float:
    """The q quantile (q in (0.5, 1)) of Student's t with df degrees of freedom, by bisection."""
    lo, hi = 0.0, 1.0
    while 0.5 + t_central(hi, df) / 2 < q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 + t_central(mid, df) / 2 < q else (lo, mid)
    return (lo + hi) / 2
