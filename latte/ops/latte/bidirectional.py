"""Bidirectional Latte for encoders (docs/math.md §2).

Legend: B batch, T time, H heads, L latents per head (Lh), D value width (dv).

p(l|t) = softmax_l(a_t);  p(s|l) = softmax over ALL real positions s of b_{s,l};
y_t = sum_l p(l|t) sum_s p(s|l) v_s.  Cost O(T L D) per head: the T x T matrix
sum_l p(l|t) p(s|l) is never formed.
"""

from __future__ import annotations

import torch

from .._checks import check_mask, check_nonempty, check_rank, check_same, state_dtype
from .._exp import limit_spread
from .causal import mask_keys


def latte_bidirectional(
    a: torch.Tensor, b: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Bidirectional Latte attention.

    Args:
        a, b: [B, T, H, Lh] query- and key-side latent logits.
        v: [B, T, H, Dv] values.
        mask: [B, T] bool, True = real token. Padded positions are excluded
            from the softmax over time; their outputs are unspecified.
    Returns:
        y [B, T, H, Dv] in v's dtype.
    """
    check_rank("a", a, 4, "[B, T, H, Lh]")
    check_rank("b", b, 4, "[B, T, H, Lh]")
    check_rank("v", v, 4, "[B, T, H, Dv]")
    if a.shape != b.shape:
        raise ValueError(f"a, b: shapes must match [B, T, H, Lh], got {tuple(a.shape)} and {tuple(b.shape)}")
    for i, what in enumerate(("batch sizes", "sequence lengths", "head counts")):
        check_same("a, v", [a.shape[i], v.shape[i]], what)
    check_mask("mask", mask, tuple(a.shape[:2]))
    check_nonempty("a", a, "BT")
    work = state_dtype(a.dtype)
    b, v = mask_keys(b.to(work), v.to(work), mask)
    # over time (a strided dim) the fused softmax costs ~1.2x on std-100 logits, within
    # the 1.3x rule; over the latents (the contiguous dim) 2x: limit_spread there (_exp.py)
    g = torch.softmax(b, dim=1)  # [B, T, H, L] p(s|l), over time
    m = torch.einsum("bthl,bthd->bhld", g, v)  # [B, H, L, D] sum_s p(s|l) v_s
    y = torch.einsum("bthl,bhld->bthd", torch.softmax(limit_spread(a.to(work), -1), dim=-1), m)
    return y.to(v.dtype)
