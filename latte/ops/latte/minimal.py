"""Chunked causal Latte in its simplest readable form (docs/math.md §3, §3.2).

This file is for reading, not for use: it is the bridge between the O(T^2)
definition in latte/ops/reference.py and the fast path in causal.py and
chunked.py. It computes the same output and final state with plain torch
and autograd: no mask, no packing, no sub-chunks, no analytic backward.
Tests: tests/ops/test_minimal.py (equal to the float64 reference, forward
and backward, for several chunk sizes and key logits of std 10 to 40).

Legend: B batch, T time, H heads, L latents per head, D value width,
C chunk length (t: query, s: key position inside a chunk).

The state (S, z) before a chunk summarises every earlier token exactly
(§3.1): z [B, H, L] is the log-normaliser log sum_r exp(b_r), S [B, H, L, D]
the normalised value sum Vbar. The empty state is S = 0, z = -inf. Each
weight below is the exponential of "older mass minus total mass", <= 0,
so no logit magnitude can overflow.
"""

from __future__ import annotations

import torch


def latte_causal_minimal(a, b, v, chunk_size=64, initial_state=None):
    """a, b [B, T, H, L], v [B, T, H, D] -> (y [B, T, H, D], (S, z) after the last token)."""
    B, T, H, L = a.shape
    if initial_state is None:
        S = v.new_zeros(B, H, L, v.shape[-1])
        z = b.new_full((B, H, L), float("-inf"))
    else:
        S, z = initial_state
    q = torch.softmax(a, -1)  # p(l | t)
    future = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=a.device).triu(1)
    ys = []
    for start in range(0, T, chunk_size):
        chunk = slice(start, start + chunk_size)
        b_c, v_c, q_c = b[:, chunk], v[:, chunk], q[:, chunk]
        C = b_c.shape[1]  # the last chunk may be shorter
        # z_t for every t in the chunk: the state's mass plus the chunk's own prefix
        z_t = torch.logaddexp(z[:, None], torch.logcumsumexp(b_c, 1))  # [B, C, H, L]
        # inter-chunk: the query against the state before the chunk, reweighted to z_t
        y = torch.einsum("bthl,bhld->bthd", q_c * torch.exp(z[:, None] - z_t), S)
        # intra-chunk: the C x C block of weights exp(b_s - z_t), s <= t, taken in log space
        log_w = b_c[:, None, :] - z_t[:, :, None]  # [B, C(t), C(s), H, L]
        w = torch.exp(log_w.masked_fill(future[:C, :C, None, None], float("-inf")))
        y = y + torch.einsum("bthl,btshl,bshd->bthd", q_c, w, v_c)
        ys.append(y)
        # carry the state to the chunk's end: old state decayed, the chunk's values added
        z_end = z_t[:, -1]  # [B, H, L]
        k = torch.exp(b_c - z_end[:, None])  # [B, C, H, L]
        S = torch.exp(z - z_end)[..., None] * S + torch.einsum("bshl,bshd->bhld", k, v_c)
        z = z_end
    return torch.cat(ys, 1), (S, z)
