"""The chunked causal Latte kernel with an analytic backward (docs/math.md §3.2).

Legend: N chunks (n in one segment), G = batch x heads, C chunk size (t: query,
s: key position in a chunk), c sub-chunk size, J = C / c, L latents per head,
D value width. Tensors are chunk-major, [N, G, C, .]: a segment (a run of
chunks) is one contiguous block, so every product below is a batched matmul
over n * G without a copy.

Inputs are already prepared by latte_causal: lq = log softmax(a), key logits
b (masked, centred, padded to N * C), values v, initial state (S0, z0).
Forward, with z_t = logaddexp(logcumsumexp(b)_t, z0) and q = exp(lq):
  y_t   = sum_l q_tl [exp(z_prev - z_t)_l (S_before)_l + sum_{s<=t in chunk} exp(b_s - z_t)_l v_s]
  S_n   = exp(z_prev - z_end_n) S_{n-1} + sum_{s in n} exp(b_s - z_end_n) v_s
Backward, with qu_tl = q_tl (dy_t . Vbar_tl) (the gradient w.r.t. lq):
  dv_s  = sum_{t>=s} sum_l q_tl exp(b_s - z_t)_l dy_t
  db_sl = sum_{t>=s} exp(b_sl - z_tl) [q_tl (dy_t . v_s) - qu_tl]     (z's share included)
Future chunks enter through reverse states normalised at each chunk end,
  Rv_n = sum_{t after chunk n} exp(z_end_n - z_t) q_t dy_t   [L, D]
  Rq_n = sum_{t after chunk n} exp(z_end_n - z_t) qu_t       [L]
carried backwards in time by the same recurrence as the forward state.
Inside a chunk, the - exp(b_s - z_t) qu_t terms of every pair come from one
reverse recurrence over its positions (intra_chunk.suffix_sums).

Every exponent above is a difference of log-normalisers or a logit minus a
later log-normaliser, so <= 0, taken from log space; the intra-chunk weights
are built per sub-chunk (intra_chunk.py), with log q folded into their
exponents, so that no factor depends on a chunk-wide reference. The work is
the same for any logits: there is no fallback and no branch on values. Only
the inputs, z (and z before each sub-chunk) and the chunk states are saved;
each chunk's C x C weights are rebuilt in the backward.
"""

from __future__ import annotations

import torch

from ._exp import exp_nonpositive_
from .intra_chunk import (
    diagonal_blocks,
    diagonal_weights,
    key_factors,
    key_factors_for,
    keys,
    log_normalisers,
    queries,
    query_factors,
    sub_chunk_ends,
    sub_chunk_size,
    sub_chunks,
    suffix_sums,
)
from .layout import without_autocast

# Chunks per segment are chosen so one segment's [n, G, C, width] temporaries
# hold about this many floats (16 MB): small enough for the allocator to reuse
# freed blocks instead of mapping (and page-faulting) fresh memory for every
# temporary, which made T = 65536 cost 18x T = 16384.
_SEGMENT_ELEMS = 1 << 22


def _segments(G, N, C, width):
    n = max(1, _SEGMENT_ELEMS // (G * C * width))
    return [(n0, min(N, n0 + n)) for n0 in range(0, N, n)]


def _mm(a, b, out=None):
    """a @ b for [n, G, i, j] @ [n, G, j, k] as one bmm over n * G (either
    operand may be a transposed or sliced view of a contiguous tensor: no copy)."""
    n, G = a.shape[:2]
    res = torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=None if out is None else out.view(n * G, *out.shape[2:]))
    return res.view(n, G, *res.shape[1:])


def _add_mm(out, a, b):
    """out += a @ b in place (out contiguous [n, G, i, k])."""
    out.view(-1, *out.shape[2:]).baddbmm_(a.flatten(0, 1), b.flatten(0, 1))


def _t(x):
    return x.transpose(-1, -2)


def _chunk_factors(lqz, b, z, z_prev):
    """q exp(z_prev - z_t), exp(b_s - z_end) [n, G, C, L] and the chunk decay
    exp(z_prev - z_end) as [n, G, L, 1]."""
    z_end = z[:, :, -1:]
    return exp_nonpositive_(lqz + z_prev), exp_nonpositive_(b - z_end), _t(exp_nonpositive_(z_prev - z_end))


def _forward_segment(lq, b, v, S0, z0, c, y, S_before, z, r):
    """One segment of n chunks: lq, b [n, G, C, L], v [n, G, C, D]
    (contiguous), state (S0, z0); writes y [n, G, C, D], S_before [n, G, L, D]
    (the state before each chunk), z [n, G, C, L] and r [n, G, J, L] (z before
    each sub-chunk); returns the state after the segment."""
    r_seg, z_last = log_normalisers(b, z0, c, z)
    r.copy_(r_seg)
    lqz = lq - z
    qe, k_end, g = _chunk_factors(lqz, b, z, r[:, :, :1])
    K = _mm(_t(k_end), v)  # [n, G, L, D] the chunk's sum, normalised at its end
    S_before[0] = S0
    for i in range(len(K) - 1):  # chunk to chunk: a short loop on [G, L, D]
        torch.addcmul(K[i], g[i], S_before[i], out=S_before[i + 1])
    S_last = torch.addcmul(K[-1], g[-1], S_before[-1])
    _mm(qe, S_before, out=y)  # inter-chunk: q exp(z_prev - z_t)
    n, G, C, _ = lq.shape
    A = lq.new_zeros(n, G, C, C)  # intra-chunk weights [n, G, C(t), C(s)]
    lqz_s, b_s, A_blocks = sub_chunks(lqz, c), sub_chunks(b, c), diagonal_blocks(A, c)
    for d in range(c):  # the diagonal blocks, one offset t - s at a time
        A_blocks.diagonal(-d, 2, 3).copy_(diagonal_weights(lqz_s, b_s, d).sum(-1))  # (no strided out=: torch.compile)
    ends = sub_chunk_ends(z, c)
    kf = key_factors(b, ends, c)
    for i in range(1, C // c):  # earlier sub-chunks: factors <= 1 around r_i
        qr = query_factors(lqz, ends, c, i)
        A[:, :, i * c : (i + 1) * c, : i * c] = _mm(qr, _t(key_factors_for(kf, ends, c, i)))
    _add_mm(y, A, v)
    return S_last, z_last


def _intra_backward(lqz, b, z, M, qu, db, c):
    """The intra-chunk part of the backward. Adds to qu (q_t times dy_t .
    Vbar_t) its intra-chunk share and to db the first intra-chunk term of
    every key, sum_{t >= s} q_t W[t, s] M[t, s] (the second, - W qu, comes
    from suffix_sums); returns the intra-chunk weights A [n, G, C, C].
    M [n, G, C, C]: dy_t . v_s, zero above the diagonal."""
    n, G, C, _ = lqz.shape
    A = lqz.new_zeros(n, G, C, C)
    lqz_s, b_s, qu_s, db_s = (sub_chunks(x, c) for x in (lqz, b, qu, db))
    A_blocks, M_blocks = diagonal_blocks(A, c), diagonal_blocks(M, c)
    for d in range(c):  # diagonal blocks
        P = diagonal_weights(lqz_s, b_s, d)  # q_t W[t, t - d]
        A_blocks.diagonal(-d, 2, 3).copy_(P.sum(-1))
        Md = M_blocks.diagonal(-d, 2, 3).unsqueeze(-1)  # [n, G, J, c - d, 1]
        queries(qu_s, d).addcmul_(P, Md)
        keys(db_s, d).addcmul_(P, Md)
    ends = sub_chunk_ends(z, c)
    kf = key_factors(b, ends, c)
    for i in range(1, C // c):  # earlier sub-chunks: factors <= 1 around r_i
        rows, cols = slice(i * c, (i + 1) * c), slice(0, i * c)
        qr, kfi = query_factors(lqz, ends, c, i), key_factors_for(kf, ends, c, i)
        A[:, :, rows, cols] = _mm(qr, _t(kfi))  # (a strided bmm out= loops per matrix)
        Mi = M[:, :, rows, cols]
        qu[:, :, rows].addcmul_(qr, _mm(Mi, kfi))
        db[:, :, cols].addcmul_(kfi, _mm(_t(Mi), qr))
    return A


def _backward_segment(lq, b, v, z, r, S_before, dy, init, c, dlq, db, dv):
    """Gradients of one segment given the reverse state `init` [G, L, D + 1]
    after it: writes dlq, db, dv and returns the reverse state before it."""
    D = v.shape[-1]
    lqz = lq - z
    qe, k_end, g = _chunk_factors(lqz, b, z, r[:, :, :1])
    M = _mm(dy, _t(v)).tril_()  # [n, G, C(t), C(s)]: dy_t . v_s, s <= t
    qu = _mm(dy, _t(S_before), out=dlq).mul_(qe)  # q_t (dy_t . Vbar_t): the gradient w.r.t. lq
    db.zero_()
    A = _intra_backward(lqz, b, z, M, qu, db, c)
    w_qu, rho0 = suffix_sums(qu, b, z)  # sum_{t >= s in the chunk} exp(b_s - z_t) qu_t
    db.sub_(w_qu)
    # reverse states over chunks: R_{i-1} = g_i R_i + (local sum over chunk i),
    # R_after[i] the reverse state after chunk i; sum_t exp(z_prev - z_t) qu_t
    # is exp(z_prev - z_0) rho_0
    local_q = exp_nonpositive_(r[:, :, :1] - z[:, :, :1]).mul_(rho0).squeeze(2)  # [n, G, L]
    local = torch.cat([_mm(_t(qe), dy), local_q.unsqueeze(-1)], -1)  # [n, G, L, D + 1]
    R_after = torch.empty_like(local)
    R_after[-1] = init
    for i in range(len(local) - 1, 0, -1):
        torch.addcmul(local[i], g[i], R_after[i], out=R_after[i - 1])
    R_first = torch.addcmul(local[0], g[0], R_after[0])
    Rv, Rq = R_after[..., :D], R_after[..., D]  # [n, G, L, D], [n, G, L]
    _mm(_t(A), dy, out=dv)
    _add_mm(dv, k_end, Rv)
    db.addcmul_(k_end, _mm(v, _t(Rv)).sub_(Rq.unsqueeze(2)))
    return R_first


class LatteChunked(torch.autograd.Function):
    """(lq = log softmax(a), b [N, G, C, L], v [N, G, C, D] chunk-major and
    contiguous, S0 [G, L, D], z0 [G, L]) -> (y [N, G, C, D], S_last, z_last).
    C must be a multiple of the sub-chunk size (intra_chunk.padded_chunk_size)."""

    @staticmethod
    @without_autocast
    def forward(ctx, lq, b, v, S0, z0):
        N, G, C, L = lq.shape
        D, c = v.shape[-1], sub_chunk_size(C)
        assert C % c == 0, "the chunk must be a whole number of sub-chunks"
        y = v.new_empty(N, G, C, D)
        S_before = v.new_empty(N, G, L, D)
        z, r = torch.empty_like(b), b.new_empty(N, G, C // c, L)
        segments = _segments(G, N, C, max(C, D, L))
        S, zl = S0, z0
        for n0, n1 in segments:
            sl = slice(n0, n1)
            S, zl = _forward_segment(lq[sl], b[sl], v[sl], S, zl, c, y[sl], S_before[sl], z[sl], r[sl])
        ctx.save_for_backward(lq, b, v, S0, S_before, S, z, r)
        ctx.segments, ctx.c = segments, c
        return y, S, zl

    @staticmethod
    @without_autocast
    def backward(ctx, dy, dS_last, dz_last):
        lq, b, v, S0, S_before, S_last, z, r = ctx.saved_tensors
        D = v.shape[-1]
        dy = dy.contiguous()
        dS_last = torch.zeros_like(S_last) if dS_last is None else dS_last
        dz_last = torch.zeros_like(r[0, :, 0]) if dz_last is None else dz_last
        # reverse state after the last chunk: the final-state cotangents
        R = torch.cat([dS_last, ((dS_last * S_last).sum(-1) - dz_last).unsqueeze(-1)], -1)  # [G, L, D + 1]
        dlq, db, dv = torch.empty_like(lq), torch.empty_like(b), torch.empty_like(v)
        for n0, n1 in reversed(ctx.segments):
            sl = slice(n0, n1)
            R = _backward_segment(
                lq[sl], b[sl], v[sl], z[sl], r[sl], S_before[sl], dy[sl], R, ctx.c, dlq[sl], db[sl], dv[sl]
            )
        dS0 = R[..., :D]
        dz0 = (S0 * dS0).sum(-1) - R[..., D]
        return dlq, db, dv, dS0, dz0
