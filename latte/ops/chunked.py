"""The chunked causal Latte kernel with an analytic backward (MATH.md 3.2).

Legend: G = batch x heads (head-major: every product below is a plain
batched matmul on contiguous blocks), N chunks, C chunk size (t: query, s: key
position in a chunk), L latents per head, D value width.

Inputs are already prepared by latte_causal: q = softmax(a), key logits b
(masked, centred, padded to N * C), values v, initial state (S0, z0).
Forward:
  z_t   = logaddexp(logcumsumexp(b)_t, z0)
  y_t   = sum_l q_tl [exp(zp - z_t)_l (S_before)_l + sum_{s<=t in chunk} exp(b_s - z_t)_l v_s]
  S_n   = exp(zp_n - z_end_n) S_{n-1} + sum_{s in n} exp(b_s - z_end_n) v_s
Backward, with u_tl = dy_t . Vbar_tl (the gradient w.r.t. q):
  dv_s  = sum_{t>=s} sum_l q_tl exp(b_s - z_t)_l dy_t
  db_sl = sum_{t>=s} exp(b_sl - z_tl) q_tl [dy_t . v_s - u_tl]     (z's share included)
Future chunks enter through reverse states normalised at each chunk end,
  Rv_n = sum_{t after chunk n} exp(z_end_n - z_t) q_t dy_t   [L, D]
  Rq_n = sum_{t after chunk n} exp(z_end_n - z_t) q_t u_t    [L]
carried backwards in time by the same scan as the forward state (every
exponent <= 0). Only the inputs and the chunk states are saved; each chunk's
C x C blocks are rebuilt in the backward. The intra-chunk blocks use the
factorised form exp(b_s - r) exp(r - z_t) (r = z at the chunk's first token)
and chunks whose z grows by more than SPREAD_LIMIT are redone in log space.
"""

from __future__ import annotations

import functools

import torch

from .recurrence import _scan

# Largest growth of z inside one chunk for which the factorised intra-chunk
# form is used; its factors then stay within exp(+-40), far from float32 limits.
SPREAD_LIMIT = 40.0
_SCAN_CHUNK = 16
# Inside a chunk, logcumsumexp is computed as M + log(cumsum(exp(b - M))) with
# M the chunk's max; exact unless the chunk's first logit is far below M (its
# partial sums would underflow), in which case torch.logcumsumexp (exact, but
# ~100x slower than exp on CPU) redoes that chunk.
_SHIFT_LIMIT = 60.0


def _chunk_logcumsumexp(b, z0, C):
    """z_t = logaddexp(logcumsumexp(b)_t, z0): b [G, N*C, L], z0 [G, L] -> [G, N, C, L]."""
    G, TT, L = b.shape
    bc = b.view(G, TT // C, C, L)
    M = bc.amax(2, keepdim=True)  # [G, N, 1, L]
    local = torch.log(torch.cumsum(torch.exp(bc - M), 2)) + M  # logcumsumexp inside each chunk
    bad = ((M[:, :, 0] - bc[:, :, 0]).amax(-1) > _SHIFT_LIMIT).flatten()  # [G * N]
    if bool(bad.any()):
        idx = bad.nonzero().squeeze(1)
        exact = torch.logcumsumexp(bc.flatten(0, 1).index_select(0, idx), dim=1)
        local = _overwrite(local, idx, exact)
    # z before each chunk: a logcumsumexp over N chunk totals (small), from z0
    before = torch.logcumsumexp(torch.cat([z0.unsqueeze(1), local[:, :, -1]], 1), dim=1)[:, :-1]
    return torch.logaddexp(local, before.unsqueeze(2))


def _log_normalisers(b, z0, C):
    """z, z at chunk ends, z before each chunk, the chunk references r, and the
    chunks (flattened (g, n)) whose z grows too much for the factorised form."""
    z = _chunk_logcumsumexp(b, z0, C)  # [G, N, C, L]
    z_end = z[:, :, -1]  # [G, N, L]
    z_prev = torch.cat([z0.unsqueeze(1), z_end[:, :-1]], 1)  # [G, N, L]
    r = z[:, :, :1]  # [G, N, 1, L]
    bad = ((z_end - r[:, :, 0]).amax(-1) > SPREAD_LIMIT).flatten()  # [G * N]
    return z, z_end, z_prev, r, bad.nonzero().squeeze(1) if bool(bad.any()) else None


def _log_space_weights(b, z, idx):
    """E[m, t, s, l] = exp(b_s - z_t) for s <= t, for the chunks in idx."""
    bs, zs = (x.flatten(0, 1).index_select(0, idx) for x in (b, z))  # [M, C, L]
    C = bs.shape[1]
    diff = bs.unsqueeze(1) - zs.unsqueeze(2)  # [M, C(t), C(s), L]
    causal = torch.ones(C, C, dtype=torch.bool, device=b.device).tril()
    return diff.masked_fill(~causal[:, :, None], float("-inf")).exp()


def _overwrite(x, idx, values):
    """A copy of x [G, N, ...] whose chunks idx (flattened (g, n)) are values."""
    return x.flatten(0, 1).index_copy(0, idx, values).view_as(x)


def _sel(idx, *xs):
    return [x.flatten(0, 1).index_select(0, idx) for x in xs]


def _without_autocast(fn):
    """The kernel computes in its inputs' float32 (states are float32 by design);
    under an autocast region its matmuls would otherwise drop to bf16 and the
    backward would mix dtypes."""

    @functools.wraps(fn)
    def run(ctx, first, *rest):
        with torch.autocast(first.device.type, enabled=False):
            return fn(ctx, first, *rest)

    return run


# Chunks per segment are chosen so one segment's [G, n, C, max(C, D, L)]
# temporaries hold about this many floats (16 MB): small enough for the
# allocator to reuse freed blocks instead of mapping (and page-faulting) fresh
# memory for every temporary, which made T = 65536 cost 18x T = 16384.
_SEGMENT_ELEMS = 1 << 22


def _segments(G, N, C, width):
    n = max(1, _SEGMENT_ELEMS // (G * C * width))
    return [(n0, min(N, n0 + n)) for n0 in range(0, N, n)]


def _add_bmm(out, a, b):
    """out += a @ b in place, for [G, n, i, j] @ [G, n, j, k] (out contiguous)."""
    G, n = a.shape[:2]
    out.view(G * n, *out.shape[2:]).baddbmm_(a.reshape(G * n, *a.shape[2:]), b.reshape(G * n, *b.shape[2:]))


def _forward_segment(q, b, v, S0, z0):
    """One segment: q, b [G, n, C, L], v [G, n, C, D] (views), state (S0, z0)
    -> (y [G, n, C, D], S_before [G, n, L, D], S_last, z_last)."""
    G, n, C, L = q.shape
    z, z_end, z_prev, r, bad = _log_normalisers(b.reshape(G, n * C, L), z0, C)
    K = (b - z_end.unsqueeze(2)).exp_().transpose(-1, -2) @ v  # [G, n, L, D] chunk sums at chunk end
    g = torch.exp(z_prev - z_end).unsqueeze(-1)  # [G, n, L, 1] chunk decay
    S_all, S_last = _scan(K, g, S0, _SCAN_CHUNK)
    S_before = torch.cat([S0.unsqueeze(1), S_all[:, :-1]], 1)  # [G, n, L, D]
    # (in-place exp / mul on fresh temporaries: each saved pass over a
    # [G, n, C, L] tensor is measurable on a memory-bound CPU)
    q_prev = (z_prev.unsqueeze(2) - z).exp_().mul_(q)  # [G, n, C, L]
    y = q_prev @ S_before  # inter-chunk: [G, n, C, D]
    k_f = (b - r).clamp_(max=SPREAD_LIMIT).exp_()  # clamp: a no-op where used
    w = ((r - z).exp_().mul_(q) @ k_f.transpose(-1, -2)).tril_()  # [G, n, C(t), C(s)]
    _add_bmm(y, w, v)
    if bad is not None:
        E = _log_space_weights(b, z, bad)  # [M, C, C, L]
        qs, vs, qps, Sbs = _sel(bad, q, v, q_prev, S_before)
        y = _overwrite(y, bad, qps @ Sbs + torch.einsum("mtsl,mtl->mts", E, qs) @ vs)
    return y, S_before, S_last, z_end[:, -1]


def _backward_segment(q, b, v, S_before, z0, dy, init):
    """Gradients of one segment given the reverse state `init` [G, L, D + 1]
    after it; returns (dq, db, dv, reverse state before the segment)."""
    G, n, C, L = q.shape
    D = v.shape[-1]
    z, z_end, z_prev, r, bad = _log_normalisers(b.reshape(G, n * C, L), z0, C)
    e_prev = (z_prev.unsqueeze(2) - z).exp_()  # [G, n, C, L] decay since the chunk start
    qz = (r - z).exp_()
    k_f = (b - r).clamp_(max=SPREAD_LIMIT).exp_()
    M = (dy @ v.transpose(-1, -2)).tril_()  # [G, n, C(t), C(s)]: dy_t . v_s, s <= t
    # u = dy . Vbar: the gradient w.r.t. q
    u = (dy @ S_before.transpose(-1, -2)).mul_(e_prev).addcmul_(qz, M @ k_f)
    q_qz = q * qz
    w = (q_qz @ k_f.transpose(-1, -2)).tril_()
    dv = w.transpose(-1, -2) @ dy  # [G, n, C, D]
    if bad is not None:
        E = _log_space_weights(b, z, bad)
        Ms, dys, Sbs, eps, qs = _sel(bad, M, dy, S_before, e_prev, q)
        u = _overwrite(u, bad, (dys @ Sbs.transpose(-1, -2)) * eps + torch.einsum("mtsl,mts->mtl", E, Ms))
    qu = q * u
    # sums over t >= s inside the chunk: one batched matmul with a stride-0
    # triangular operand (a broadcast `upper @ x` would copy it per chunk)
    upper = torch.ones(C, C, dtype=q.dtype, device=q.device).triu_()
    suffix = torch.bmm(upper.expand(G * n, C, C), qz.mul_(qu).flatten(0, 1)).view(G, n, C, L)
    db = (M.transpose(-1, -2) @ q_qz).sub_(suffix).mul_(k_f)
    if bad is not None:
        w_bad = torch.einsum("mtsl,mtl->mts", E, qs)
        dv = _overwrite(dv, bad, w_bad.transpose(-1, -2) @ dys)
        qus = _sel(bad, qu)[0]
        db = _overwrite(db, bad, torch.einsum("mtsl,mtl,mts->msl", E, qs, Ms) - torch.einsum("mtsl,mtl->msl", E, qus))
    # reverse states over chunks: R_{n-1} = g_n R_n + (local sum over chunk n)
    g = torch.exp(z_prev - z_end)  # [G, n, L]
    Lv = (q * e_prev).transpose(-1, -2) @ dy  # [G, n, L, D]
    Lq = e_prev.mul_(qu).sum(2)  # [G, n, L]
    R, R_first = _scan(torch.cat([Lv, Lq.unsqueeze(-1)], -1).flip(1), g.flip(1).unsqueeze(-1), init, _SCAN_CHUNK)
    R_after = torch.cat([R.flip(1)[:, 1:], init.unsqueeze(1)], 1)  # reverse state after chunk n
    Rv, Rq = R_after[..., :D], R_after[..., D]  # [G, n, L, D], [G, n, L]
    k_end = (b - z_end.unsqueeze(2)).exp_()  # [G, n, C, L]
    _add_bmm(dv, k_end, Rv)
    db.addcmul_(k_end, (v @ Rv.transpose(-1, -2)).sub_(Rq.unsqueeze(2)))
    return u, db, dv, R_first


class LatteChunked(torch.autograd.Function):
    """(q, b [G, N*C, L], v [G, N*C, D], S0 [G, L, D], z0 [G, L], C) ->
    (y [G, N*C, D], S_last, z_last)."""

    @staticmethod
    @_without_autocast
    def forward(ctx, q, b, v, S0, z0, C):
        G, TT, L = q.shape
        N, D = TT // C, v.shape[-1]
        q, b, v = q.view(G, N, C, L), b.view(G, N, C, L), v.view(G, N, C, D)
        y = v.new_empty(G, N, C, D)
        S_before = v.new_empty(G, N, L, D)
        segments = _segments(G, N, C, max(C, D, L))
        z_starts = []  # z before each segment: the backward recomputes z from there
        S, z = S0, z0
        for n0, n1 in segments:
            z_starts.append(z)
            sl = slice(n0, n1)
            y[:, sl], S_before[:, sl], S, z = _forward_segment(q[:, sl], b[:, sl], v[:, sl], S, z)
        ctx.save_for_backward(q, b, v, S0, S_before, S, torch.stack(z_starts))
        ctx.segments = segments
        return y.view(G, TT, D), S, z

    @staticmethod
    @_without_autocast
    def backward(ctx, dy, dS_last, dz_last):
        q, b, v, S0, S_before, S_last, z_starts = ctx.saved_tensors
        G, N, C, L = q.shape
        D = v.shape[-1]
        dy = dy.reshape(G, N, C, D)
        dS_last = torch.zeros_like(S_last) if dS_last is None else dS_last
        dz_last = torch.zeros_like(z_starts[0]) if dz_last is None else dz_last
        # reverse state after the last chunk: the final-state cotangents
        R = torch.cat([dS_last, ((dS_last * S_last).sum(-1) - dz_last).unsqueeze(-1)], -1)  # [G, L, D + 1]
        dq, db, dv = torch.empty_like(q), torch.empty_like(b), torch.empty_like(v)
        for (n0, n1), z0 in reversed(list(zip(ctx.segments, z_starts))):
            sl = slice(n0, n1)
            dq[:, sl], db[:, sl], dv[:, sl], R = _backward_segment(
                q[:, sl], b[:, sl], v[:, sl], S_before[:, sl], z0, dy[:, sl], R
            )
        dS0 = R[..., :D]
        dz0 = (S0 * dS0).sum(-1) - R[..., D]
        TT = N * C
        return dq.view(G, TT, L), db.view(G, TT, L), dv.view(G, TT, D), dS0, dz0, None
