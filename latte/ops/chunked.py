"""The chunked causal Latte kernel with an analytic backward (MATH.md 3.2).

Legend: B batch, N chunks, C chunk size (t: query, s: key position in a
chunk), H heads, L latents per head, D value width.

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
    """z_t = logaddexp(logcumsumexp(b)_t, z0) as [B, N, C, H, L]."""
    B, TT, H, L = b.shape
    N = TT // C
    bc = b.view(B, N, C, H, L)
    M = bc.amax(2, keepdim=True)  # [B, N, 1, H, L]
    local = torch.log(torch.cumsum(torch.exp(bc - M), 2)) + M  # logcumsumexp inside each chunk
    bad = ((M[:, :, 0] - bc[:, :, 0]).amax(dim=(-2, -1)) > _SHIFT_LIMIT).flatten()  # [B * N]
    if bool(bad.any()):
        idx = bad.nonzero().squeeze(1)
        exact = torch.logcumsumexp(bc.flatten(0, 1).index_select(0, idx), dim=1)
        local = local.flatten(0, 1).index_copy(0, idx, exact).view_as(local)
    # z before each chunk: a logcumsumexp over N chunk totals (small), from z0
    before = torch.logcumsumexp(torch.cat([z0.unsqueeze(1), local[:, :, -1]], 1), dim=1)[:, :-1]
    return torch.logaddexp(local, before.unsqueeze(2))


def _log_normalisers(b, z0, C):
    """z, z at chunk ends, z before each chunk, and the chunk references r."""
    z = _chunk_logcumsumexp(b, z0, C)  # [B, N, C, H, L]
    z_end = z[:, :, -1]  # [B, N, H, L]
    z_prev = torch.cat([z0.unsqueeze(1), z_end[:, :-1]], 1)  # [B, N, H, L]
    r = z[:, :, :1]  # [B, N, 1, H, L]
    bad = ((z_end - r[:, :, 0]).amax(dim=(-2, -1)) > SPREAD_LIMIT).flatten()  # [B * N]
    return z, z_end, z_prev, r, bad


def _log_space_weights(b, z, idx):
    """E[m, h, t, s, l] = exp(b_s - z_t) for s <= t, for the chunks in idx."""
    bs, zs = (x.flatten(0, 1).index_select(0, idx).transpose(1, 2) for x in (b, z))  # [M, H, C, L]
    C = bs.shape[2]
    diff = bs.unsqueeze(-3) - zs.unsqueeze(-2)  # [M, H, C(t), C(s), L]
    causal = torch.ones(C, C, dtype=torch.bool, device=b.device).tril()
    return diff.masked_fill(~causal[:, :, None], float("-inf")).exp()


def _overwrite(x, idx, values):
    """A copy of x [B, N, ...] whose chunks idx (flattened (b, n)) are values."""
    return x.flatten(0, 1).index_copy(0, idx, values).view_as(x)


class LatteChunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, b, v, S0, z0, C):
        B, TT, H, L = q.shape
        N, D = TT // C, v.shape[-1]
        z, z_end, z_prev, r, bad = _log_normalisers(b, z0, C)
        q, b, v = q.view(B, N, C, H, L), b.view(B, N, C, H, L), v.view(B, N, C, H, D)
        K = torch.einsum("bnchl,bnchd->bnhld", torch.exp(b - z_end.unsqueeze(2)), v)  # [B, N, H, L, D]
        g = torch.exp(z_prev - z_end).unsqueeze(-1)  # [B, N, H, L, 1] chunk decay
        S_all, S_last = _scan(K, g, S0, _SCAN_CHUNK)
        S_before = torch.cat([S0.unsqueeze(1), S_all[:, :-1]], 1)  # [B, N, H, L, D]
        y = torch.einsum("bnchl,bnhld->bnchd", q * torch.exp(z_prev.unsqueeze(2) - z), S_before)
        k_f = torch.exp((b - r).clamp(max=SPREAD_LIMIT))  # clamp: no-op where used
        w = torch.einsum("bnthl,bnshl->bnhts", q * torch.exp(r - z), k_f).tril_()  # [B, N, H, C, C]
        y += torch.einsum("bnhts,bnshd->bnthd", w, v)
        if bool(bad.any()):
            idx = bad.nonzero().squeeze(1)
            E = _log_space_weights(b, z, idx)  # [M, H, C, C, L]
            qs, vs = (x.flatten(0, 1).index_select(0, idx) for x in (q, v))
            w_bad = torch.einsum("mhtsl,mthl->mhts", E, qs)
            intra_bad = torch.einsum("mhts,mshd->mthd", w_bad, vs)
            inter_bad = torch.einsum("mthl,mhld->mthd", (q * torch.exp(z_prev.unsqueeze(2) - z)).flatten(0, 1)[idx],
                                     S_before.flatten(0, 1)[idx])
            y = _overwrite(y, idx, inter_bad + intra_bad)
        ctx.save_for_backward(q, b, v, S0, z0, S_before, S_last)
        ctx.C = C
        return y.reshape(B, TT, H, D), S_last, z_end[:, -1]

    @staticmethod
    def backward(ctx, dy, dS_last, dz_last):
        q, b, v, S0, z0, S_before, S_last = ctx.saved_tensors
        B, N, C, H, L = q.shape
        D = v.shape[-1]
        z, z_end, z_prev, r, bad = _log_normalisers(b.view(B, N * C, H, L), z0, C)
        dy = dy.reshape(B, N, C, H, D)
        dS_last = torch.zeros_like(S_last) if dS_last is None else dS_last
        dz_last = torch.zeros_like(z0) if dz_last is None else dz_last
        e_prev = torch.exp(z_prev.unsqueeze(2) - z)  # [B, N, C, H, L] decay since chunk start
        qz = torch.exp(r - z)
        k_f = torch.exp((b - r).clamp(max=SPREAD_LIMIT))
        M = torch.einsum("bnthd,bnshd->bnhts", dy, v).tril_()  # dy_t . v_s, s <= t
        # u = dy . Vbar: the gradient w.r.t. q
        u = torch.einsum("bnthd,bnhld->bnthl", dy, S_before) * e_prev
        u += qz * torch.einsum("bnhts,bnshl->bnthl", M, k_f)
        w = torch.einsum("bnthl,bnshl->bnhts", q * qz, k_f).tril_()
        dv = torch.einsum("bnhts,bnthd->bnshd", w, dy)
        if bool(bad.any()):
            idx = bad.nonzero().squeeze(1)
            E = _log_space_weights(b, z, idx)
            Ms = M.flatten(0, 1).index_select(0, idx)
            u_bad = torch.einsum("mthd,mhld->mthl", dy.flatten(0, 1)[idx], S_before.flatten(0, 1)[idx])
            u_bad = u_bad * e_prev.flatten(0, 1)[idx] + torch.einsum("mhtsl,mhts->mthl", E, Ms)
            u = _overwrite(u, idx, u_bad)
        qu = q * u
        tri = torch.ones(C, C, dtype=q.dtype, device=q.device).tril_()
        db = k_f * (torch.einsum("bnhts,bnthl->bnshl", M, q * qz) - torch.einsum("ts,bnthl->bnshl", tri, qz * qu))
        if bool(bad.any()):
            qs, dys = q.flatten(0, 1)[idx], dy.flatten(0, 1)[idx]
            w_bad = torch.einsum("mhtsl,mthl->mhts", E, qs)
            dv = _overwrite(dv, idx, torch.einsum("mhts,mthd->mshd", w_bad, dys))
            db_bad = torch.einsum("mhtsl,mthl,mhts->mshl", E, qs, Ms) - torch.einsum("mhtsl,mthl->mshl", E, qu.flatten(0, 1)[idx])
            db = _overwrite(db, idx, db_bad)
        # reverse states over chunks: R_{n-1} = g_n R_n + (local sum over chunk n)
        g = torch.exp(z_prev - z_end)  # [B, N, H, L]
        Lv = torch.einsum("bnchl,bnchd->bnhld", q * e_prev, dy)
        Lq = (e_prev * qu).sum(2)
        Rq_last = (dS_last * S_last).sum(-1) - dz_last
        R, R_first = _scan(torch.cat([Lv, Lq.unsqueeze(-1)], -1).flip(1), g.flip(1).unsqueeze(-1),
                           torch.cat([dS_last, Rq_last.unsqueeze(-1)], -1), _SCAN_CHUNK)
        R = R.flip(1)  # R[:, n] = reverse state before chunk n (normalised at z_prev_n)
        R_after = torch.cat([R[:, 1:], torch.cat([dS_last, Rq_last.unsqueeze(-1)], -1).unsqueeze(1)], 1)
        Rv, Rq = R_after[..., :D], R_after[..., D]  # [B, N, H, L, D], [B, N, H, L]
        k_end = torch.exp(b - z_end.unsqueeze(2))  # [B, N, C, H, L]
        dv += torch.einsum("bnshl,bnhld->bnshd", k_end, Rv)
        db += k_end * (torch.einsum("bnshd,bnhld->bnshl", v, Rv) - Rq.unsqueeze(2))
        dS0 = R_first[..., :D]
        dz0 = (S0 * dS0).sum(-1) - R_first[..., D]
        TT = N * C
        return u.reshape(B, TT, H, L), db.reshape(B, TT, H, L), dv.reshape(B, TT, H, D), dS0, dz0, None
