"""The memory slots' decoding step over a ring window buffer
(sliding_window.RingWindowState, latte/models/static_decode.py).

`memory.memory_step` with the window buffer as a ring of R slots: the slot
at the ring's write index holds the token that leaves the window after this
step, and MemoryState.pending holds each ring slot's score at the same
slot (laid out by `static_decode.allocate`). The step reads that slot for
the candidate, then writes the new token's score and position there in
place, before `ring_push` writes its key and value: no buffer is shifted.

A ring of fewer than W - 1 slots belongs to a generation too short for any
token to leave the window (R = prompt + max_new_tokens - 1 < W - 1): the
slots keep what they held and pending is not read. memory_step's
arguments (without `local`: the caller merges the read with the window and
the sinks) and result (docs/math.md §4.2; tests/ops/test_ring_window.py).
"""

from __future__ import annotations

import torch

from .._checks import state_dtype
from .memory import MemoryArgs, MemoryState, _insert, _read_step, _received_step, token_scores
from .memory_positions import unrotated
from .sliding_window import RingWindowState


def _arrival(q_t, k_t, v_t, recall_y_t, mark_t, mask_t, state: MemoryState, cfg: MemoryArgs):
    """(the new token's arrival score r [B, K], its position [B], whether it is real [B] or None)."""
    rank = state.count[:, None]  # [B, 1]
    candidate = rank >= cfg.num_sinks if mask_t is None else mask_t[:, None] & (rank >= cfg.num_sinks)
    if cfg.memory.rule == "oracle":
        candidate = candidate & (mark_t[:, None] if mark_t is not None else torch.zeros_like(candidate))
    recall = None if recall_y_t is None else recall_y_t[:, None]
    r = token_scores(cfg.memory, k_t[:, None], v_t[:, None], recall, rank, candidate)
    return r[:, 0], rank[:, 0]


def ring_memory_step(q_t, k_t, v_t, memory_q_t, lse_window_t, recall_y_t, mark_t, mask_t, ring, state, cfg):
    """memory_step (memory.py) with `ring` the RingWindowState before this
    token (not yet pushed) and `state` the static MemoryState, whose pending
    scores are updated in place: (y_t [B, H, D], lse_t [B, H], MemoryState)."""
    if not isinstance(ring, RingWindowState) or not isinstance(state, MemoryState):
        raise ValueError("ring_memory_step: needs the RingWindowState and MemoryState of a static decoding state")
    work = state_dtype(q_t.dtype)
    y, lse = _read_step(memory_q_t.to(work), state, cfg)
    r, pos = _arrival(q_t, k_t, v_t, recall_y_t, mark_t, mask_t, state, cfg)
    count = state.count + (1 if mask_t is None else mask_t.long())
    R = ring.mask.shape[1]
    if R < cfg.window_size - 1:  # nothing leaves the window in this generation
        return y, lse, state._replace(count=count)
    if cfg.memory.rule == "attention":  # the window's attention to every buffered key and to its own
        state.pending.add_(_received_step(q_t, ring.k, lse_window_t, mask_t, cfg.scale, cfg.softcap))
        r = r + _received_step(q_t, k_t[:, None].to(work), lse_window_t, mask_t, cfg.scale, cfg.softcap)[:, 0]
    if R == 0:  # W = 1: the token leaves the window at once
        k_c, v_c, r_c, p_c = k_t, v_t, r, pos
    else:
        at = ring.index.view(1)
        k_c, v_c = ring.k.index_select(1, at)[:, 0], ring.v.index_select(1, at)[:, 0]
        r_c, p_c = state.pending.index_select(1, at)[:, 0], state.pending_pos.index_select(1, at)[:, 0]
    if cfg.memory.rotary is not None:
        k_c = unrotated(cfg.memory.rotary, k_c[:, None].to(work), p_c[:, None])[:, 0]
    held = _insert(state, k_c.to(work), v_c.to(work), r_c, p_c)
    if R:  # the new token's score and position take the leaving one's slot
        state.pending.index_copy_(1, at, r[:, None].to(state.pending.dtype))
        state.pending_pos.index_copy_(1, at, pos[:, None])
    return y, lse, MemoryState(*held, state.pending, state.pending_pos, count)
