"""Latte-Macchiato: sliding-window softmax + global latents, one distribution
(docs/math.md §4).

Legend: B batch, T time, H query heads, K key/value heads, L latents per head,
E query/key width, D value width.

The window is latent state l = 0. Both mixes reduce to one mixing logit m_t:
  joint: m_t = lse_window_t - (logsumexp_l a_t + beta)
         (one normaliser over window scores and latent logits)
  gate:  m_t = g_t - (logsumexp_l a_t + beta)   ([g_t, a_t] share a softmax)
  y_t = sigmoid(m_t) * SWA_t + sigmoid(-m_t) * Latte_t
where SWA_t and Latte_t are the separately normalised branch outputs. For
"joint" this equals [sum_W exp(e) v + sum_l exp(a_l + beta) Vbar_l] / Z_t
exactly, and the token distribution sums to 1 (the review of the paper's v4
summed two separately normalised attentions instead). sigmoid of a difference
of log-normalisers is the stable form: nothing is exponentiated unbounded.
beta (per head, default 0) also applies to "gate" as a bias of the latents.

With num_sinks = S > 0 the local branch is the window plus each document's
first S tokens (attention sinks, docs/math.md §4.1): a separate small branch
(sinks.py) over the sinks outside the window, merged with the window's
(y, lse) by log-sum-exp before the mixing, so lse_window above becomes the
log-normaliser of the window and the sinks together.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import check_cu_seqlens, check_positive_int, check_rank, check_shape, state_dtype
from ._exp import exp_floor, logsumexp
from .backend import resolve_latent, resolve_window
from .causal import LatteState, causal_chunked, check_latte_state, fla_chunked, latte_causal_step
from .flex_window import flex_window
from .sinks import SinkState, check_num_sinks, check_sink_state, merge, sink_sequence, sink_step
from .sliding_window import (
    WindowState,
    check_qkv,
    check_softcap,
    check_window_state,
    window_blocked,
    window_step,
)
from .varlen import run_packed

MIXES = ("joint", "gate")


class MacchiatoState(NamedTuple):
    latte: LatteState
    window: WindowState
    sinks: SinkState | None = None  # the first num_sinks tokens (None when num_sinks = 0)


def _repeat_kv(v: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., K, D] -> [..., H, D]: query head h uses KV head h // (H / K)."""
    if heads == v.shape[-2]:
        return v  # repeat_interleave would copy even for one repeat
    return v.repeat_interleave(heads // v.shape[-2], dim=-2)


def _check(a, b, v, q, k, gate, beta, mix, window_size, chunk_size, mask, step, softcap=None, num_sinks=0, sink_q=None):
    sfx = "_t" if step else ""
    if sink_q is not None:
        check_shape("sink_q" + sfx, sink_q, tuple(q.shape), f"(same as q{sfx})")
    check_qkv(q, k, v, mask, suffix=sfx)
    check_softcap(softcap)
    check_num_sinks(num_sinks)
    check_positive_int("window_size", window_size)
    check_positive_int("chunk_size", chunk_size)
    if mix not in MIXES:
        raise ValueError(f"mix: expected one of {MIXES}, got {mix!r}")
    lead = a.dim() - 2
    check_rank("a" + sfx, a, lead + 2, "[B, (T,) H, Lh]")
    if tuple(a.shape[:-1]) != tuple(q.shape[:-1]):
        raise ValueError(
            f"a{sfx}, q{sfx}: leading shapes must match ([B, (T,) H]), got {tuple(a.shape)} and {tuple(q.shape)}"
        )
    check_shape("b" + sfx, b, tuple(a.shape), "(same as a)")
    H = q.shape[-2]
    if mix == "gate":
        if gate is None:
            raise ValueError('gate: mix="gate" needs gate logits [B, (T,) H], got None')
        check_shape("gate" + sfx, gate, tuple(a.shape[:-1]), "[B, (T,) H]")
    elif gate is not None:
        raise ValueError('gate: only used with mix="gate"; got gate logits with mix="joint"')
    if beta is not None:
        check_shape("beta", beta, (H,), "[H] (one per query head)")


def _mix(y_win, lse_win, y_lat, a, gate, beta, mix):
    """Combine the two normalised branches with one mixing logit (float32)."""
    lat = logsumexp(a, -1)  # [..., H]
    if beta is not None:
        lat = lat + beta.to(lat.dtype)
    m = (lse_win if mix == "joint" else gate.to(lat.dtype)) - lat
    # |m| beyond -floor: sigmoid is 1 or 0 to exp(floor), and its exp stays off the slow lanes
    bound = -exp_floor(m.dtype)
    w = torch.sigmoid(m.clamp(-bound, bound)).unsqueeze(-1)  # p(l = 0 | t)
    return w * y_win + (1 - w) * y_lat


def _kernels(backend, x, chunk_size, softcap, cached=False):
    """(window, latents) functions for the backend (backend.py) on tensors like x
    (cached: continuing from a window state). A soft-capped window stays on the
    tiles kernel (flex_window has no softcap)."""

    def window(q, k, v, window_size, scale, mask, state, lengths):
        return window_blocked(q, k, v, window_size, scale, mask, state, lengths, softcap)

    if softcap is None and resolve_window(backend, x, cached=cached) == "flex":
        window = flex_window  # the flex kernel replaces the tiles one
    if resolve_latent(backend, x) == "fla":
        latents = fla_chunked
    else:
        latents = lambda a, b, v, state, mask: causal_chunked(a, b, v, chunk_size, state, mask)  # noqa: E731
    return window, latents


def macchiato(
    a: torch.Tensor,
    b: torch.Tensor,
    v: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window_size: int,
    mix: str = "joint",
    gate: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    chunk_size: int = 64,
    initial_state: MacchiatoState | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    softcap: float | None = None,
    num_sinks: int = 0,
    sink_q: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, MacchiatoState | None]:
    """Latte-Macchiato attention over a sequence.

    Args:
        a, b: [B, T, H, Lh] latent logits; v: [B, T, K, D] values shared by
            both branches; q: [B, T, H, E], k: [B, T, K, E] window queries and
            keys (RoPE already applied); K divides H (grouped KV heads).
        window_size: local window, current token included.
        mix: "joint" (one normaliser) or "gate" (needs gate [B, T, H]).
        beta: [H] bias of the latents' mass (very negative = start as pure
            sliding-window attention), default 0.
        scale: window score scale, default 1/sqrt(E).
        softcap: None, or c > 0 for window scores c * tanh(e / c) (Gemma 2).
        num_sinks: the first num_sinks real tokens of each row (of each
            document with cu_seqlens) stay visible to every query next to
            its window, under the same normaliser (docs/math.md §4.1).
        sink_q: [B, T, H, E] queries that score the sinks (default q): a
            converted model's queries rotated to one fixed position.
        mask: [B, T] bool, False for padding.
        chunk_size, initial_state (MacchiatoState), output_final_state,
            cu_seqlens (packed documents, B == 1): as in latte_causal.
        backend: "torch" | "fla" | "auto" | None (latte.ops.backend): "fla"
            runs the latents on fla-core and the window on flex_attention.
    Returns:
        (y [B, T, H, D] in v's dtype, MacchiatoState or None)
    """
    _check(a, b, v, q, k, gate, beta, mix, window_size, chunk_size, mask, False, softcap, num_sinks, sink_q)
    B, T, H, L = a.shape
    D = v.shape[-1]
    if T == 0:
        raise ValueError("a: sequence length T must be >= 1, got 0")
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    window, latents = _kernels(backend, q, chunk_size, softcap, cached=initial_state is not None)

    def run(a, b, v, q, k, gate, sink_q, mask, state):
        lat_state, win_state, sink_state = state if state is not None else (None, None, None)
        y_win, lse, win_state = window(q, k, v, window_size, scale, mask, win_state, lengths)
        if num_sinks:  # the sinks outside each query's window, one softmax with it
            y_s, lse_s, sink_state = sink_sequence(
                q, k, v, num_sinks, window_size, scale, mask, sink_state, lengths, softcap, sink_q
            )
            y_win, lse = merge(y_win, lse, y_s, lse_s)
        y_lat, lat_state = latents(a, b, _repeat_kv(v, H), lat_state, mask)
        y = _mix(y_win, lse, y_lat, a.to(y_lat.dtype), gate, beta, mix)
        return y, MacchiatoState(lat_state, win_state, sink_state)

    n, lengths = B, None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T)
        n, lengths = cu_seqlens.numel() - 1, cu_seqlens[1:] - cu_seqlens[:-1]
    if initial_state is not None:
        if not isinstance(initial_state, MacchiatoState):
            raise ValueError(f"initial_state: expected a MacchiatoState, got {type(initial_state).__name__}")
        check_latte_state(initial_state.latte, n, H, L, D, name="initial_state.latte")
        qn = q.new_empty(n, 1, H, q.shape[-1])  # shapes of one row per sequence
        check_window_state(
            initial_state.window,
            qn,
            k[:1].expand(n, -1, -1, -1),
            v[:1].expand(n, -1, -1, -1),
            window_size,
            name="initial_state.window",
        )
        check_sink_state(initial_state.sinks, n, k, v, num_sinks, name="initial_state.sinks")
    tensors = (a, b, v, q, k, gate, sink_q)
    if cu_seqlens is not None:
        y, state = run_packed(run, tensors, cu_seqlens, mask, initial_state)
    else:
        y, state = run(*tensors, mask, initial_state)
    return y.to(v.dtype), (state if output_final_state else None)


def macchiato_step(
    a_t: torch.Tensor,
    b_t: torch.Tensor,
    v_t: torch.Tensor,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    state: MacchiatoState | None = None,
    *,
    window_size: int,
    mix: str = "joint",
    gate_t: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    mask_t: torch.Tensor | None = None,
    softcap: float | None = None,
    num_sinks: int = 0,
    sink_q_t: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, MacchiatoState]:
    """One decoding step: a_t, b_t [B, H, Lh], v_t [B, K, D], q_t [B, H, E],
    k_t [B, K, E], gate_t [B, H], sink_q_t [B, H, E] (see macchiato's
    sink_q); state: the MacchiatoState so far (None: empty). Returns (y_t
    [B, H, D], MacchiatoState); constant time and memory in the context (the
    window is a W - 1 buffer, the sinks num_sinks slots)."""
    _check(a_t, b_t, v_t, q_t, k_t, gate_t, beta, mix, window_size, 1, mask_t, True, softcap, num_sinks, sink_q_t)
    lat_state = win_state = sink_state = None
    if state is not None:
        if not isinstance(state, MacchiatoState):
            raise ValueError(f"state: expected a MacchiatoState, got {type(state).__name__}")
        check_window_state(state.window, q_t, k_t, v_t, window_size, name="state.window")
        check_sink_state(state.sinks, q_t.shape[0], k_t, v_t, num_sinks, name="state.sinks")
        lat_state, win_state, sink_state = state
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    y_win, lse, win_state = window_step(
        q_t, k_t, v_t, window_size=window_size, scale=scale, mask_t=mask_t, state=win_state, softcap=softcap
    )
    if num_sinks:
        y_s, lse_s, sink_state = sink_step(
            q_t, k_t, v_t, num_sinks, window_size, scale, mask_t, sink_state, softcap, sink_q_t
        )
        y_win, lse = merge(y_win, lse, y_s, lse_s)
    work = state_dtype(a_t.dtype)
    y_lat, lat_state = latte_causal_step(
        a_t.to(work), b_t.to(work), _repeat_kv(v_t, q_t.shape[1]).to(work), lat_state, mask_t=mask_t, backend=backend
    )
    y = _mix(y_win, lse, y_lat, a_t.to(work), gate_t, beta, mix)
    return y.to(v_t.dtype), MacchiatoState(lat_state, win_state, sink_state)
