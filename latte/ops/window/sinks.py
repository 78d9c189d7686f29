"""Attention sinks: the first tokens of each document stay visible next to the
sliding window (docs/math.md §4.1).

Legend: B batch, T time, H query heads, K key/value heads (H = K * G), G
queries per KV head, E query/key width, D value width, S = num_sinks, w the
window size.

The sinks of a row are its first S real tokens (a packed document is a row
once unpacked, docs/math.md §3.3). Query t sees sink s in this branch only
when s is NOT in its window, t - s >= w: the window kernel already counts the
others, so the union of the two key sets is exact and no key is counted
twice. The branch returns its own normalised output and log-normaliser
(-inf where it sees nothing); `merge` combines it with the window's by
log-sum-exp, so the window kernels stay untouched and the mixing with the
latents (macchiato._mix) sees one local branch, as before.

The state holds the S sinks' keys and values once, with their distance to the
next token capped at w (beyond it a sink stays outside the window forever):
constant in T.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import check_mask, check_shape, state_dtype
from .._exp import exp_floored, logaddexp
from ..layout import no_autocast
from .sliding_window import check_window, window_blocked


class SinkState(NamedTuple):
    """The first S real tokens of each row (keys already rotated)."""

    k: torch.Tensor  # [B, S, K, E] (work dtype)
    v: torch.Tensor  # [B, S, K, D]
    mask: torch.Tensor  # [B, S] bool: the slot holds a sink (slots fill in order)
    offset: torch.Tensor  # [B, S] int64: next token's index minus the sink's, capped at w


def check_num_sinks(num_sinks) -> None:
    if isinstance(num_sinks, bool) or not isinstance(num_sinks, int) or num_sinks < 0:
        raise ValueError(f"num_sinks: expected an integer >= 0 (first tokens kept visible), got {num_sinks!r}")


def empty_sink_state(k: torch.Tensor, v: torch.Tensor, num_sinks: int, work) -> SinkState:
    B, K, S = k.shape[0], k.shape[-2], num_sinks
    return SinkState(
        k.new_zeros(B, S, K, k.shape[-1], dtype=work),
        v.new_zeros(B, S, K, v.shape[-1], dtype=work),
        torch.zeros(B, S, dtype=torch.bool, device=k.device),
        torch.zeros(B, S, dtype=torch.int64, device=k.device),
    )


def check_sink_state(state, B: int, k, v, num_sinks: int, name: str) -> None:
    if state is None:
        if num_sinks:
            raise ValueError(
                f"{name}: num_sinks={num_sinks} needs the SinkState of a run with the same num_sinks, got None"
            )
        return
    if not isinstance(state, SinkState):
        raise ValueError(f"{name}: expected a SinkState(k, v, mask, offset) or None, got {type(state).__name__}")
    S, K = num_sinks, k.shape[-2]
    check_shape(f"{name}.k", state.k, (B, S, K, k.shape[-1]), "[B, num_sinks, K, E]")
    check_shape(f"{name}.v", state.v, (B, S, K, v.shape[-1]), "[B, num_sinks, K, D]")
    check_mask(f"{name}.mask", state.mask, (B, S))
    off = state.offset
    if not isinstance(off, torch.Tensor) or off.dtype != torch.int64 or tuple(off.shape) != (B, S):
        got = (off.dtype, tuple(off.shape)) if isinstance(off, torch.Tensor) else type(off).__name__
        raise ValueError(f"{name}.offset: expected an int64 tensor of shape {(B, S)} [B, num_sinks], got {got}")


def _attend(q, ks, vs, keep, scale, softcap):
    """Softmax of q [B, T, H, E] over the S sink slots where keep [B, T, S]:
    (y [B, T, H, D], lse [B, T, H]); y = 0 and lse = -inf where none is kept.
    Work dtype; no exp of an argument below the floor (_exp.py)."""
    B, T, H, E = q.shape
    K = ks.shape[2]
    with no_autocast(q.device.type):  # the work dtype, as the window kernel
        s = torch.einsum("btkge,bske->btkgs", q.reshape(B, T, K, H // K, E), ks) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        keep = keep[:, :, None, None, :]  # [B, T, 1, 1, S]
        s = s.masked_fill(~keep, float("-inf"))
        some = keep.any(-1)  # [B, T, 1, 1]
        m = torch.where(some, s.detach().amax(-1), 0.0).unsqueeze(-1)  # exact for any m: a stabiliser only
        p = exp_floored(s - m) * keep  # masked slots exactly 0
        total = p.sum(-1) + ~some  # 1 where nothing is kept: no 0/0, no log(0)
        y = torch.einsum("btkgs,bskd->btkgd", p, vs) / total.unsqueeze(-1)
        lse = torch.where(some, m.squeeze(-1) + total.log(), float("-inf"))
    return y.reshape(B, T, H, -1), lse.reshape(B, T, H)


def merge(y_win, lse_win, y_sink, lse_sink):
    """One softmax over the window's keys and the sinks outside it, from the
    two separately normalised parts: (y [.., H, D], lse [.., H])."""
    lse = logaddexp(lse_win, lse_sink)  # lse_win is finite: a query sees its own key
    w_win = exp_floored(lse_win - lse).unsqueeze(-1)
    w_sink = exp_floored(lse_sink - lse).unsqueeze(-1)
    return w_win * y_win + w_sink * y_sink, lse


def sink_sequence(q, k, v, num_sinks, window_size, scale, mask, state, lengths=None, softcap=None, sink_q=None):
    """The sink branch over a sequence, in the work dtype:
    (y [B, T, H, D], lse [B, T, H], SinkState after the sequence).

    q [B, T, H, E], k [B, T, K, E], v [B, T, K, D]; mask [B, T] (False =
    padding, never a sink); state: the sinks so far (None: none yet);
    lengths [B]: each row's own end (packed documents), default T; sink_q
    [B, T, H, E]: the queries that score the sinks (default q; a converted
    model passes its queries rotated to one fixed position, so a sink's
    rotary offset no longer grows with the context: docs/math.md §4.1)."""
    B, T = q.shape[:2]
    S, dev = num_sinks, q.device
    work = state_dtype(q.dtype)
    state = state if state is not None else empty_sink_state(k, v, S, work)
    real = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=dev)
    # rank of each real token among the row's real tokens: the first S are the sinks
    rank = state.mask.sum(-1, keepdim=True) + real.cumsum(1) - 1  # [B, T]
    new = real & (rank < S)
    slot = torch.where(new, rank, S)  # slot S collects every non-sink (dropped)
    t = torch.arange(T, device=dev)
    pos = torch.zeros(B, S + 1, dtype=torch.int64, device=dev).scatter_(1, slot, t.expand(B, T))[:, :S]
    took = torch.zeros(B, S + 1, dtype=torch.int64, device=dev).scatter_(1, slot, new.long())[:, :S].bool()

    def fill(old, x):  # the state's sinks, then the new ones gathered from x [B, T, K, X]
        idx = pos[:, :, None, None].expand(B, S, *x.shape[2:])
        return torch.where(took[:, :, None, None], x.to(work).gather(1, idx), old.to(work))

    ks, vs = fill(state.k, k), fill(state.v, v)
    held = state.mask | took
    at = torch.where(took, pos, -state.offset)  # each sink's index relative to this sequence
    keep = held[:, None, :] & (t[None, :, None] - at[:, None, :] >= window_size)  # [B, T, S]: outside the window
    y, lse = _attend((q if sink_q is None else sink_q).to(work), ks, vs, keep, scale, softcap)
    end = torch.full((B, 1), T, device=dev) if lengths is None else lengths.to(dev)[:, None]
    offset = torch.where(held, (end - at).clamp(0, window_size), 0)
    return y, lse, SinkState(ks, vs, held, offset)


def sink_step(q_t, k_t, v_t, num_sinks, window_size, scale, mask_t, state, softcap=None, sink_q_t=None):
    """One decoding step of the sink branch: (y_t [B, H, D], lse_t [B, H],
    SinkState); sink_q_t [B, H, E]: the query that scores the sinks (default q_t)."""
    B = q_t.shape[0]
    S, dev = num_sinks, q_t.device
    work = state_dtype(q_t.dtype)
    state = state if state is not None else empty_sink_state(k_t, v_t, S, work)
    keep = state.mask & (state.offset >= window_size)  # [B, S]: outside the current window
    q_s = q_t if sink_q_t is None else sink_q_t
    y, lse = _attend(q_s.to(work)[:, None], state.k.to(work), state.v.to(work), keep[:, None], scale, softcap)
    real = mask_t if mask_t is not None else torch.ones(B, dtype=torch.bool, device=dev)
    # a real token takes the first free slot (slots fill in order)
    take = (torch.arange(S, device=dev)[None] == state.mask.sum(-1, keepdim=True)) & real[:, None]  # [B, S]
    ks = torch.where(take[..., None, None], k_t.to(work)[:, None], state.k.to(work))
    vs = torch.where(take[..., None, None], v_t.to(work)[:, None], state.v.to(work))
    held = state.mask | take
    offset = torch.where(held, (torch.where(take, 0, state.offset) + 1).clamp(max=window_size), 0)
    return y[:, 0], lse[:, 0], SinkState(ks, vs, held, offset)


def window_sinks_lse(q, k, v, *, window_size, num_sinks, scale=None, mask=None, softcap=None, sink_q=None):
    """Softmax attention over the window plus the first num_sinks tokens, with
    its log-normaliser: (y [B, T, H, D] in v's dtype, lse [B, T, H] float32).
    num_sinks = 0 is sliding_window_attention_lse; sink_q: see sink_sequence."""
    check_window(q, k, v, window_size, mask, softcap)
    check_num_sinks(num_sinks)
    if sink_q is not None:
        check_shape("sink_q", sink_q, tuple(q.shape), "(same as q)")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    y, lse, _ = window_blocked(q, k, v, window_size, scale, mask, None, softcap=softcap)
    if num_sinks:
        y_s, lse_s, _ = sink_sequence(
            q, k, v, num_sinks, window_size, scale, mask, None, softcap=softcap, sink_q=sink_q
        )
        y, lse = merge(y, lse, y_s, lse_s)
    return y.to(v.dtype), lse
