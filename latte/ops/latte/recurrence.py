"""Element-wise linear recurrence h_t = exp(log_a_t) * h_{t-1} + x_t.

This is the scan behind RG-LRU (docs/math.md §5) and behind the
chunk-to-chunk state passing of causal Latte (section 3.2).

Legend: B batch, T time, F any trailing feature dims, N chunks, C chunk size.

Algorithm: a two-level scan. Time is cut into N chunks of C steps (C about
sqrt(T), so that the two loops below have about 2 sqrt(T) steps together).
  1. inside every chunk at once: a C-step loop computes the local scan (from a
     zero state) and the running product of decays, vectorised over chunks;
     both ride in one tensor ([local, decay] follow the same recurrence with
     inputs [x, 0]), so each step is one op;
  2. across chunks: an N-step loop carries the state;
  3. every position adds (product of decays since chunk start) * carried state.
Only products of decays in (0, 1] are formed, never differences of cumulative
log-decays (those lose all precision when a decay is extreme, e.g. log_a = -1e30,
and give inf - inf = NaN for log_a = -inf). The backward pass is the same
scan run backwards in time (custom autograd, indexed from the end: no flipped
copies), so nothing per step is saved.
"""

from __future__ import annotations

import math

import torch

from .._checks import check_float, check_positive_int, check_shape, state_dtype
from .._exp import exp_floored


def _scan(x: torch.Tensor, a: torch.Tensor, h0: torch.Tensor | None, chunk: int, reverse: bool = False):
    """h_t = a_t h_{t-1} + x_t along dim 1 (no autograd); reverse: h_t =
    a_t h_{t+1} + x_t from the end. x, a: [B, T, *F]. Returns (h, the state
    after the last step: h_{T-1}, or h_0 when reverse).

    Step-major inside ([C, 2, B, N, *F]): each step of the in-chunk loop is
    one contiguous slab, with the decay broadcast over the outer [local,
    decay] dim, so the loop runs long vectorised inner loops (with the step
    as a middle dim, the inner loops were one feature row long)."""
    B, T = x.shape[:2]
    feat = x.shape[2:]
    C = max(1, min(chunk, T))
    N = -(-T // C)
    pad = N * C - T
    if pad:  # identity steps at the end: decay 1, input 0 (also right for the reverse scan)
        x = torch.cat([x, x.new_zeros((B, pad, *feat))], 1)
        a = torch.cat([a, a.new_ones((B, pad, *feat))], 1)
    a = a.view(B, N, C, *feat).movedim(2, 0).contiguous()  # [C, B, N, *F]
    # [local, decay] of every chunk, from a zero state: y_i = a_i y_(i-1) + [x_i, 0]
    y = x.new_empty((C, 2, B, N, *feat))
    y[:, 0] = x.view(B, N, C, *feat).movedim(2, 0)
    y[:, 1] = 0.0
    first, steps = (C - 1, range(C - 2, -1, -1)) if reverse else (0, range(1, C))
    y[first, 1] = a[first]
    ys, as_ = y.unbind(0), a.unsqueeze(1).unbind(0)
    for i in steps:
        ys[i].addcmul_(as_[i], ys[i + 1 if reverse else i - 1])
    local, decay = y.unbind(1)  # [C, B, N, *F]
    carry = torch.empty((B, N, *feat), dtype=x.dtype, device=x.device)  # state before chunk n (after, reverse)
    h = h0 if h0 is not None else x.new_zeros((B, *feat))
    last = 0 if reverse else C - 1  # each chunk's total: after its last step
    for n in range(N - 1, -1, -1) if reverse else range(N):
        carry[:, n] = h
        h = torch.addcmul(local[last, :, n], decay[last, :, n], h)
    out = local.addcmul_(decay, carry).movedim(0, 2).reshape(B, N * C, *feat)
    return out[:, :T], h


def auto_chunk(T: int) -> int:
    """About sqrt(T): the C - 1 steps inside the chunks and the N = T / C
    steps across them cost about the same per-op overhead."""
    return max(4, math.isqrt(T))


class _LinearRecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log_a, h0, chunk):
        a = exp_floored(log_a)  # a decay below exp(floor) acts as exp(floor): a full reset either way
        h, h_last = _scan(x, a, h0, chunk)
        ctx.save_for_backward(a, x, h, h0)
        ctx.chunk = chunk
        return h, h_last

    @staticmethod
    def backward(ctx, g_h, g_last):
        a, x, h, h0 = ctx.saved_tensors
        if g_h is None:
            g_h = torch.zeros_like(h)
        if g_last is not None:  # the final state is h_{T-1}
            g_h = g_h.clone()
            g_h[:, -1] += g_last
        # dL/dx_t = g_h_t + a_{t+1} dL/dx_{t+1}: the same scan, backwards in time
        a_next = torch.empty_like(a)
        a_next[:, :-1] = a[:, 1:]
        a_next[:, -1] = 0.0
        g_x, _ = _scan(g_h, a_next, None, ctx.chunk, reverse=True)
        g_log_a = g_x * (h - x)  # d/dlog_a of a_t h_{t-1} is a_t h_{t-1} = h_t - x_t
        g_h0 = (a[:, 0] * g_x[:, 0]) if h0 is not None else None
        return g_x, g_log_a, g_h0, None


def linear_recurrence(
    x: torch.Tensor,
    log_a: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scan h_t = exp(log_a_t) * h_{t-1} + x_t along dim 1.

    Args:
        x: [B, T, *F] inputs.
        log_a: [B, T, *F] log-decays (<= 0 for a contracting recurrence; any
            real value or -inf is accepted).
        initial_state: [B, *F] h_{-1}, or None for zeros.
        output_final_state: also return h_{T-1} (float32; float64 for float64 x).
        chunk_size: steps per chunk of the two-level scan (None: about
            sqrt(T), where the cost is mostly the per-op overhead of the
            C + N steps).
    Returns:
        (h [B, T, *F] in x's dtype, h_last [B, *F] float32 or None)
    """
    check_float("x", x)
    check_shape("log_a", log_a, tuple(x.shape), "(same as x)")
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    if x.dim() < 2:
        raise ValueError(f"x: expected at least [B, T], got shape {tuple(x.shape)}")
    work = state_dtype(x.dtype)
    if initial_state is not None:
        check_shape("initial_state", initial_state, (x.shape[0], *x.shape[2:]), "[B, *F]")
        initial_state = initial_state.to(work)
    chunk = chunk_size or auto_chunk(x.shape[1])
    h, h_last = _LinearRecurrence.apply(x.to(work), log_a.to(work), initial_state, chunk)
    return h.to(x.dtype), (h_last if output_final_state else None)
