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
(window/sinks.py) over the sinks outside the window, merged with the window's
(y, lse) by log-sum-exp before the mixing, so lse_window above becomes the
log-normaliser of the window and the sinks together. With memory slots
(docs/math.md §4.2, window/memory.py) a third exact branch, over the tokens
the slots hold, joins them by the same merge.

A call runs in three phases: the window phase (window + sinks: y_window,
lse_window), the latent phase (causal Latte: y_latents) and the mix. The
arguments are checked once, here at the boundary; the phases call the
unchecked cores of the two families (ops/window/, ops/latte/).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch

from ._checks import (
    check_cu_seqlens,
    check_finite,
    check_mask,
    check_positive_int,
    check_rank,
    check_shape,
    state_dtype,
)
from ._exp import exp_floor, logsumexp
from .backend import resolve_latent, resolve_window
from .latte.causal import LatteState, causal_chunked, causal_step, check_latte_state, fla_chunked
from .varlen import run_packed
from .window.flex_window import flex_window
from .window.memory import (
    Memory,
    MemoryArgs,
    MemoryState,
    check_memory,
    check_memory_state,
    memory_sequence,
    memory_step,
)
from .window.ring_memory import ring_memory_step
from .window.sinks import SinkState, check_num_sinks, check_sink_state, merge, sink_sequence, sink_step
from .window.sliding_window import (
    RingWindowState,
    WindowState,
    check_window,
    check_window_state,
    full_window_state,
    ring_push,
    window_blocked,
    window_step,
)

MIXES = ("joint", "gate")


class MacchiatoState(NamedTuple):
    latte: LatteState
    window: WindowState
    sinks: SinkState | None = None  # the first num_sinks tokens (None when num_sinks = 0)
    memory: MemoryState | None = None  # the memory slots (None without them)


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """The local branch of Macchiato, one value from the layer's config to the
    op's window phase: the window, its sinks and its memory slots.

    size: tokens each query sees in the window (itself included); num_sinks:
    the first real tokens every query also sees (docs/math.md §4.1); scale:
    the window scores' scale (None: 1/sqrt(E)); softcap: None, or c > 0 for
    scores c * tanh(e / c); memory: the memory slots (docs/math.md §4.2;
    None or 0 slots: none), their positions policy carried as
    Memory.rotary. A layer builds it from its settings (MacchiatoCore.
    window_spec) and the op passes it down unchanged; the queries that score
    the sinks and the slots (sink_q, memory_q) are tensors of the call."""

    size: int
    num_sinks: int = 0
    scale: float | None = None
    softcap: float | None = None
    memory: Memory | None = None


def _repeat_kv(v: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., K, D] -> [..., H, D]: query head h uses KV head h // (H / K)."""
    if heads == v.shape[-2]:
        return v  # repeat_interleave would copy even for one repeat
    return v.repeat_interleave(heads // v.shape[-2], dim=-2)


def _check(a, b, v, q, k, gate, beta, mix, window_size, chunk_size, mask, step, softcap=None, num_sinks=0, sink_q=None):
    sfx = "_t" if step else ""
    if sink_q is not None:
        check_shape("sink_q" + sfx, sink_q, tuple(q.shape), f"(same as q{sfx})")
    check_window(q, k, v, window_size, mask, softcap, suffix=sfx)
    check_num_sinks(num_sinks)
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


def _check_memory(memory, memory_q, memory_mark, q, sfx):
    """The slot branch's settings and its optional inputs (docs/math.md §4.2)."""
    check_memory(memory)
    if memory_q is not None:
        check_shape("memory_q" + sfx, memory_q, tuple(q.shape), f"(same as q{sfx})")
    if memory_mark is not None:
        check_mask("memory_mark" + sfx, memory_mark, tuple(q.shape[:-2]))
    if (memory_q is not None or memory_mark is not None) and (memory is None or not memory.slots):
        raise ValueError(f"memory_q{sfx}, memory_mark{sfx}: only used with memory slots (memory={memory!r})")


def _check_state(state, rows, a, k, v, window_size, num_sinks, name, memory=None):
    """A MacchiatoState for `rows` sequences (or packed documents) of these inputs."""
    if not isinstance(state, MacchiatoState):
        raise ValueError(f"{name}: expected a MacchiatoState, got {type(state).__name__}")
    H, L = a.shape[-2:]
    check_latte_state(state.latte, rows, H, L, v.shape[-1], name=f"{name}.latte")
    check_window_state(state.window, rows, k, v, window_size, name=f"{name}.window")
    check_sink_state(state.sinks, rows, k, v, num_sinks, name=f"{name}.sinks")
    check_memory_state(state.memory, rows, k, v, memory, window_size, name=f"{name}.memory")


def _check_packing(a, k, v, cu_seqlens, initial_state, window_size, num_sinks, memory=None):
    """The documents' lengths of a packed call (None if not packed), once
    cu_seqlens and the initial state (one row per document) are checked."""
    B, T = a.shape[:2]
    rows, lengths = B, None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T)
        rows, lengths = cu_seqlens.numel() - 1, cu_seqlens[1:] - cu_seqlens[:-1]
    if initial_state is not None:
        _check_state(initial_state, rows, a, k, v, window_size, num_sinks, "initial_state", memory)
    return lengths


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


class _MemoryIn(NamedTuple):
    """The slot branch's inputs of one call (docs/math.md §4.2)."""

    q: torch.Tensor  # the queries that score the slots
    recall_y: torch.Tensor | None  # the latents read with softmax(b) (rule "recall")
    mark: torch.Tensor | None  # rule "oracle": the marked tokens
    state: MemoryState | None


def _memory_args(spec: WindowSpec, block: int) -> MemoryArgs:
    """The slot branch's settings; block: queries per block of its scan."""
    return MemoryArgs(spec.memory, spec.size, spec.num_sinks, spec.scale, spec.softcap, block)


def _window_phase(window, spec: WindowSpec, block, q, k, v, sink_q, mask, win_state, sink_state, lengths, mem=None):
    """The local branch over a sequence (spec: its scale resolved), one
    softmax over the window, the sinks outside it and the memory slots
    (mem: _MemoryIn, None without slots; block: queries per block of their
    scan): (y, lse, WindowState, SinkState or None, MemoryState or None),
    work dtype."""
    y, lse, new_win = window(q, k, v, spec.size, spec.scale, mask, win_state, lengths)
    lse_window, mem_state = lse, None  # the window alone: rule "attention" reads its normaliser
    if spec.num_sinks:
        S, W = spec.num_sinks, spec.size
        y_s, lse_s, sink_state = sink_sequence(
            q, k, v, S, W, spec.scale, mask, sink_state, lengths, spec.softcap, sink_q
        )
        y, lse = merge(y, lse, y_s, lse_s)
    if mem is not None:
        full = full_window_state(win_state, spec.size)  # the slots align with W - 1 window slots
        y, lse, mem_state = memory_sequence(
            q,
            k,
            v,
            mem.q,
            lse_window,
            mem.recall_y,
            mem.mark,
            mask,
            full,
            mem.state,
            lengths,
            _memory_args(spec, block),
            (y, lse),  # joined under one softmax: the merge happens in the slots' pass
        )
    return y, lse, new_win, sink_state, mem_state


def _window_step_phase(spec: WindowSpec, q_t, k_t, v_t, sink_q_t, mask_t, win_state, sink_state, mem=None):
    """The local branch for one token: (y_t, lse_t, WindowState, SinkState or
    None, MemoryState or None); spec, mem: as _window_phase's, for one token."""
    W, scale, softcap = spec.size, spec.scale, spec.softcap
    y, lse, new_win = window_step(
        q_t, k_t, v_t, window_size=W, scale=scale, mask_t=mask_t, state=win_state, softcap=softcap
    )
    lse_window, mem_state = lse, None
    if spec.num_sinks:
        y_s, lse_s, sink_state = sink_step(
            q_t, k_t, v_t, spec.num_sinks, W, scale, mask_t, sink_state, softcap, sink_q_t
        )
        y, lse = merge(y, lse, y_s, lse_s)
    ring = isinstance(win_state, RingWindowState)  # a static decoding state (latte/models/static_decode.py)
    if mem is not None:
        full = win_state if ring else full_window_state(win_state, W)  # the slots align with W - 1 window slots
        args = (q_t, k_t, v_t, mem.q, lse_window, mem.recall_y, mem.mark, mask_t, full, mem.state)
        args = (*args, _memory_args(spec, 64))
        if ring:
            y_m, lse_m, mem_state = ring_memory_step(*args)
            y, lse = merge(y, lse, y_m, lse_m)
        else:  # the read joins the window and the sinks under one softmax
            y, lse, mem_state = memory_step(*args, (y, lse))
    if ring:  # every branch has read the slot the token overwrites
        ring_push(new_win, k_t, v_t, mask_t)
    return y, lse, new_win, sink_state, mem_state


def _mix(y_win, lse_win, y_lat, a, gate, beta, mix):
    """The mix phase: the two normalised branches under one mixing logit (float32)."""
    lat = logsumexp(a, -1)  # [..., H]
    if beta is not None:
        lat = lat + beta.to(lat.dtype)
    m = (lse_win if mix == "joint" else gate.to(lat.dtype)) - lat
    # |m| beyond -floor: sigmoid is 1 or 0 to exp(floor), and its exp stays off the slow lanes
    bound = -exp_floor(m.dtype)
    w = torch.sigmoid(m.clamp(-bound, bound)).unsqueeze(-1)  # p(l = 0 | t)
    return w * y_win + (1 - w) * y_lat


def _sequence(
    kernels, spec: WindowSpec, block, lengths, beta, mix, a, b, v, q, k, gate, sink_q, mem_q, mark, mask, state
):
    """The three phases over one sequence, or the padded documents of a packed
    one (run_packed): (y [B, T, H, D], MacchiatoState), work dtype; block:
    queries per block of the memory slots' scan."""
    window, latents = kernels
    lat_state, win_state, sink_state, mem_state = state if state is not None else (None,) * 4
    v_lat = _repeat_kv(v, q.shape[-2])
    mem = None
    if spec.memory is not None and spec.memory.slots:
        recall = latents(b, b, v_lat, lat_state, mask)[0] if spec.memory.rule == "recall" else None
        mem = _MemoryIn(q if mem_q is None else mem_q, recall, mark, mem_state)
    y_win, lse, win_state, sink_state, mem_state = _window_phase(
        window, spec, block, q, k, v, sink_q, mask, win_state, sink_state, lengths, mem
    )
    y_lat, lat_state = latents(a, b, v_lat, lat_state, mask)  # latent phase
    y = _mix(y_win, lse, y_lat, a.to(y_lat.dtype), gate, beta, mix)  # mix phase
    return y, MacchiatoState(lat_state, win_state, sink_state, mem_state)


def _window_spec(window, window_size, num_sinks, scale, softcap, memory) -> WindowSpec:
    """The call's WindowSpec: `window` itself, or the one the loose keywords
    (window_size=, num_sinks=, scale=, softcap=, memory=) spell; never both."""
    loose = window_size is not None or num_sinks or scale is not None or softcap is not None or memory is not None
    if window is None:
        if window_size is None:
            raise ValueError("window: give the local branch as window=WindowSpec(size, ...) or window_size=W")
        return WindowSpec(window_size, num_sinks, scale, softcap, memory)
    if not isinstance(window, WindowSpec):
        raise ValueError(f"window: expected a WindowSpec, got {type(window).__name__}")
    if loose:
        raise ValueError(
            "window: a WindowSpec already holds the window's size, sinks, scale, softcap and memory; "
            "pass either window=WindowSpec(...) or those keywords, not both"
        )
    return window


def _resolved(spec: WindowSpec, q: torch.Tensor) -> WindowSpec:
    """spec with its scale set (None: 1/sqrt(E) of the queries q)."""
    return spec if spec.scale is not None else dataclasses.replace(spec, scale=q.shape[-1] ** -0.5)


def _run(run, tensors, cu_seqlens, mask, initial_state):
    """`run` (_sequence) over the sequence, or over the documents of a packed one."""
    if cu_seqlens is not None:
        return run_packed(run, tensors, cu_seqlens, mask, initial_state)
    return run(*tensors, mask, initial_state)


def _check_sequence(inputs, spec: WindowSpec, mix, chunk_size, mask, cu_seqlens, initial_state):
    """Every input of a `macchiato` call checked once; the packed documents'
    lengths (None if not packed)."""
    a, b, v, q, k, gate, beta, sink_q, memory_q, memory_mark = inputs
    W, S, memory = spec.size, spec.num_sinks, spec.memory
    _check(a, b, v, q, k, gate, beta, mix, W, chunk_size, mask, False, spec.softcap, S, sink_q)
    check_finite("scale", spec.scale, low=0.0)
    _check_memory(memory, memory_q, memory_mark, q, "")
    return _check_packing(a, k, v, cu_seqlens, initial_state, W, S, memory)


def macchiato(
    a: torch.Tensor,
    b: torch.Tensor,
    v: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window: WindowSpec | None = None,
    window_size: int | None = None,
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
    memory: Memory | None = None,
    memory_q: torch.Tensor | None = None,
    memory_mark: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, MacchiatoState | None]:
    """Latte-Macchiato attention over a sequence.

    Args:
        a, b: [B, T, H, Lh] latent logits; v: [B, T, K, D] values shared by
            both branches; q: [B, T, H, E], k: [B, T, K, E] window queries and
            keys (RoPE already applied); K divides H (grouped KV heads).
        window: the local branch (WindowSpec: size, num_sinks, scale,
            softcap, memory), as a layer builds it; or, in its place, the
            keywords window_size, num_sinks, scale, softcap, memory below.
        window_size: local window, current token included; scale: window
            score scale, default 1/sqrt(E); softcap: None, or c > 0 for
            window scores c * tanh(e / c) (Gemma 2).
        mix: "joint" (one normaliser) or "gate" (needs gate [B, T, H]); beta:
            [H] bias of the latents' mass (very negative = start as pure
            sliding-window attention), default 0.
        num_sinks: the first num_sinks real tokens of each row (of each
            document with cu_seqlens) stay visible to every query next to
            its window, under the same normaliser (docs/math.md §4.1).
        sink_q: [B, T, H, E] queries that score the sinks (default q): a
            converted model's queries rotated to one fixed position.
        memory (Memory or None), memory_q [B, T, H, E] (default q), memory_mark
            [B, T] bool (rule "oracle"): the memory slots (docs/math.md §4.2).
        mask ([B, T] bool, False for padding), chunk_size, initial_state
            (MacchiatoState), output_final_state, cu_seqlens: as latte_causal.
        backend: "torch" | "fla" (latents on fla-core, window on flex) | "auto" | None.
    Returns (y [B, T, H, D] in v's dtype, MacchiatoState or None).
    """
    spec = _window_spec(window, window_size, num_sinks, scale, softcap, memory)
    inputs = (a, b, v, q, k, gate, beta, sink_q, memory_q, memory_mark)
    lengths = _check_sequence(inputs, spec, mix, chunk_size, mask, cu_seqlens, initial_state)
    kernels = _kernels(backend, q, chunk_size, spec.softcap, cached=initial_state is not None)
    run = functools.partial(_sequence, kernels, _resolved(spec, q), chunk_size, lengths, beta, mix)
    y, state = _run(run, (a, b, v, q, k, gate, sink_q, memory_q, memory_mark), cu_seqlens, mask, initial_state)
    return y.to(v.dtype), (state if output_final_state else None)


def macchiato_step(
    a_t: torch.Tensor,
    b_t: torch.Tensor,
    v_t: torch.Tensor,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    state: MacchiatoState | None = None,
    *,
    window: WindowSpec | None = None,
    window_size: int | None = None,
    mix: str = "joint",
    gate_t: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    mask_t: torch.Tensor | None = None,
    softcap: float | None = None,
    num_sinks: int = 0,
    sink_q_t: torch.Tensor | None = None,
    memory: Memory | None = None,
    memory_q_t: torch.Tensor | None = None,
    memory_mark_t: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, MacchiatoState]:
    """One decoding step: a_t, b_t [B, H, Lh], v_t [B, K, D], q_t [B, H, E],
    k_t [B, K, E], gate_t [B, H], sink_q_t [B, H, E] (see macchiato's
    sink_q), memory_q_t [B, H, E], memory_mark_t [B], window or its
    keywords (see macchiato's); state: the MacchiatoState so far (None:
    empty). Returns
    (y_t [B, H, D], MacchiatoState); constant time and memory in the context
    (the window is a W - 1 buffer, the sinks num_sinks slots, the memory its
    slots)."""
    spec = _window_spec(window, window_size, num_sinks, scale, softcap, memory)
    W, S, memory = spec.size, spec.num_sinks, spec.memory
    _check(a_t, b_t, v_t, q_t, k_t, gate_t, beta, mix, W, 1, mask_t, True, spec.softcap, S, sink_q_t)
    check_finite("scale", spec.scale, low=0.0)
    _check_memory(memory, memory_q_t, memory_mark_t, q_t, "_t")
    if state is not None:
        _check_state(state, q_t.shape[0], a_t, k_t, v_t, W, S, "state", memory)
    lat_state, win_state, sink_state, mem_state = state if state is not None else (None,) * 4
    work = state_dtype(a_t.dtype)
    v_lat = _repeat_kv(v_t, q_t.shape[1]).to(work)
    y_lat, lat_state = causal_step(a_t.to(work), b_t.to(work), v_lat, lat_state, mask_t, backend)
    mem = None
    if memory is not None and memory.slots:  # rule "recall" reads the latents after this token
        recall = None
        if memory.rule == "recall":
            recall = torch.einsum("bhl,bhld->bhd", torch.softmax(b_t.to(work), -1), lat_state.S)
        mem = _MemoryIn(q_t if memory_q_t is None else memory_q_t, recall, memory_mark_t, mem_state)
    y_win, lse, win_state, sink_state, mem_state = _window_step_phase(
        _resolved(spec, q_t), q_t, k_t, v_t, sink_q_t, mask_t, win_state, sink_state, mem
    )
    y = _mix(y_win, lse, y_lat, a_t.to(work), gate_t, beta, mix)
    return y.to(v_t.dtype), MacchiatoState(lat_state, win_state, sink_state, mem_state)
