"""Inside the chunks of causal Latte: log-normalisers and the sub-chunk
diagonal blocks (docs/math.md §3.2).

Legend: M sub-chunks (of one segment), G = batch x heads, c sub-chunk size,
J sub-chunks per chunk (n = M / J chunks), d = t - s the offset of a query t
and a key s inside one sub-chunk, L latents, D value width. Tensors are
sub-chunk-major [M, G, c, .] (chunked.py).

Everything here is in base 2 (chunked.py scales the logits by log2(e) once):
z_t = log2 sum_{s<=t} 2^(b_s), and weights are 2^(exponent <= 0) (_exp.py).

The weight of key s for query t (s <= t) and latent l is
W[t, s, l] = 2^(b_s - z_t) <= 1. chunked.py takes every pair whose key lies
in an earlier sub-chunk through the states between sub-chunks (two factors
<= 1 around the normaliser at the sub-chunk boundary). The pairs inside one
sub-chunk (the diagonal blocks, c x c) are built here straight from log
space, one offset d at a time (strided views of the sub-chunks, c (c + 1) / 2
pairs per sub-chunk: the upper triangle is never computed), with
lq = log2 softmax(a) folded into the exponent: q_t W[t, s] = 2^(lq_t - z_t +
b_s), one exp2 per pair. Every exponent is clamped to [floor, 0] before
exp2 (_exp.py): the cost of exp2 then does not depend on the logits, and a
weight below 2^floor is off by at most that much. Nothing here branches on
values.

z itself is exact in log space. Each sub-chunk's total is a log-sum-exp
around its max; a prefix log-sum-exp over the totals (J steps) chains the
sub-chunks of a chunk, a logcumsumexp over the chunk totals chains the
chunks, giving r, z before each sub-chunk. Inside a sub-chunk, with the
running max m_t of r and the logits so far, a_t = 2^(r - m_t) +
sum_{s<=t} 2^(b_s - m_t) lies in [1, c + 1] and follows a_t = a_{t-1}
2^(m_{t-1} - m_t) + 2^(b_t - m_t): a c-step loop over the sub-chunk
positions, vectorised over everything else, and z_t = m_t + log2 a_t.
"""

from __future__ import annotations

import functools
import math

import torch

from .._exp import LOG2E, exp2_nonpositive_

# Sub-chunk size. The diagonal blocks cost about T (c + 1) / 2 L exp2s, the
# states between sub-chunks T / c (L x D); 8 balances the two at the
# research-sweep shape (L = D = 32) on the 2-core CPU.
SUB_CHUNK = 8


def chunk_layout(chunk_size: int) -> tuple[int, int]:
    """(c, J): the sub-chunk size and the sub-chunks per chunk; the kernel's
    chunk is J * c, chunk_size rounded up to a multiple of the sub-chunk."""
    c = min(SUB_CHUNK, chunk_size)
    return c, -(-chunk_size // c)


def _prefix_logsumexp2(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log2 sum 2^x over positions <= t along a short dim, exactly: with the
    running max m_t, a_t = sum_{s<=t} 2^(x_s - m_t) lies in [1, t + 1] and
    follows a_t = a_{t-1} 2^(m_{t-1} - m_t) + 2^(x_t - m_t) (a loop over dim,
    vectorised over everything else; torch.cummax and logcumsumexp are scalar
    scans, ~10x slower here). x finite."""
    n = x.shape[dim]
    m = x.clone()
    ms = m.unbind(dim)  # views: one op for all of them
    for t in range(1, n):
        ms[t].clamp_(min=ms[t - 1])
    a = exp2_nonpositive_(x - m)  # 2^(x_t - m_t), 1 at the running max
    dec = exp2_nonpositive_(m.narrow(dim, 0, n - 1) - m.narrow(dim, 1, n - 1))  # 2^(m_{t-1} - m_t)
    a_t, dec_t = a.unbind(dim), dec.unbind(dim)
    for t in range(1, n):
        a_t[t].addcmul_(dec_t[t - 1], a_t[t - 1])
    return a.log2_().add_(m)


def _logaddexp2_(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """log2(2^hi + 2^lo) written into hi, given hi >= lo (lo is overwritten);
    the smaller term's exponent clamped (_exp.py)."""
    return hi.add_(exp2_nonpositive_(lo.sub_(hi)).log1p_(), alpha=LOG2E)


def _sub_chunk_totals(b: torch.Tensor) -> torch.Tensor:
    """log2 sum_{s in m} 2^(b_s) for b [M, G, c, L]: [M, G, L]."""
    mx = b.amax(2)
    return exp2_nonpositive_(b - mx.unsqueeze(2)).sum(2).log2_().add_(mx)


def _prefix_from(b: torch.Tensor, r: torch.Tensor, z: torch.Tensor) -> None:
    """z_t = log2(2^r + sum_{s<=t in the sub-chunk} 2^(b_s)) into z
    [M, G, c, L], with r [M, G, L] the normaliser before each sub-chunk (the
    prefix log-sum-exp of _prefix_logsumexp2 with r as a first position)."""
    c = b.shape[2]
    ms = z.copy_(b).unbind(2)  # z holds the running max m_t first (in place: no strided out=, for torch.compile)
    ms[0].clamp_(min=r)
    for t in range(1, c):
        ms[t].clamp_(min=ms[t - 1])
    a = exp2_nonpositive_(b - z)  # 2^(b_t - m_t)
    first = exp2_nonpositive_(r - ms[0])  # 2^(r - m_0): the mass before the sub-chunk
    dec = exp2_nonpositive_(z[:, :, :-1] - z[:, :, 1:])  # 2^(m_{t-1} - m_t)
    a_t, dec_t = a.unbind(2), dec.unbind(2)
    a_t[0].add_(first)
    for t in range(1, c):
        a_t[t].addcmul_(dec_t[t - 1], a_t[t - 1])
    z.add_(a.log2_())


def log_normalisers(b: torch.Tensor, z0: torch.Tensor, J: int, z: torch.Tensor):
    """The base-2 log-normalisers of b [M, G, c, L] (contiguous, base 2)
    after z0 [G, L] (-inf: empty), chunks of J sub-chunks: writes z_t (token
    t included) into z [M, G, c, L] and returns r [M, G, L], z before each
    sub-chunk, and z_last [G, L]. Each sub-chunk's total, their prefix
    log-sum-exps inside each chunk (J steps), a logcumsumexp over the chunk
    totals (1/(J c) of the elements), then the prefix inside each sub-chunk
    from r (c steps)."""
    M, G, c, L = b.shape
    within = _prefix_logsumexp2(_sub_chunk_totals(b).view(M // J, J, G, L), 1)  # sub-chunks 0..j of the chunk
    totals = torch.cat([z0.unsqueeze(0), within[:, -1]]).mul_(math.log(2.0))  # in nats for logcumsumexp
    chain = torch.logcumsumexp(totals, 0).mul_(LOG2E)  # [n + 1, G, L] z before each chunk, and the last z
    z_prev = chain[:-1].unsqueeze(1)  # [n, 1, G, L]
    w = within[:, :-1]
    r = torch.cat([z_prev, _logaddexp2_(torch.maximum(w, z_prev), torch.minimum(w, z_prev))], 1).view(M, G, L)
    _prefix_from(b, r, z)
    return r, chain[-1]


def queries(x: torch.Tensor, d: int) -> torch.Tensor:
    """The rows t of the pairs (t, t - d) in x [M, G, c, .]."""
    return x.narrow(2, d, x.shape[2] - d)


def keys(x: torch.Tensor, d: int) -> torch.Tensor:
    """The rows s = t - d of the pairs in x [M, G, c, .]."""
    return x.narrow(2, 0, x.shape[2] - d)


def diagonal_weights(lqz: torch.Tensor, b: torch.Tensor, d: int) -> torch.Tensor:
    """P [M, G, c - d, L] = q_t W[t, t - d] = 2^(lq_t - z_t + b_{t-d}) for
    the pairs at offset d inside each sub-chunk, from lqz = lq - z and b."""
    return exp2_nonpositive_(queries(lqz, d) + keys(b, d))


def _pair_list(c: int) -> list[int]:
    return [t * c + t - d for d in range(c) for t in range(d, c)]


@functools.cache
def _cached_pair_index(c: int, device: torch.device) -> torch.Tensor:
    return torch.tensor(_pair_list(c), device=device)


def _pair_index(c: int, device) -> torch.Tensor:
    """Flat positions t * c + s of the pairs (t, s = t - d) in a c x c block,
    offset-major: d = 0 .. c - 1, then t = d .. c - 1. Built once per (c,
    device) in eager mode (no host-to-device copy per call); a compiled graph
    holds it as a constant."""
    if torch.compiler.is_compiling():
        return torch.tensor(_pair_list(c), device=device)
    return _cached_pair_index(c, torch.device(device))


def _blocks(sums: list[torch.Tensor], c: int) -> torch.Tensor:
    """The per-offset pair sums [M, G, c - d] -> lower-triangular blocks
    [M, G, c, c] in one scatter (instead of a copy per diagonal)."""
    flat = torch.cat(sums, -1)  # [M, G, c (c + 1) / 2]
    A = flat.new_zeros(*flat.shape[:2], c * c)
    return A.index_copy_(2, _pair_index(c, flat.device), flat).view(*flat.shape[:2], c, c)


def diagonal_blocks(lqz: torch.Tensor, b: torch.Tensor):
    """The diagonal blocks A[t, s] = sum_l q_tl W[t, s, l] (s <= t in one
    sub-chunk, 0 above): [M, G, c(t), c(s)], and the weights of each offset
    d, P_d [M, G, c - d, L] (the backward may keep them)."""
    c = lqz.shape[2]
    P = [diagonal_weights(lqz, b, d) for d in range(c)]
    return _blocks([x.sum(-1) for x in P], c), P


def diagonal_backward(lqz, b, M, qu, kept=None):
    """The backward's diagonal blocks: returns A (as diagonal_blocks) and
    adds to qu [M, G, c, L] (q_t times dy_t . Vbar_t) the pairs' share,
    sum_s P[t, s] M[t, s]. M [M, G, c, c]: dy_t . v_s. Also returns each
    offset's (P, M) for diagonal_key_grads. kept: (A, [P_d]) from the
    forward, used instead of rebuilding them."""
    c = lqz.shape[2]
    Ms = M.flatten(2).index_select(2, _pair_index(c, M.device)).unsqueeze(-1).split(list(range(c, 0, -1)), 2)
    A, P = kept if kept is not None else (None, [diagonal_weights(lqz, b, d) for d in range(c)])
    for d in range(c):
        queries(qu, d).addcmul_(P[d], Ms[d])  # Ms[d]: [M, G, c - d, 1]
    if A is None:
        A = _blocks([x.sum(-1) for x in P], c)
    return A, list(zip(P, Ms))


def diagonal_key_grads(pairs, u: torch.Tensor, db: torch.Tensor) -> None:
    """db += the pairs' share of the key-logit gradient,
    sum_t W[t, s] (q_t (dy_t . v_s) - qu_t) = sum_t P[t, s] (M[t, s] - u_t)
    with u = qu / q = dy_t . Vbar_t [M, G, c, L] (docs/math.md §3.2)."""
    for d, (P, Md) in enumerate(pairs):
        keys(db, d).addcmul_(P, Md - queries(u, d))
