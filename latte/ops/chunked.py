"""The chunked causal Latte kernel with an analytic backward (MATH.md 3.2).

Legend: N chunks (n in one segment), G = batch x heads, C chunk size (t: query,
s: key position in a chunk), L latents per head, D value width. Tensors are
chunk-major, [N, G, C, .]: a segment (a run of chunks) is one contiguous
block, so every product below is a batched matmul over n * G without a copy.

Inputs are already prepared by latte_causal: q = softmax(a), key logits b
(masked, centred, padded to N * C), values v, initial state (S0, z0).
Forward, with z_t = logaddexp(logcumsumexp(b)_t, z0):
  y_t   = sum_l q_tl [exp(zp - z_t)_l (S_before)_l + sum_{s<=t in chunk} exp(b_s - z_t)_l v_s]
  S_n   = exp(zp_n - z_end_n) S_{n-1} + sum_{s in n} exp(b_s - z_end_n) v_s
Backward, with u_tl = dy_t . Vbar_tl (the gradient w.r.t. q):
  dv_s  = sum_{t>=s} sum_l q_tl exp(b_s - z_t)_l dy_t
  db_sl = sum_{t>=s} exp(b_sl - z_tl) q_tl [dy_t . v_s - u_tl]     (z's share included)
Future chunks enter through reverse states normalised at each chunk end,
  Rv_n = sum_{t after chunk n} exp(z_end_n - z_t) q_t dy_t   [L, D]
  Rq_n = sum_{t after chunk n} exp(z_end_n - z_t) q_t u_t    [L]
carried backwards in time by the same recurrence as the forward state.

Inside a chunk nothing is taken in log space: with m = max(chunk max of b,
z_prev) per latent, E_s = exp(b_s - m) <= 1 and Z_t = exp(z_t - m) =
cumsum(E)_t + exp(z_prev - m), so exp(b_s - z_t) = E_s / Z_t and
exp(z_prev - z_t) = exp(z_prev - m) / Z_t. Z_end >= 1 always (it includes
the largest of the chunk's mass and the previous mass), and Z_t only grows
with t, so the factors stay in [exp(-SPREAD_LIMIT), 1] unless the chunk's
first Z is below exp(-SPREAD_LIMIT); those rare chunks (z growing by more than
SPREAD_LIMIT inside one chunk) are redone exactly in log space. Only the
inputs and the chunk states are saved; each chunk's C x C blocks are rebuilt
in the backward.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

# Largest growth of z inside one chunk for which the factorised intra-chunk
# form is used; its factors then stay within exp(+-40), far from float32 limits.
SPREAD_LIMIT = 40.0


def to_chunks(x, C, value=0.0):
    """[B, T, H, X] -> chunk-major [N, B * H, C, X] (contiguous), time padded
    at the end with `value` to N * C."""
    B, T, H, X = x.shape
    N = -(-T // C)
    if N * C > T:
        x = F.pad(x, (0, 0, 0, 0, 0, N * C - T), value=value)
    return x.unflatten(1, (N, C)).permute(1, 0, 3, 2, 4).reshape(N, B * H, C, X).contiguous()


def from_chunks(y, B, T):
    """The inverse of to_chunks: [N, B * H, C, X] -> [B, T, H, X] (padding dropped)."""
    N, G, C, X = y.shape
    return y.view(N, B, G // B, C, X).permute(1, 0, 3, 2, 4).reshape(B, N * C, G // B, X)[:, :T]


class _Norm(NamedTuple):
    """The per-chunk normalisers of one segment (m: the chunk's reference)."""

    E: torch.Tensor  # [n, G, C, L] exp(b - m)
    inv_Z: torch.Tensor  # [n, G, C, L] exp(m - z_t)
    beta: torch.Tensor  # [n, G, 1, L] exp(z_prev - m)
    Z_end: torch.Tensor  # [n, G, 1, L] exp(z_end - m) >= 1
    z_prev: torch.Tensor  # [n, G, 1, L] z before each chunk
    z_last: torch.Tensor  # [G, L] z after the segment
    bad: torch.Tensor | None  # chunks (flattened (n, g)) for the log-space form


def _normalisers(b, z0):
    """b [n, G, C, L] (contiguous), z0 [G, L] the log-normaliser before the segment."""
    M = b.amax(2, keepdim=True)  # [n, G, 1, L]
    E = (b - M).exp_()
    total = E.sum(2, keepdim=True).log_().add_(M)  # log of each chunk's mass
    z_end = torch.logcumsumexp(torch.cat([z0[None, :, None], total]), 0)  # [n + 1, G, 1, L]
    z_prev, z_last = z_end[:-1], z_end[-1, :, 0]
    m = torch.maximum(M, z_prev)
    alpha, beta = (M - m).exp_(), (z_prev - m).exp_()  # both <= 1, one of them is 1
    Z = E.cumsum(2)
    torch.addcmul(beta, Z, alpha, out=Z)  # exp(z_t - m)
    E.mul_(alpha)
    Z_end = Z[:, :, -1:].clone()
    bad = (Z[:, :, 0].amin(-1) < math.exp(-SPREAD_LIMIT)).flatten()  # [n * G]
    bad = bad.nonzero().squeeze(1) if bool(bad.any()) else None
    return _Norm(E, Z.reciprocal_(), beta, Z_end, z_prev, z_last, bad)


def _exact(b, nm, idx):
    """For the chunks idx: the exact z [M, C, L] and W[m, t, s, l] = exp(b_s - z_t)
    (s <= t, else 0), both from log space."""
    bs, zp = _sel(idx, b, nm.z_prev)  # [M, C, L], [M, 1, L]
    z = torch.logaddexp(torch.logcumsumexp(bs, 1), zp)
    C = bs.shape[1]
    diff = bs.unsqueeze(1) - z.unsqueeze(2)  # [M, C(t), C(s), L]
    causal = torch.ones(C, C, dtype=torch.bool, device=b.device).tril()
    return z, diff.masked_fill(~causal[:, :, None], float("-inf")).exp()


def _overwrite(x, idx, values):
    """Chunks idx (flattened (n, g)) of the contiguous x [n, G, ...] := values, in place."""
    x.flatten(0, 1).index_copy_(0, idx, values)


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


# Chunks per segment are chosen so one segment's [n, G, C, max(C, D, L)]
# temporaries hold about this many floats (16 MB): small enough for the
# allocator to reuse freed blocks instead of mapping (and page-faulting) fresh
# memory for every temporary, which made T = 65536 cost 18x T = 16384.
_SEGMENT_ELEMS = 1 << 22


def _segments(G, N, C, width):
    n = max(1, _SEGMENT_ELEMS // (G * C * width))
    return [(n0, min(N, n0 + n)) for n0 in range(0, N, n)]


def _mm(a, b, out=None):
    """a @ b for [n, G, i, j] @ [n, G, j, k] as one bmm over n * G (either
    operand may be a transposed view of a contiguous tensor: no copy)."""
    n, G = a.shape[:2]
    res = torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=None if out is None else out.view(n * G, *out.shape[2:]))
    return res.view(n, G, *res.shape[1:])


def _add_mm(out, a, b):
    """out += a @ b in place (out contiguous [n, G, i, k])."""
    out.view(-1, *out.shape[2:]).baddbmm_(a.flatten(0, 1), b.flatten(0, 1))


def _t(x):
    return x.transpose(-1, -2)


def _forward_segment(q, b, v, S0, z0, y, S_before):
    """One segment of n chunks: q, b [n, G, C, L], v [n, G, C, D] (contiguous),
    state (S0, z0); writes y [n, G, C, D] and S_before [n, G, L, D] (the state
    before each chunk); returns the state after the segment."""
    nm = _normalisers(b, z0)
    E, inv_Z = nm.E, nm.inv_Z
    K = _mm(_t(E), v).div_(_t(nm.Z_end))  # [n, G, L, D] the chunk's sum, normalised at its end
    g = _t(nm.beta / nm.Z_end)  # [n, G, L, 1] chunk decay exp(z_prev - z_end)
    S_before[0] = S0
    for i in range(len(K) - 1):  # chunk to chunk: a short loop on [G, L, D]
        torch.addcmul(K[i], g[i], S_before[i], out=S_before[i + 1])
    S_last = torch.addcmul(K[-1], g[-1], S_before[-1])
    qi = q * inv_Z
    _mm(qi * nm.beta, S_before, out=y)  # inter-chunk: q exp(z_prev - z_t)
    _add_mm(y, _mm(qi, _t(E)).tril_(), v)  # intra-chunk: [n, G, C(t), C(s)] weights
    if nm.bad is not None:
        z, W = _exact(b, nm, nm.bad)
        qs, vs, Sbs, zp = _sel(nm.bad, q, v, S_before, nm.z_prev)
        _overwrite(y, nm.bad, (qs * (zp - z).exp()) @ Sbs + torch.einsum("mtsl,mtl->mts", W, qs) @ vs)
    return S_last, nm.z_last


def _backward_segment(q, b, v, S_before, z0, dy, init, dq, db, dv):
    """Gradients of one segment given the reverse state `init` [G, L, D + 1]
    after it: writes dq, db, dv and returns the reverse state before it."""
    C, D = q.shape[2], v.shape[-1]
    nm = _normalisers(b, z0)
    E, inv_Z, bad = nm.E, nm.inv_Z, nm.bad
    e_prev = inv_Z * nm.beta  # [n, G, C, L] exp(z_prev - z_t)
    qi = q * inv_Z
    M = _mm(dy, _t(v)).tril_()  # [n, G, C(t), C(s)]: dy_t . v_s, s <= t
    # u = dy . Vbar: the gradient w.r.t. q
    u = _mm(dy, _t(S_before), out=dq).mul_(e_prev).addcmul_(inv_Z, _mm(M, E))
    if bad is not None:
        z, W = _exact(b, nm, bad)
        Ms, dys, Sbs, qs, zp = _sel(bad, M, dy, S_before, q, nm.z_prev)
        eps = (zp - z).exp()
        _overwrite(e_prev, bad, eps)
        _overwrite(u, bad, (dys @ _t(Sbs)) * eps + torch.einsum("mtsl,mts->mtl", W, Ms))
    qu = q * u
    # reverse states over chunks: R_{i-1} = g_i R_i + (local sum over chunk i),
    # R_after[i] the reverse state after chunk i
    local = torch.cat([_mm(_t(q * e_prev), dy), e_prev.mul_(qu).sum(2).unsqueeze(-1)], -1)  # [n, G, L, D + 1]
    g = _t(nm.beta / nm.Z_end)  # [n, G, L, 1]
    R_after = torch.empty_like(local)
    R_after[-1] = init
    for i in range(len(local) - 1, 0, -1):
        torch.addcmul(local[i], g[i], R_after[i], out=R_after[i - 1])
    R_first = torch.addcmul(local[0], g[0], R_after[0])
    # exp(b_s - z_end) = E / Z_end: fold 1 / Z_end into the small reverse states
    R_end = R_after / _t(nm.Z_end)
    Rv, Rq = R_end[..., :D], R_end[..., D]  # [n, G, L, D], [n, G, L]
    if bad is not None:
        qus = _sel(bad, qu)[0]
    # sums over t >= s inside the chunk: one batched matmul with a stride-0
    # triangular operand (a broadcast `upper @ x` would copy it per chunk)
    upper = torch.ones(C, C, dtype=q.dtype, device=q.device).triu_()
    suffix = torch.bmm(upper.expand(qu.shape[0] * qu.shape[1], C, C), qu.mul_(inv_Z).flatten(0, 1)).view_as(qu)
    _mm(_t(_mm(qi, _t(E)).tril_()), dy, out=dv)  # [n, G, C, D]
    _add_mm(dv, E, Rv)
    _mm(_t(M), qi, out=db).sub_(suffix)
    _add_mm(db, v, _t(Rv))
    db.sub_(Rq.unsqueeze(2)).mul_(E)
    if bad is not None:
        Es, vs, Rvs, Rqs = _sel(bad, E, v, Rv, Rq)
        _overwrite(dv, bad, _t(torch.einsum("mtsl,mtl->mts", W, qs)) @ dys + Es @ Rvs)
        intra = torch.einsum("mtsl,mtl,mts->msl", W, qs, Ms) - torch.einsum("mtsl,mtl->msl", W, qus)
        _overwrite(db, bad, intra + Es * (vs @ _t(Rvs) - Rqs.unsqueeze(1)))
    return R_first


class LatteChunked(torch.autograd.Function):
    """(q, b [N, G, C, L], v [N, G, C, D] chunk-major and contiguous,
    S0 [G, L, D], z0 [G, L]) -> (y [N, G, C, D], S_last, z_last)."""

    @staticmethod
    @_without_autocast
    def forward(ctx, q, b, v, S0, z0):
        N, G, C, L = q.shape
        D = v.shape[-1]
        y = v.new_empty(N, G, C, D)
        S_before = v.new_empty(N, G, L, D)
        segments = _segments(G, N, C, max(C, D, L))
        z_starts = []  # z before each segment: the backward recomputes z from there
        S, z = S0, z0
        for n0, n1 in segments:
            z_starts.append(z)
            S, z = _forward_segment(q[n0:n1], b[n0:n1], v[n0:n1], S, z, y[n0:n1], S_before[n0:n1])
        ctx.save_for_backward(q, b, v, S0, S_before, S, torch.stack(z_starts))
        ctx.segments = segments
        return y, S, z

    @staticmethod
    @_without_autocast
    def backward(ctx, dy, dS_last, dz_last):
        q, b, v, S0, S_before, S_last, z_starts = ctx.saved_tensors
        D = v.shape[-1]
        dy = dy.contiguous()
        dS_last = torch.zeros_like(S_last) if dS_last is None else dS_last
        dz_last = torch.zeros_like(z_starts[0]) if dz_last is None else dz_last
        # reverse state after the last chunk: the final-state cotangents
        R = torch.cat([dS_last, ((dS_last * S_last).sum(-1) - dz_last).unsqueeze(-1)], -1)  # [G, L, D + 1]
        dq, db, dv = torch.empty_like(q), torch.empty_like(b), torch.empty_like(v)
        for (n0, n1), z0 in reversed(list(zip(ctx.segments, z_starts))):
            sl = slice(n0, n1)
            R = _backward_segment(q[sl], b[sl], v[sl], S_before[sl], z0, dy[sl], R, dq[sl], db[sl], dv[sl])
        dS0 = R[..., :D]
        dz0 = (S0 * dS0).sum(-1) - R[..., D]
        return dq, db, dv, dS0, dz0
