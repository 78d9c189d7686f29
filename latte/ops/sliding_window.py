"""Exact causal sliding-window softmax attention (MATH.md 4, the l = 0 state).

Legend: B batch, T time, H query heads, K key/value heads (H = K * G, grouped
KV), G queries per KV head, E query/key width, D value width, W window size,
P = W - 1 cached tokens, Q query block, N blocks.

Token t attends to s in (t - W, t]. The blocked form cuts the queries into
blocks of Q tokens; block n sees keys [nQ - P, nQ + Q), so the score tensor is
[N, Q, Q + P]: linear in T, never T x T. Besides the output it returns the
log-normaliser lse_t = log sum_{s in W(t)} exp(e_{t,s}), which Macchiato needs
to mix the window with the latents in one distribution.

A query always sees its own key, even when it is padding: every row then has
at least one finite score, so no NaN arises from an empty softmax, and real
tokens never see padded keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._checks import check_mask, check_positive_int, check_rank, check_same, check_shape, state_dtype
from .chunked import _without_autocast


class WindowState(NamedTuple):
    """Keys/values of the last W - 1 tokens, oldest first (keys already carry
    their RoPE rotation). Constant in T."""

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
            f"q{suffix}, k{suffix}: query heads ({q.shape[lead]}) must be a multiple of key/value heads ({k.shape[lead]})"
        )
    check_mask("mask" + suffix, mask, tuple(q.shape[: lead]))


def empty_window_state(k: torch.Tensor, v: torch.Tensor, window_size: int, work) -> WindowState:
    B, K = k.shape[0], k.shape[-2]
    P = window_size - 1
    return WindowState(
        k.new_zeros(B, P, K, k.shape[-1], dtype=work),
        v.new_zeros(B, P, K, v.shape[-1], dtype=work),
        torch.zeros(B, P, dtype=torch.bool, device=k.device),
    )


def check_window_state(state, q, k, v, window_size, name="initial_state"):
    if not isinstance(state, WindowState):
        raise ValueError(f"{name}: expected a WindowState(k, v, mask), got {type(state).__name__}")
    B, K, P = q.shape[0], k.shape[-2], window_size - 1
    check_shape(f"{name}.k", state.k, (B, P, K, k.shape[-1]), "[B, window_size - 1, K, E]")
    check_shape(f"{name}.v", state.v, (B, P, K, v.shape[-1]), "[B, window_size - 1, K, D]")
    check_mask(f"{name}.mask", state.mask, (B, P))


# One segment's score tensor holds about this many floats (16 MB), as in the
# chunked Latte kernel; the query block Q is 64 (keys per block: Q + W - 1).
_SEGMENT_ELEMS = 1 << 22
_QBLOCK = 64


def _segments(X, N, per_block):
    """(x0, x1, n0, n1) ranges of [X, N, ...] tensors, each a contiguous slab:
    several whole rows x when a row fits, else one row cut into block ranges."""
    if N * per_block <= _SEGMENT_ELEMS:
        step = max(1, _SEGMENT_ELEMS // (N * per_block))
        return [(x0, min(X, x0 + step), 0, N) for x0 in range(0, X, step)]
    step = max(1, _SEGMENT_ELEMS // per_block)
    return [(x, x + 1, n0, min(N, n0 + step)) for x in range(X) for n0 in range(0, N, step)]


# exp() on CPU leaves its vectorised path for arguments whose result is
# subnormal or zero (below about -87.3 in float32): such lanes cost ~20-150x
# more, and a window block has a third of its scores masked to -inf. The
# arguments are therefore clamped to this floor and masked entries zeroed
# after the exp; an unmasked weight below exp(floor) (relative to the row's
# largest) is then off by at most exp(floor).
_EXP_FLOOR = {torch.float64: -700.0}


def _masked_exp_(p, shift, masked):
    """exp(p - shift) in place, exactly 0 where `masked` (broadcast over G)."""
    floor = _EXP_FLOOR.get(p.dtype, -80.0)
    p.sub_(shift).clamp_(min=floor).exp_()
    x, n, _, J = p.shape
    return p.view(x, n, -1, masked.shape[-2], J).masked_fill_(masked[:, :, None], 0.0).view_as(p)


def _scores(q, k, key_ok, K, Q, scale, seg):
    """Scores of one segment with the mask added (0 / -inf), and the mask:
    q [X, N, G*Q, E], k [X, N, J, E], key_ok [B, N, J] (X = B * K, query rows
    ordered (g, r)) -> ([x1 - x0, n1 - n0, G*Q, J], masked [x1 - x0, n1 - n0, Q, J])."""
    x0, x1, n0, n1 = seg
    J = k.shape[2]
    r = torch.arange(Q, device=q.device)[:, None]
    j = torch.arange(J, device=q.device)[None, :]
    band, own = (j >= r) & (j <= r + J - Q), j == r + J - Q  # own key: always visible
    rows = torch.arange(x0, x1, device=q.device) // K  # batch row of each x
    ok = (band & key_ok[rows, n0:n1, None, :]) | own  # [x, n, Q, J]
    qs, ks = q[x0:x1, n0:n1], k[x0:x1, n0:n1]
    s = torch.bmm(qs.flatten(0, 1), ks.flatten(0, 1).transpose(1, 2)).mul_(scale)
    masked = ~ok
    s = s.view(x1 - x0, n1 - n0, -1, Q, J).masked_fill_(masked[:, :, None], float("-inf"))
    return s.view(x1 - x0, n1 - n0, -1, J), masked


def _bmm(a, b, out, ta=False, tb=False):
    """out [x, n, i, k] = a @ b over the flattened batch (x, n); ta / tb use
    a / b transposed (strided views: bmm takes them without a copy)."""
    a, b = a.flatten(0, 1), b.flatten(0, 1)
    torch.bmm(a.transpose(1, 2) if ta else a, b.transpose(1, 2) if tb else b, out=out.flatten(0, 1))
    return out


def _key_blocks(x, Q, P):
    """x [X, P + N*Q, W] (head-major) -> the overlapping blocks [X, N, Q + P, W],
    block n = positions [nQ, nQ + Q + P)."""
    x = x.contiguous()  # as_strided below assumes it
    X, TT, W = x.shape
    return x.as_strided((X, (TT - P) // Q, Q + P, W), (TT * W, Q * W, W, 1)).contiguous()


def _fold_blocks(d, Q, TT):
    """The adjoint of _key_blocks: d [X, N, J, W] -> [X, TT, W], adding each
    block back in ceil(J / Q) tiled passes."""
    X, N, J, W = d.shape
    out = d.new_zeros(X, TT, W)
    for m0 in range(0, J, Q):  # slots [m0, m0 + Q) of block n: positions nQ + m0 + (0 .. Q-1)
        tile = d[:, :, m0:m0 + Q]
        tile = F.pad(tile, (0, 0, 0, Q - tile.shape[2])).reshape(X, N * Q, W)
        n = min(N * Q, TT - m0)
        out[:, m0:m0 + n] += tile[:, :n]
    return out


class WindowBlocks(torch.autograd.Function):
    """Blocked window softmax with recomputation (the FlashAttention recipe
    at block granularity): only q, k, v, y and lse are saved; each segment's
    probabilities are rebuilt in the backward.

    (q [X, N, G*Q, E], keys [X, P + N*Q, E], values [X, P + N*Q, D] (head-major,
    the P cached positions first), key_ok [B, N, J] bool, K, Q, scale)
    -> (y [X, N, G*Q, D], lse [X, N, G*Q]), J = Q + P. The overlapping key
    blocks [X, N, J, .] are built in the forward and again in the backward
    rather than saved (they are J / Q ~ 3x the keys).
    Gradient of a row with p = softmax(s):  ds = p (dy v^T - dy . y + dlse).
    """

    @staticmethod
    @_without_autocast
    def forward(ctx, q, kk, vv, key_ok, K, Q, scale):
        q = q.contiguous()  # segments are views of one slab
        X, N, GQ, _ = q.shape
        P = kk.shape[1] - N * Q
        k, v = _key_blocks(kk, Q, P), _key_blocks(vv, Q, P)
        segments = _segments(X, N, GQ * k.shape[2])
        y = v.new_empty(X, N, GQ, v.shape[-1])
        lse = q.new_empty(X, N, GQ)
        for seg in segments:
            x0, x1, n0, n1 = seg
            p, masked = _scores(q, k, key_ok, K, Q, scale, seg)
            m = p.amax(-1, keepdim=True)  # finite: every row sees its own key
            _masked_exp_(p, m, masked)
            total = p.sum(-1, keepdim=True)
            lse[x0:x1, n0:n1] = (m + total.log()).squeeze(-1)
            _bmm(p.div_(total), v[x0:x1, n0:n1], y[x0:x1, n0:n1])
        ctx.save_for_backward(q, kk, vv, key_ok, y, lse)
        ctx.K, ctx.Q, ctx.scale, ctx.segments = K, Q, scale, segments
        return y, lse

    @staticmethod
    @once_differentiable
    @_without_autocast
    def backward(ctx, dy, dlse):
        q, kk, vv, key_ok, y, lse = ctx.saved_tensors
        K, Q, scale = ctx.K, ctx.Q, ctx.scale
        P = kk.shape[1] - q.shape[1] * Q
        k, v = _key_blocks(kk, Q, P), _key_blocks(vv, Q, P)
        dy = dy.contiguous()  # autograd materialises unused output gradients as zeros
        row = (dy * y).sum(-1).sub_(dlse)  # [X, N, G*Q]
        dq, dk, dv = (torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
        for seg in ctx.segments:
            x0, x1, n0, n1 = seg
            at = (slice(x0, x1), slice(n0, n1))
            p, masked = _scores(q, k, key_ok, K, Q, scale, seg)
            _masked_exp_(p, lse[at].unsqueeze(-1), masked)
            _bmm(p, dy[at], dv[at], ta=True)
            ds = _bmm(dy[at], v[at], torch.empty_like(p), tb=True)
            ds.sub_(row[at].unsqueeze(-1)).mul_(p).mul_(scale)
            _bmm(ds, k[at], dq[at])
            _bmm(ds, q[at], dk[at], ta=True)
        TT = kk.shape[1]
        return dq, _fold_blocks(dk, Q, TT), _fold_blocks(dv, Q, TT), None, None, None, None


def _blocked(q, k, v, window_size, scale, mask, state, lengths=None):
    """Core in the work dtype: returns (y [B,T,H,D], lse [B,T,H], WindowState).

    lengths [B]: tokens of each row for a right-padded batch of documents, so
    each row's final buffer ends at its own last token (default: T for all).
    """
    B, T, H, E = q.shape
    K, D, P = k.shape[2], v.shape[-1], window_size - 1
    G = H // K
    work = state_dtype(q.dtype)
    state = state if state is not None else empty_window_state(k, v, window_size, work)
    mask = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=q.device)
    kk = torch.cat([state.k.to(work), k.to(work)], 1)  # [B, P + T, K, E]
    vv = torch.cat([state.v.to(work), v.to(work)], 1)  # [B, P + T, K, D]
    km = torch.cat([state.mask, mask], 1)  # [B, P + T]
    if lengths is None:
        new_state = WindowState(kk[:, T:], vv[:, T:], km[:, T:])
    else:  # the P slots before each row's end: [len_b, len_b + P) of cache + sequence
        idx = lengths.to(q.device)[:, None] + torch.arange(P, device=q.device)[None, :]  # [B, P]
        take = lambda x: x.gather(1, idx.view(B, P, *([1] * (x.dim() - 2))).expand(B, P, *x.shape[2:]))
        new_state = WindowState(take(kk), take(vv), take(km))
    Q = min(T, _QBLOCK)
    N = -(-T // Q)
    pad = N * Q - T

    def padded(x):  # zero-padded at the end of time to N * Q (+ P) positions
        return F.pad(x, (0,) * (2 * (x.dim() - 2)) + (0, pad)) if pad else x

    def head_major(x):  # [B, P + T, K, W] -> [B * K, P + N * Q, W]
        return padded(x).transpose(1, 2).reshape(B * K, -1, x.shape[-1])

    # block n: queries [nQ, nQ + Q) see keys [nQ - P, nQ + Q) = J = Q + P slots
    qb = padded(q.to(work)).view(B, N, Q, K, G, E).permute(0, 3, 1, 4, 2, 5)
    key_ok = padded(km).unfold(1, Q + P, Q)  # [B, N, J]
    y, lse = WindowBlocks.apply(
        qb.reshape(B * K, N, G * Q, E),
        head_major(kk),  # [B * K, P + N * Q, E]
        head_major(vv),  # [B * K, P + N * Q, D]
        key_ok.contiguous(), K, Q, scale,
    )
    y = y.view(B, K, N, G, Q, D).permute(0, 2, 4, 1, 3, 5).reshape(B, N * Q, H, D)[:, :T]
    lse = lse.view(B, K, N, G, Q).permute(0, 2, 4, 1, 3).reshape(B, N * Q, H)[:, :T]
    return y, lse, new_state


def sliding_window_attention_lse(
    q, k, v, *, window_size, scale=None, mask=None, initial_state=None, output_final_state=False
):
    """Like sliding_window_attention, also returning the window log-normaliser.

    Returns (y [B, T, H, D] in v's dtype, lse [B, T, H] float32, state or None).
    """
    check_qkv(q, k, v, mask)
    check_positive_int("window_size", window_size)
    if q.shape[1] == 0:
        raise ValueError("q: sequence length T must be >= 1, got 0")
    if initial_state is not None:
        check_window_state(initial_state, q, k, v, window_size)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    y, lse, state = _blocked(q, k, v, window_size, scale, mask, initial_state)
    return y.to(v.dtype), lse, (state if output_final_state else None)


def sliding_window_attention(
    q, k, v, *, window_size, scale=None, mask=None, initial_state=None, output_final_state=False
):
    """Exact causal softmax attention over the last `window_size` tokens.

    Args:
        q: [B, T, H, E]; k: [B, T, K, E]; v: [B, T, K, D] with H a multiple
            of K (grouped KV heads: query head h uses KV head h // (H / K)).
        window_size: tokens seen by each query, itself included (>= 1).
        scale: score scale, default 1/sqrt(E).
        mask: [B, T] bool, False for padding (never attended to).
        initial_state / output_final_state: a WindowState to continue from.
    Returns:
        (y [B, T, H, D] in v's dtype, WindowState or None)
    """
    y, _, state = sliding_window_attention_lse(
        q, k, v, window_size=window_size, scale=scale, mask=mask,
        initial_state=initial_state, output_final_state=output_final_state,
    )
    return y, state


def window_step(q_t, k_t, v_t, *, window_size, scale, mask_t, state):
    """One decoding step in the work dtype: (y_t [B,H,D], lse_t [B,H], state)."""
    B, H, E = q_t.shape
    K = k_t.shape[1]
    work = state_dtype(q_t.dtype)
    state = state if state is not None else empty_window_state(k_t, v_t, window_size, work)
    own = torch.ones(B, 1, dtype=torch.bool, device=q_t.device)
    kk = torch.cat([state.k.to(work), k_t.to(work).unsqueeze(1)], 1)  # [B, W, K, E]
    vv = torch.cat([state.v.to(work), v_t.to(work).unsqueeze(1)], 1)  # [B, W, K, D]
    valid = torch.cat([state.mask, own], 1)  # own key always visible
    s = torch.einsum("bkge,bwke->bkgw", q_t.to(work).view(B, K, H // K, E), kk) * scale
    s = s.masked_fill(~valid[:, None, None], float("-inf"))
    lse = torch.logsumexp(s, -1)  # [B, K, G]
    y = torch.einsum("bkgw,bwkd->bkgd", torch.exp(s - lse.unsqueeze(-1)), vv)
    m = own[:, 0] if mask_t is None else mask_t
    new_state = WindowState(kk[:, 1:], vv[:, 1:], torch.cat([state.mask, m.unsqueeze(1)], 1)[:, 1:])
    return y.reshape(B, H, -1), lse.reshape(B, H), new_state


def sliding_window_step(q_t, k_t, v_t, *, window_size, scale=None, mask_t=None, state=None):
    """One decoding step: q_t [B, H, E], k_t [B, K, E], v_t [B, K, D].

    Returns (y_t [B, H, D] in v's dtype, WindowState). Constant in the context.
    """
    check_qkv(q_t, k_t, v_t, mask_t, suffix="_t")
    check_positive_int("window_size", window_size)
    if state is not None:
        check_window_state(state, q_t, k_t, v_t, window_size, name="state")
    scale = q_t.shape[-1] ** -0.5 if scale is None else scale
    y, _, state = window_step(q_t, k_t, v_t, window_size=window_size, scale=scale, mask_t=mask_t, state=state)
    return y.to(v_t.dtype), state
