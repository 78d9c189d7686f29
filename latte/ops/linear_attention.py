"""Linear attention (Katharopoulos et al. 2020), the baseline of docs/math.md §7.

Legend: B batch, T time, H heads, E feature width (q, k after the feature
map), D value width, N chunks, C chunk size (t, s: query / key positions in a
chunk).

  y_t = (q_t S_t) / (q_t . z_t + eps),  S_t = sum_{s<=t} k_s v_s^T,  z_t = sum_{s<=t} k_s

q and k must be non-negative (the layer applies the feature map, e.g.
elu + 1), so the denominator is a sum of non-negative terms; this is not
checked. There is no decay, so the state is a plain running sum.

Chunked form: inside a chunk the C x C matrix q k^T masked to s <= t gives
both the intra-chunk numerator (@ v) and denominator (row sums); between
chunks (S, z) is an exclusive cumulative sum of the per-chunk sums. No T x T
tensor is built. The bidirectional form (causal=False) sums over all of T.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import check_mask, check_nonempty, check_positive_int, check_rank, check_same, check_shape, state_dtype
from .layout import from_chunks, to_chunks

EPS = 1e-6


class LinearAttentionState(NamedTuple):
    """Decoding state of linear attention: constant in T (float32)."""

    S: torch.Tensor  # [B, H, E, D] sum_s k_s v_s^T
    z: torch.Tensor  # [B, H, E] sum_s k_s


def _check(q, k, v, mask, suffix=""):
    rank = 3 if suffix else 4
    lead = "[B, H," if suffix else "[B, T, H,"
    check_rank("q" + suffix, q, rank, lead + " E]")
    check_rank("k" + suffix, k, rank, lead + " E]")
    check_rank("v" + suffix, v, rank, lead + " D]")
    if q.shape != k.shape:
        raise ValueError(f"q{suffix}, k{suffix}: shapes must match, got {tuple(q.shape)} and {tuple(k.shape)}")
    names = f"q{suffix}, v{suffix}"
    check_same(names, [q.shape[0], v.shape[0]], "batch sizes")
    if not suffix:
        check_same(names, [q.shape[1], v.shape[1]], "sequence lengths")
    check_same(names, [q.shape[-2], v.shape[-2]], "head counts")
    check_mask("mask" + suffix, mask, tuple(q.shape[: rank - 2]))
    check_nonempty("q" + suffix, q, "B" if suffix else "BT")


def _check_state(state, B, H, E, D, name):
    if not isinstance(state, LinearAttentionState):
        raise ValueError(f"{name}: expected a LinearAttentionState(S, z), got {type(state).__name__}")
    check_shape(f"{name}.S", state.S, (B, H, E, D), "[B, H, E, D]")
    check_shape(f"{name}.z", state.z, (B, H, E), "[B, H, E]")


def _masked_keys(k, mask):
    """Padded keys (mask False) become 0: they add nothing to S or z."""
    if mask is None:
        return k
    return k * mask.view(*mask.shape, *([1] * (k.dim() - mask.dim()))).to(k.dtype)


def _causal_linear(q, k, v, chunk_size, state):
    """Causal core in the work dtype; returns (y [B,T,H,D], LinearAttentionState).
    Chunk-major [N, B * H, C, .] layout: every product is one bmm over N * B * H
    contiguous blocks (einsum over [B, N, C, H, .] would permute and copy)."""
    B, T, H, E = q.shape
    D = v.shape[-1]
    G = B * H
    if state is None:
        S0, z0 = q.new_zeros(G, E, D), q.new_zeros(G, E)
    else:
        S0, z0 = state.S.to(q.dtype).reshape(G, E, D), state.z.to(q.dtype).reshape(G, E)
    C = min(chunk_size, T)
    N = -(-T // C)
    # chunk-major, flattened to [N * B * H, C, X]; zero keys at the end change nothing
    q, k, v = (to_chunks(x, C).flatten(0, 1) for x in (q, k, v))
    causal = torch.ones(C, C, dtype=q.dtype, device=q.device).tril()
    A = torch.bmm(q, k.transpose(1, 2)) * causal  # [N * G, C, C]
    kv = torch.bmm(k.transpose(1, 2), v).view(N, G, E, D)  # each chunk's sum of k v^T
    S_incl = S0 + kv.cumsum(0)  # [N, G, E, D]
    z_incl = z0 + k.view(N, G, C, E).sum(2).cumsum(0)  # [N, G, E]
    S_before = torch.cat([S0.unsqueeze(0), S_incl[:-1]]).view(N * G, E, D)
    z_before = torch.cat([z0.unsqueeze(0), z_incl[:-1]]).view(N * G, E, 1)
    num = torch.baddbmm(torch.bmm(A, v), q, S_before)  # [N * G, C, D]
    den = A.sum(-1, keepdim=True) + torch.bmm(q, z_before)  # [N * G, C, 1]
    y = num / (den + EPS)
    y = from_chunks(y.view(N, G, C, D), B, T)
    return y, LinearAttentionState(S_incl[-1].view(B, H, E, D), z_incl[-1].view(B, H, E))


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    chunk_size: int = 64,
    initial_state: LinearAttentionState | None = None,
    output_final_state: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LinearAttentionState | None]:
    """Normalised linear attention over a sequence.

    Args:
        q, k: [B, T, H, E] feature-mapped queries and keys (non-negative).
        v: [B, T, H, D] values.
        causal: token t sees s <= t (chunked form); False: every real token.
        chunk_size: tokens per chunk (causal only; T need not divide).
        initial_state: LinearAttentionState (S [B,H,E,D], z [B,H,E]) to
            continue from (causal only).
        output_final_state: also return the state after the last token
            (causal only).
        mask: [B, T] bool, False for padding: never attended to (their own
            outputs are unspecified).
    Returns:
        (y [B, T, H, D] in v's dtype, LinearAttentionState or None)
    """
    _check(q, k, v, mask)
    check_positive_int("chunk_size", chunk_size)
    B, T, H, E = q.shape
    D = v.shape[-1]
    work, out_dtype = state_dtype(q.dtype), v.dtype
    q, k, v = q.to(work), _masked_keys(k.to(work), mask), v.to(work)
    if not causal:
        if initial_state is not None or output_final_state:
            raise ValueError("causal=False: a bidirectional call has no state (initial_state / output_final_state)")
        S = torch.einsum("bthe,bthd->bhed", k, v)  # [B, H, E, D]
        num = torch.einsum("bthe,bhed->bthd", q, S)
        den = torch.einsum("bthe,bhe->bth", q, k.sum(1))
        return (num / (den.unsqueeze(-1) + EPS)).to(out_dtype), None
    if initial_state is not None:
        _check_state(initial_state, B, H, E, D, "initial_state")
    y, state = _causal_linear(q, k, v, chunk_size, initial_state)
    return y.to(out_dtype), (state if output_final_state else None)


def linear_attention_step(
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    state: LinearAttentionState | None = None,
    *,
    mask_t: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LinearAttentionState]:
    """One causal decoding step: q_t, k_t [B, H, E], v_t [B, H, D], mask_t [B]
    (False = padding, not added to the state). Returns (y_t [B, H, D] in v's
    dtype, LinearAttentionState); O(1) in the context."""
    _check(q_t, k_t, v_t, mask_t, suffix="_t")
    B, H, E = q_t.shape
    D = v_t.shape[-1]
    work = state_dtype(q_t.dtype)
    if state is None:
        S, z = q_t.new_zeros(B, H, E, D, dtype=work), q_t.new_zeros(B, H, E, dtype=work)
    else:
        _check_state(state, B, H, E, D, "state")
        S, z = state.S.to(work), state.z.to(work)
    q, k = q_t.to(work), _masked_keys(k_t.to(work), mask_t)
    S = S + k.unsqueeze(-1) * v_t.to(work).unsqueeze(-2)  # [B, H, E, D]
    z = z + k
    y = torch.einsum("bhe,bhed->bhd", q, S) / (torch.einsum("bhe,bhe->bh", q, z).unsqueeze(-1) + EPS)
    return y.to(v_t.dtype), LinearAttentionState(S, z)
