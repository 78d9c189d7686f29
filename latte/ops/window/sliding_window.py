"""Exact causal sliding-window softmax attention (docs/math.md §4, the l = 0 state).

Legend: B batch, T time, H query heads, K key/value heads (H = K * G, grouped
KV), G queries per KV head, E query/key width, D value width, W window size,
P = W - 1 cached tokens, Q query block, N blocks.

Token t attends to s in (t - W, t]. The blocked form cuts the queries into
blocks of Q tokens and the keys into tiles of Q; block n sees the c + 1 tiles
ending with its own (c = ceil((W - 1) / Q)), so the scores are
[N, Q, (c + 1) Q]-sized: linear in T, never T x T. Besides the output it
returns the log-normaliser lse_t = log sum_{s in W(t)} exp(e_{t,s}), which
Macchiato needs to mix the window with the latents in one distribution.
Optional soft-capping (Gemma 2) replaces each score e by c * tanh(e / c).

A query always sees its own key, even when it is padding: every row then has
at least one finite score, so no NaN arises from an empty softmax, and real
tokens never see padded keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._checks import (
    check_finite,
    check_mask,
    check_nonempty,
    check_positive_int,
    check_rank,
    check_same,
    check_shape,
    state_dtype,
)
from .._exp import exp_floored
from .window_tiles import WindowTiles


class WindowState(NamedTuple):
    """Keys/values of the last P tokens, oldest first (keys already carry
    their RoPE rotation): P = min(W - 1, positions fed so far), so it grows
    with the first W - 1 positions, then stays constant in T. A window far
    beyond the sequence costs the sequence, not the window."""

    k: torch.Tensor  # [B, P, K, E]
    v: torch.Tensor  # [B, P, K, D]
    mask: torch.Tensor  # [B, P] bool, True where the slot holds a real token


def check_qkv(q, k, v, mask, suffix=""):
    dims = 3 if suffix else 4
    layout = "[B, H, E]" if suffix else "[B, T, H, E]"
    check_rank("q" + suffix, q, dims, layout)
    check_rank("k" + suffix, k, dims, layout.replace("H", "K"))
    check_rank("v" + suffix, v, dims, layout.replace("H", "K").replace("E", "D"))
    lead = dims - 2
    check_same(f"q{suffix}, k{suffix}, v{suffix}", [q.shape[0], k.shape[0], v.shape[0]], "batch sizes")
    if not suffix:
        check_same("q, k, v", [q.shape[1], k.shape[1], v.shape[1]], "sequence lengths")
    check_same(f"q{suffix}, k{suffix}", [q.shape[-1], k.shape[-1]], "query/key widths")
    check_same(f"k{suffix}, v{suffix}", [k.shape[lead], v.shape[lead]], "key/value head counts")
    if q.shape[lead] % k.shape[lead]:
        raise ValueError(
            f"q{suffix}, k{suffix}: query heads ({q.shape[lead]}) must be a multiple of "
            f"key/value heads ({k.shape[lead]})"
        )
    check_mask("mask" + suffix, mask, tuple(q.shape[:lead]))


def check_softcap(softcap) -> None:
    """None or c > 0, finite (scores become c * tanh(s / c); c = inf would give inf * 0)."""
    check_finite("softcap", softcap, low=0.0)


class RingWindowState(NamedTuple):
    """The window buffer of one generation (latte/models/static_decode.py): R
    = min(W - 1, prompt + max_new_tokens - 1) slots allocated once, written in
    place at a write index. Column c of the generation (prompt padding
    included) sits at slot c mod R; `index` is the slot of the next column,
    which holds the oldest, the token that leaves the window after the step
    (masked: no token yet). A step reads every slot (masked ones weigh 0)
    and `ring_push` then overwrites slot `index`: no copy of the buffer."""

    k: torch.Tensor  # [B, R, K, E] (work dtype)
    v: torch.Tensor  # [B, R, K, D]
    mask: torch.Tensor  # [B, R] bool, True where the slot holds a real token
    index: torch.Tensor  # [] int64: the next slot to write (the oldest)


def ring_layout(x: torch.Tensor, slots: int, columns: int, empty=0) -> torch.Tensor:
    """x [B, n, ...] (n <= slots), the buffer of the last n columns before
    column `columns`, oldest first, laid out as a ring of `slots` slots
    (column c at slot c mod slots; the others filled with `empty`)."""
    pad = x.new_full((x.shape[0], slots - x.shape[1], *x.shape[2:]), empty)
    full = torch.cat([pad, x], 1)
    return full.roll((columns - slots) % slots, 1) if slots else full


def ring_window_state(state: WindowState, slots: int, columns: int) -> RingWindowState:
    """The RingWindowState of `slots` slots holding `state` (the buffer after
    `columns` columns; it holds at most `slots` of them)."""
    if window_slots(state) > slots:
        raise ValueError(f"state: holds {window_slots(state)} slots, more than the ring's {slots}")
    index = torch.tensor(columns % slots if slots else 0, dtype=torch.int64, device=state.k.device)
    return RingWindowState(*(ring_layout(x, slots, columns) for x in state), index)


def ring_push(state: RingWindowState, k_t, v_t, mask_t) -> RingWindowState:
    """Writes this token (k_t [B, K, E], v_t [B, K, D], mask_t [B] or None:
    real) at the write index, in place, and advances the index; returns the
    same state. A ring of 0 slots (W = 1) keeps nothing."""
    R = state.mask.shape[1]
    if R:
        at = state.index.view(1)
        real = torch.ones(state.mask.shape[0], dtype=torch.bool, device=state.mask.device) if mask_t is None else mask_t
        state.k.index_copy_(1, at, k_t.to(state.k.dtype)[:, None])
        state.v.index_copy_(1, at, v_t.to(state.v.dtype)[:, None])
        state.mask.index_copy_(1, at, real[:, None])
        state.index.copy_((state.index + 1) % R)
    return state


def _ring_step(q_t, k_t, v_t, window_size, scale, state: RingWindowState, softcap):
    """window_step's attention over a ring (its slots, then the own key) without
    writing it: (y_t [B, H, D], lse_t [B, H]). The buffer is read in place:
    the own key's score and value join it outside."""
    B, H, E = q_t.shape
    K = k_t.shape[1]
    work = state.k.dtype
    q = q_t.to(work).view(B, K, H // K, E)
    own = torch.einsum("bkge,bke->bkg", q, k_t.to(work))[..., None]
    s = torch.cat([torch.einsum("bkge,bwke->bkgw", q, state.k), own], -1) * scale  # [B, K, G, R + 1]
    own_mask = torch.ones(B, 1, dtype=torch.bool, device=q_t.device)
    keep = torch.cat([state.mask, own_mask], 1)[:, None, None]  # own key always visible
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    m = s.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True)
    p = exp_floored(s - m) * keep
    total = p.sum(-1, keepdim=True)
    lse = (m + total.log()).squeeze(-1)
    p = p / total
    y = torch.einsum("bkgw,bwkd->bkgd", p[..., :-1], state.v) + p[..., -1:] * v_t.to(work)[:, :, None]
    return y.reshape(B, H, -1), lse.reshape(B, H)


def empty_window_state(k: torch.Tensor, v: torch.Tensor, slots: int, work) -> WindowState:
    """`slots` empty slots (masked: no token) for keys like k, values like v."""
    B, K, P = k.shape[0], k.shape[-2], slots
    return WindowState(
        k.new_zeros(B, P, K, k.shape[-1], dtype=work),
        v.new_zeros(B, P, K, v.shape[-1], dtype=work),
        torch.zeros(B, P, dtype=torch.bool, device=k.device),
    )


def window_slots(state: WindowState | None) -> int:
    """The positions a window state holds (0 for none)."""
    return 0 if state is None else int(state.mask.shape[1])


def full_window_state(state: WindowState | None, window_size: int) -> WindowState | None:
    """The state padded in front with empty slots to W - 1 (the fixed buffer
    of a consumer that aligns its own buffer with the window's)."""
    if state is None or window_slots(state) == window_size - 1:
        return state
    pad = empty_window_state(state.k, state.v, window_size - 1 - window_slots(state), state.k.dtype)
    return WindowState(*(torch.cat([p, x], 1) for p, x in zip(pad, state)))


def check_window_state(state, B: int, k, v, window_size, name="initial_state"):
    """A WindowState (or a decoding step's RingWindowState) of P <= W - 1
    slots (its mask's length) for these inputs."""
    if not isinstance(state, (WindowState, RingWindowState)):
        raise ValueError(f"{name}: expected a WindowState(k, v, mask), got {type(state).__name__}")
    K = k.shape[-2]
    P = state.mask.shape[1] if isinstance(state.mask, torch.Tensor) and state.mask.dim() == 2 else window_size - 1
    if P > window_size - 1:
        raise ValueError(f"{name}.mask: holds {P} slots, more than window_size - 1 = {window_size - 1}")
    check_shape(f"{name}.k", state.k, (B, P, K, k.shape[-1]), "[B, P <= window_size - 1, K, E]")
    check_shape(f"{name}.v", state.v, (B, P, K, v.shape[-1]), "[B, P <= window_size - 1, K, D]")
    check_mask(f"{name}.mask", state.mask, (B, P))


def check_window(q, k, v, window_size, mask, softcap, state=None, suffix="", scale=None):
    """The checks of the window ops, at their boundary: q, k, v [B, (T,) H|K, E|D]
    with B, T >= 1, the mask, window_size, softcap, scale (None or finite > 0:
    0 makes every window uniform, a negative one prefers the least similar
    key, NaN makes every output NaN) and a WindowState to continue from."""
    check_qkv(q, k, v, mask, suffix=suffix)
    check_nonempty("q" + suffix, q, "B" if suffix else "BT")
    check_positive_int("window_size", window_size)
    check_softcap(softcap)
    if scale is not None:  # macchiato checks its own (each argument once)
        check_finite("scale", scale, low=0.0)
    if state is not None:
        check_window_state(state, q.shape[0], k, v, window_size, name="state" if suffix else "initial_state")


# Query block (and key tile) size of the blocked kernel, at most.
_QBLOCK = 64


def query_block(T: int, window_size: int) -> int:
    """The block Q: a block sees c + 1 = ceil((W - 1) / Q) + 1 tiles of Q keys,
    so a window much shorter than _QBLOCK takes blocks about its own size
    (W = 16: 2 tiles of 16, 32 scores per query instead of 128 with Q = 64)."""
    return min(T, _QBLOCK, max(16, -(-(window_size - 1) // 8) * 8))


def extend_window(k, v, window_size, mask, state, lengths, work):
    """The cached window followed by the new keys: kk [B, P + T, K, E],
    vv [B, P + T, K, D], km [B, P + T] (True = a real token), P, and the
    WindowState after the sequence (lengths [B]: each row's own end).
    P = min(W - 1, cached + T - 1): the earlier keys any of the T queries
    can reach (the cache, padded in front with empty slots to P), so the
    buffers are sized by the positions, not by the window; the state after
    holds min(W - 1, cached + T) slots."""
    B, T = k.shape[:2]
    cached = window_slots(state)
    P, kept = min(window_size - 1, cached + T - 1), min(window_size - 1, cached + T)
    front = empty_window_state(k, v, P - cached, work)  # cached <= P: W - 1 >= cached, T >= 1
    if state is not None:
        front = WindowState(*(torch.cat([e, x.to(e.dtype)], 1) for e, x in zip(front, state)))
    mask = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=k.device)
    kk = torch.cat([front.k, k.to(work)], 1)  # [B, P + T, K, E]
    vv = torch.cat([front.v, v.to(work)], 1)  # [B, P + T, K, D]
    km = torch.cat([front.mask, mask], 1)  # [B, P + T]
    if lengths is None:
        return kk, vv, km, P, WindowState(kk[:, P + T - kept :], vv[:, P + T - kept :], km[:, P + T - kept :])
    # the `kept` slots before each row's end P + len_b of cache + sequence (len_b >= 1)
    idx = lengths.to(k.device)[:, None] + (P - kept) + torch.arange(kept, device=k.device)[None, :]  # [B, kept]

    def take(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, idx.view(B, kept, *([1] * (x.dim() - 2))).expand(B, kept, *x.shape[2:]))

    return kk, vv, km, P, WindowState(take(kk), take(vv), take(km))


def window_blocked(q, k, v, window_size, scale, mask, state, lengths=None, softcap=None):
    """Core in the work dtype: returns (y [B,T,H,D], lse [B,T,H], WindowState).

    lengths [B]: tokens of each row for a right-padded batch of documents, so
    each row's final buffer ends at its own last token (default: T for all).
    """
    B, T, H, E = q.shape
    K, D = k.shape[2], v.shape[-1]
    G = H // K
    work = state_dtype(q.dtype)
    masked = mask is not None  # padding among the keys: decided by the call, never by the values
    kk, vv, km, P, new_state = extend_window(k, v, window_size, mask, state, lengths, work)
    Q = query_block(T, P + 1)  # no query reaches further back than P: the window is P + 1 here
    N, c = -(-T // Q), -(-P // Q)
    pad, front = N * Q - T, c * Q - P  # zeros after the sequence, masked slots before the cache

    def padded(x, before=0):  # along time: `before` slots in front, `pad` after
        return F.pad(x, (0,) * (2 * (x.dim() - 2)) + (before, pad)) if before or pad else x

    def tiles(x):  # [B, P + T, K, W] -> [N + c, B * K, Q, W]: tile i = padded slots [iQ, iQ + Q)
        x = padded(x, front)
        return x.view(B, N + c, Q, K, x.shape[-1]).permute(1, 0, 3, 2, 4).reshape(N + c, B * K, Q, x.shape[-1])

    # block n: queries [nQ, nQ + Q) see tiles n .. n + c, i.e. keys [nQ - cQ, nQ + Q)
    qb = padded(q.to(work)).view(B, N, Q, K, G, E).permute(1, 0, 3, 4, 2, 5)
    y, lse = WindowTiles.apply(
        qb.reshape(N, B * K, G * Q, E),
        tiles(kk),
        tiles(vv),
        padded(km, front).view(B, N + c, Q),
        K,
        P,
        scale,
        masked,
        softcap,
    )
    y = y.view(N, B, K, G, Q, D).permute(1, 0, 4, 2, 3, 5).reshape(B, N * Q, H, D)[:, :T]
    lse = lse.view(N, B, K, G, Q).permute(1, 0, 4, 2, 3).reshape(B, N * Q, H)[:, :T]
    return y, lse, new_state


def sliding_window_attention_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window_size: int,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    initial_state: WindowState | None = None,
    output_final_state: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, WindowState | None]:
    """Like sliding_window_attention, also returning the window log-normaliser.

    Returns (y [B, T, H, D] in v's dtype, lse [B, T, H] float32, state or None).
    """
    check_window(q, k, v, window_size, mask, softcap, initial_state, scale=scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    y, lse, state = window_blocked(q, k, v, window_size, scale, mask, initial_state, softcap=softcap)
    return y.to(v.dtype), lse, (state if output_final_state else None)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window_size: int,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    initial_state: WindowState | None = None,
    output_final_state: bool = False,
    softcap: float | None = None,
) -> tuple[torch.Tensor, WindowState | None]:
    """Exact causal softmax attention over the last `window_size` tokens.

    Args:
        q: [B, T, H, E]; k: [B, T, K, E]; v: [B, T, K, D] with H a multiple
            of K (grouped KV heads: query head h uses KV head h // (H / K)).
        window_size: tokens seen by each query, itself included (>= 1).
        scale: score scale, default 1/sqrt(E).
        mask: [B, T] bool, False for padding (never attended to).
        initial_state / output_final_state: a WindowState to continue from.
        softcap: None, or c > 0 for scores c * tanh(scale q.k / c) (Gemma 2).
    Returns:
        (y [B, T, H, D] in v's dtype, WindowState or None)
    """
    check_window(q, k, v, window_size, mask, softcap, initial_state, scale=scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    y, _, state = window_blocked(q, k, v, window_size, scale, mask, initial_state, softcap=softcap)
    return y.to(v.dtype), (state if output_final_state else None)


def window_step(q_t, k_t, v_t, *, window_size, scale, mask_t, state, softcap=None):
    """One decoding step in the work dtype: (y_t [B,H,D], lse_t [B,H], state).
    A RingWindowState is read, not written: the caller pushes the token
    (`ring_push`) once every branch has read the slot it overwrites."""
    if isinstance(state, RingWindowState):
        return (*_ring_step(q_t, k_t, v_t, window_size, scale, state, softcap), state)
    B, H, E = q_t.shape
    K = k_t.shape[1]
    work = state_dtype(q_t.dtype)
    state = state if state is not None else empty_window_state(k_t, v_t, 0, work)
    drop = window_slots(state) + 1 - min(window_size - 1, window_slots(state) + 1)  # the oldest leaves a full buffer
    own = torch.ones(B, 1, dtype=torch.bool, device=q_t.device)
    kk = torch.cat([state.k.to(work), k_t.to(work).unsqueeze(1)], 1)  # [B, W, K, E]
    vv = torch.cat([state.v.to(work), v_t.to(work).unsqueeze(1)], 1)  # [B, W, K, D]
    valid = torch.cat([state.mask, own], 1)  # own key always visible
    s = torch.einsum("bkge,bwke->bkgw", q_t.to(work).view(B, K, H // K, E), kk) * scale
    keep = valid[:, None, None]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    m = s.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True)  # finite: the own key is valid
    p = exp_floored(s - m) * keep  # masked keys exactly 0, no exp of -inf (_exp.py)
    total = p.sum(-1, keepdim=True)
    lse = (m + total.log()).squeeze(-1)  # [B, K, G]
    y = torch.einsum("bkgw,bwkd->bkgd", p / total, vv)
    m = own[:, 0] if mask_t is None else mask_t
    new_state = WindowState(kk[:, drop:], vv[:, drop:], torch.cat([state.mask, m.unsqueeze(1)], 1)[:, drop:])
    return y.reshape(B, H, -1), lse.reshape(B, H), new_state


def sliding_window_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: WindowState | None = None,
    *,
    window_size: int,
    scale: float | None = None,
    mask_t: torch.Tensor | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, WindowState]:
    """One decoding step: q_t [B, H, E], k_t [B, K, E], v_t [B, K, D]; state:
    the WindowState so far (None: empty).

    Returns (y_t [B, H, D] in v's dtype, WindowState). Constant in the context.
    """
    check_window(q_t, k_t, v_t, window_size, mask_t, softcap, state, suffix="_t", scale=scale)
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    y, _, state = window_step(
        q_t, k_t, v_t, window_size=window_size, scale=scale, mask_t=mask_t, state=state, softcap=softcap
    )
    if isinstance(state, RingWindowState):
        ring_push(state, k_t, v_t, mask_t)
    return y.to(v_t.dtype), state
