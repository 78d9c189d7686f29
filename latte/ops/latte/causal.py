"""Causal Latte: the chunked parallel form and the recurrent step (docs/math.md §3).

Legend: B batch, T time, H heads, L latents per head (Lh), D value width per
head (dv), N chunks, C chunk size (t, s: query / key positions in a chunk).

y_t = sum_l softmax(a_t)_l * Vbar_{t,l},
Vbar_{t,l} = sum_{s<=t} exp(b_{s,l} - z_{t,l}) v_s,  z_t = logcumsumexp(b)_t.

Chunked form (3.2). With z_end the log-normaliser at the end of each chunk
and z_prev the one before it:
  state   S_n   = exp(z_prev - z_end) * S_{n-1} + sum_s exp(b_s - z_end) v_s
  inter   y_t  += (softmax(a_t) * exp(z_prev - z_t)) @ S_{n-1}
  intra   y_t  += sum_{s<=t in chunk} [sum_l softmax(a_t)_l exp(b_s - z_t)_l] v_s
Every exponent above is <= 0, so no logit magnitude can overflow. The intra
weights are never a product exp(b_s) * exp(-z_t), which overflows and meets the
zero mask as inf * 0 = NaN: they come from sub-chunk references (two factors
<= 1) or, inside a sub-chunk, straight from log space (intra_chunk.py), with
the same work for any logits. No T x T tensor is built: the intra part is N
blocks of C x C, laid out chunk-major [N, B * H, C, .].
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._checks import (
    NEG,
    check_cu_seqlens,
    check_mask,
    check_nonempty,
    check_positive_int,
    check_rank,
    check_same,
    check_shape,
    state_dtype,
)
from .._exp import exp_floored, limit_spread, logaddexp
from ..backend import resolve_latent
from ..layout import from_chunks, to_chunks
from ..varlen import run_packed
from .chunked import LatteChunked
from .gla import gla_chunked, gla_step
from .intra_chunk import chunk_layout


class LatteState(NamedTuple):
    """Decoding state of one causal Latte layer: constant in T."""

    S: torch.Tensor  # [B, H, L, D] normalised value state Vbar_t (float32)
    z: torch.Tensor  # [B, H, L] running log-normaliser z_t (float32)


def _check_inputs(a, b, v, mask):
    check_rank("a", a, 4, "[B, T, H, Lh]")
    check_rank("b", b, 4, "[B, T, H, Lh]")
    check_rank("v", v, 4, "[B, T, H, Dv]")
    if a.shape != b.shape:
        raise ValueError(f"a, b: shapes must match [B, T, H, Lh], got {tuple(a.shape)} and {tuple(b.shape)}")
    check_same("a, v", [a.shape[0], v.shape[0]], "batch sizes")
    check_same("a, v", [a.shape[1], v.shape[1]], "sequence lengths")
    check_same("a, v", [a.shape[2], v.shape[2]], "head counts")
    check_mask("mask", mask, tuple(a.shape[:2]))
    check_nonempty("a", a, "BT")


def check_latte_state(state, B, H, L, D, name="initial_state"):
    if not isinstance(state, LatteState):
        raise ValueError(f"{name}: expected a LatteState(S, z), got {type(state).__name__}")
    check_shape(f"{name}.S", state.S, (B, H, L, D), "[B, H, Lh, Dv]")
    check_shape(f"{name}.z", state.z, (B, H, L), "[B, H, Lh]")


def mask_keys(b: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """Masked tokens (mask False, [B, (T)]) get key logits NEG and values 0.
    Their weight is at most exp(floor) (exp is clamped, _exp.py) and it
    multiplies a zero value: they add nothing to a real output, and no
    gradient reaches their logits or values. (Their mass, at most
    exp(floor) each, is part of the normaliser.)"""
    if mask is None:
        return b, v
    m = mask.view(*mask.shape, *([1] * (b.dim() - mask.dim())))
    return b.masked_fill(~m, NEG), v.masked_fill(~m, 0.0)


def causal_chunked(a, b, v, chunk_size, state, mask):
    """latte_causal without argument checks or packing (shared with
    macchiato): lays the inputs out for the chunked kernel and runs it;
    returns (y [B, T, H, D] in the work dtype, LatteState)."""
    B, T, H, L = a.shape
    D = v.shape[-1]
    work = state_dtype(a.dtype)
    b, v = mask_keys(b.to(work), v.to(work), mask)
    if state is None:
        S0 = v.new_zeros(B * H, L, D)
        z0 = v.new_full((B * H, L), float("-inf"))  # empty state: no mass yet
    else:
        S0, z0 = state.S.to(work).reshape(B * H, L, D), state.z.to(work).reshape(B * H, L)
    c, J = chunk_layout(min(chunk_size, T))
    # sub-chunk-major [M, B * H, c, .], whole chunks of J sub-chunks; masked
    # keys padded at the end change neither outputs nor the final state
    a, b, v = (to_chunks(x, c, pad, J * c) for x, pad in ((a.to(work), 0.0), (b, NEG), (v, 0.0)))
    y, S_last, z_last = LatteChunked.apply(a, b, v, S0, z0, J)
    y = from_chunks(y, B, T)
    return y, LatteState(S_last.view(B, H, L, D), z_last.view(B, H, L))


def fla_chunked(a, b, v, state, mask, cu_seqlens=None, keep_dtype=False):
    """causal_chunked on fla-core's chunk_gla (gla.py): (y in the work dtype,
    or as the kernel returns it with keep_dtype, LatteState)."""

    y, S, z = gla_chunked(
        a, b, v, None if state is None else state.S, None if state is None else state.z, mask, cu_seqlens
    )
    return (y if keep_dtype else y.to(state_dtype(v.dtype))), LatteState(S, z)


def latte_causal(
    a: torch.Tensor,
    b: torch.Tensor,
    v: torch.Tensor,
    *,
    chunk_size: int = 64,
    initial_state: LatteState | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, LatteState | None]:
    """Causal Latte attention, chunked parallel form (docs/math.md §3.2).

    Args:
        a: [B, T, H, Lh] query-side latent logits.
        b: [B, T, H, Lh] key-side latent logits.
        v: [B, T, H, Dv] values.
        chunk_size: tokens per chunk (any value >= 1; T need not divide;
            above 8 it is rounded up to a multiple of the 8-token sub-chunk).
        initial_state: LatteState to continue from (S [B,H,Lh,Dv], z [B,H,Lh]);
            with cu_seqlens, one per document ([N, ...]).
        output_final_state: also return the state after the last token.
        cu_seqlens: int [N+1] document boundaries of a packed batch (B == 1):
            documents never see each other.
        mask: [B, T] bool, False for padding: those tokens are never attended
            to (their own outputs are unspecified).
        backend: "torch" | "fla" | "auto" | None (the process default); see
            latte.ops.backend.
    Returns:
        (y [B, T, H, Dv] in v's dtype, LatteState or None)
    """
    _check_inputs(a, b, v, mask)
    check_positive_int("chunk_size", chunk_size)
    fla = resolve_latent(backend, a) == "fla"  # fused CUDA kernels (gla.py)
    B, T, H, L = a.shape
    D = v.shape[-1]
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, T)
        n_docs = cu_seqlens.numel() - 1
        if initial_state is not None:
            check_latte_state(initial_state, n_docs, H, L, D)

        def run(a_, b_, v_, mask_, state_):
            return causal_chunked(a_, b_, v_, chunk_size, state_, mask_)

        if fla:
            y, state = fla_chunked(a, b, v, initial_state, mask, cu_seqlens, keep_dtype=True)
        else:
            y, state = run_packed(run, (a, b, v), cu_seqlens, mask, initial_state)
    else:
        if initial_state is not None:
            check_latte_state(initial_state, B, H, L, D)
        if fla:
            y, state = fla_chunked(a, b, v, initial_state, mask, keep_dtype=True)
        else:
            y, state = causal_chunked(a, b, v, chunk_size, initial_state, mask)
    return y.to(v.dtype), (state if output_final_state else None)


def latte_causal_step(
    a_t: torch.Tensor,
    b_t: torch.Tensor,
    v_t: torch.Tensor,
    state: LatteState | None = None,
    *,
    mask_t: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, LatteState]:
    """One decoding step of causal Latte (docs/math.md §3.1): O(1) in the context.

    a_t, b_t: [B, H, Lh]; v_t: [B, H, Dv]; mask_t: [B] bool (False = padding,
    the token is not added to the state's mass); backend as in latte_causal.
    Returns (y_t [B, H, Dv], state).
    """
    check_rank("a_t", a_t, 3, "[B, H, Lh]")
    check_rank("b_t", b_t, 3, "[B, H, Lh]")
    check_rank("v_t", v_t, 3, "[B, H, Dv]")
    if a_t.shape != b_t.shape:
        raise ValueError(f"a_t, b_t: shapes must match, got {tuple(a_t.shape)} and {tuple(b_t.shape)}")
    check_same("a_t, v_t", [a_t.shape[0], v_t.shape[0]], "batch sizes")
    check_same("a_t, v_t", [a_t.shape[1], v_t.shape[1]], "head counts")
    check_mask("mask_t", mask_t, (a_t.shape[0],))
    check_nonempty("a_t", a_t, "B")
    if state is not None:
        check_latte_state(state, *a_t.shape, v_t.shape[-1], name="state")
    return causal_step(a_t, b_t, v_t, state, mask_t, backend)


def causal_step(a_t, b_t, v_t, state, mask_t, backend):
    """latte_causal_step without argument checks (shared with macchiato_step)."""
    B, H, L = a_t.shape
    D = v_t.shape[-1]
    work = state_dtype(a_t.dtype)
    if state is None:
        S = v_t.new_zeros(B, H, L, D, dtype=work)
        z = v_t.new_full((B, H, L), float("-inf"), dtype=work)
    else:
        S, z = state.S.to(work), state.z.to(work)
    if resolve_latent(backend, a_t) == "fla":  # fused CUDA kernel (gla.py)
        y, S_new, z_new = gla_step(a_t, b_t, v_t, S, z, mask_t)
        return y.to(v_t.dtype), LatteState(S_new, z_new)
    b, v = mask_keys(b_t.to(work), v_t.to(work), mask_t)
    z_new = logaddexp(z, b)
    # both exponents are <= 0 (3.1): nothing overflows
    S_new = exp_floored(z - z_new).unsqueeze(-1) * S + exp_floored(b - z_new).unsqueeze(-1) * v.unsqueeze(-2)
    y = torch.einsum("bhl,bhld->bhd", torch.softmax(limit_spread(a_t.to(work), -1), -1), S_new)
    return y.to(v_t.dtype), LatteState(S_new, z_new)
