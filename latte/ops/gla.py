"""Causal Latte as a gated linear attention, run by fla-core's kernels
(docs/math.md §3.2; backend "fla", see backend.py).

Legend: B batch, T time, H heads, L latents per head (the GLA key width),
D value width per head, N documents of a packed batch.

With z_t = logaddexp(z_0, logcumsumexp_{s<=t} b_s) per latent (z_0 the
state's log-normaliser, -inf without one):
  query  q_t = softmax(a_t)
  key    k_t = exp(b_t - z_t)           in [0, 1]
  decay  g_t = z_{t-1} - z_t            <= 0 (log space, per key channel)
  scale  1
GLA's state h_t = exp(g_t) h_{t-1} + k_t v_t^T is then Latte's normalised
state S_t = sum_s exp(b_s - z_t) v_s (the decays telescope to exp(z_s - z_t)),
and o_t = q_t h_t is y_t. The state (S, z) of LatteState maps one to one:
S is GLA's h, z is kept beside it.

Two guards, both exact to far below float32 precision:
- b is centred on its largest value per latent (p(s|l,t) does not change)
  so that z keeps float32 precision when all logits share a large offset.
- g is clamped at G_FLOOR: a jump of z by more than 40 (a logit far above
  everything before it, or the first real token after masked ones, whose
  logits are -1e30) leaves at most exp(-40) = 4e-18 of the old state instead
  of 0, and keeps the kernels' in-chunk cumulative sums of g small, so their
  float32 differences stay precise.

Masked tokens (mask False) get k = 0: they add nothing and leave z as it is.
Gradients flow through this construction by autograd and through the GLA
kernel by fla's own backward.

fla's kernels run float32 dots in TF32 on Ampere and newer GPUs (relative
errors ~1e-3); TRITON_F32_DEFAULT=ieee in the environment before the first
call makes them exact float32 (see README, "GPU").
"""

from __future__ import annotations

import torch

from ._checks import check_cu_seqlens, state_dtype
from .causal import LatteState, _check_state, mask_logits

# Smallest log-decay passed to the kernels (see the module docstring).
G_FLOOR = -40.0

_HALF = (torch.bfloat16, torch.float16)


def _kernels():
    """(chunk_gla, fused_recurrent_gla) from fla-core; the tests swap in
    pure-torch stand-ins with the same signatures."""
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    return chunk_gla, fused_recurrent_gla


def gla_inputs(a, b, *, mask=None, z0=None):
    """a, b [B, T, H, L], mask [B, T] bool, z0 [B, H, L] (None: no earlier
    tokens) -> q, k, g [B, T, H, L] in the work dtype (float32, float64 for
    float64 inputs) and z after the last token [B, H, L]."""
    work = state_dtype(a.dtype)
    q = torch.softmax(a.to(work), dim=-1)
    b = mask_logits(b.to(work), mask)
    c = b.amax(1) if z0 is None else torch.maximum(b.amax(1), z0.to(work))
    c = c.detach()  # [B, H, L]: a shift that cancels in k and g (precision only)
    bc = b - c.unsqueeze(1)
    z = torch.logcumsumexp(bc, dim=1)  # [B, T, H, L]
    if z0 is None:
        z_before = torch.full_like(z[:, :1], float("-inf"))
    else:
        z_before = (z0.to(work) - c).unsqueeze(1)
        z = torch.logaddexp(z, z_before)
    k = torch.exp(bc - z)
    if mask is not None:
        k = k.masked_fill(~mask[:, :, None, None], 0.0)
    g = (torch.cat([z_before, z[:, :-1]], 1) - z).clamp(G_FLOOR, 0.0)
    return q, k, g, z[:, -1] + c


def _io_dtype(v):
    """q, k, v go to the kernels in v's dtype when it is half precision,
    float32 otherwise; g and the state are float32. (float64 passes through
    for the tests' stand-in kernels; backend.py never sends it to fla.)"""
    return v.dtype if v.dtype in _HALF else state_dtype(v.dtype)


def _call(kernel, q, k, v, g, state, **kw):
    io, work = _io_dtype(v), state_dtype(v.dtype)
    S0 = None if state is None else state.S.to(work).contiguous()
    return kernel(q.to(io), k.to(io), v.to(io), g.to(work), scale=1.0, initial_state=S0,
                  output_final_state=True, **kw)


def gla_chunked(a, b, v, state=None, mask=None):
    """Dense batch: (y [B, T, H, D] in the work dtype, as _chunked; LatteState)."""
    q, k, g, z_last = gla_inputs(a, b, mask=mask, z0=None if state is None else state.z)
    y, S = _call(_kernels()[0], q, k, v, g, state)
    return y.to(state_dtype(v.dtype)), LatteState(S, z_last)


def _packed(a, b, v, cu_seqlens, state, mask):
    """Packed documents (B == 1): the construction per document on a padded
    copy (z restarts at each document), the kernel on the packed tensors."""
    from .varlen import pack, unpack

    (a_pad, doc), (b_pad, _) = unpack(a, cu_seqlens), unpack(b, cu_seqlens)
    run_mask = doc if mask is None else doc & unpack(mask.unsqueeze(-1), cu_seqlens)[0].squeeze(-1)
    q, k, g, z_last = gla_inputs(a_pad, b_pad, mask=run_mask, z0=None if state is None else state.z)
    q, k, g = (pack(x, doc) for x in (q, k, g))  # [1, T, H, L]
    y, S = _call(_kernels()[0], q, k, v, g, state, cu_seqlens=cu_seqlens.long())
    return y, LatteState(S, z_last)


def latte_causal_fla(a, b, v, *, initial_state=None, output_final_state=False, cu_seqlens=None, mask=None):
    """latte_causal on fla-core's chunk_gla (same arguments and results; the
    caller has checked a, b, v and mask). The state is float32."""
    B, T, H, L = a.shape
    D = v.shape[-1]
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T)
        if initial_state is not None:
            _check_state(initial_state, cu_seqlens.numel() - 1, H, L, D)
        y, state = _packed(a, b, v, cu_seqlens, initial_state, mask)
    else:
        if T == 0:
            raise ValueError("a: sequence length T must be >= 1, got 0")
        if initial_state is not None:
            _check_state(initial_state, B, H, L, D)
        y, state = gla_chunked(a, b, v, initial_state, mask)
    return y.to(v.dtype), (state if output_final_state else None)


def latte_step_fla(a_t, b_t, v_t, state=None, mask_t=None):
    """latte_causal_step on fla-core's fused_recurrent_gla (checked inputs):
    a_t, b_t [B, H, L], v_t [B, H, D] -> (y_t [B, H, D], LatteState)."""
    B, H, L = a_t.shape
    D = v_t.shape[-1]
    work = state_dtype(a_t.dtype)
    if state is None:
        S = v_t.new_zeros(B, H, L, D, dtype=work)
        z = v_t.new_full((B, H, L), float("-inf"), dtype=work)
    else:
        _check_state(state, B, H, L, D, name="state")
        S, z = state.S.to(work).contiguous(), state.z.to(work)
    b = mask_logits(b_t.to(work), mask_t)
    z_new = torch.logaddexp(z, b)
    k = torch.exp(b - z_new)
    if mask_t is not None:
        k = k.masked_fill(~mask_t[:, None, None], 0.0)
    g = (z - z_new).clamp(G_FLOOR, 0.0)  # -inf (empty state) -> G_FLOOR: the state is 0 anyway
    q = torch.softmax(a_t.to(work), -1)
    y, S_new = _call(_kernels()[1], q.unsqueeze(1), k.unsqueeze(1), v_t.unsqueeze(1), g.unsqueeze(1),
                     LatteState(S, z))
    return y[:, 0].to(v_t.dtype), LatteState(S_new, z_new)
