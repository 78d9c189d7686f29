"""Inside the chunks of causal Latte: log-normalisers and intra-chunk weights
(docs/math.md §3.2).

Legend: n chunks (of one segment), G = batch x heads, C chunk size (t: query,
s: key position in a chunk), c sub-chunk size, J = C / c sub-chunks per chunk
(i: the query's sub-chunk), d = t - s the offset inside a sub-chunk, L
latents, D value width. Tensors are chunk-major [n, G, C, .]; sub-chunk views
are [n, G, J, c, .].

The intra-chunk weight of key s for query t (s <= t) and latent l is
W[t, s, l] = exp(b_s - z_t)_l <= 1. It is never a product of exponentials
that can overflow, and never relies on a chunk-wide reference that the
logits can outrun (the cause of the old whole-chunk fallback):
- s in an earlier sub-chunk than t: with r_i = z at the end of the sub-chunk
  before t's (z only grows), W = exp(r_i - z_t) * exp(b_s - r_i), both
  factors <= 1: a rank-L product, one batched matmul per query sub-chunk i.
  The key factor is exp(b_s - e_j) * exp(e_j - r_i) with e_j the end of s's
  own sub-chunk: one exponential per key, times a small [J, J] table;
- s in t's own sub-chunk: straight from log space, one offset d = t - s at
  a time (strided views of the sub-chunks, c (c + 1) / 2 pairs per
  sub-chunk: the upper triangle is never computed).
The kernel takes lq = log softmax(a) and folds it into the query-side
exponents: q_t W[t, s] = exp(lq_t - z_t + b_s), one exponential per pair.
Every exponent is clamped to [floor, 0] before exp (_exp.py): the cost of
exp then does not depend on the logits, and a weight below exp(floor) is off
by at most exp(floor). Nothing here branches on values.

z itself is exact in log space. Inside each sub-chunk, with the running max
m_t, a_t = sum_{s<=t} exp(b_s - m_t) lies in [1, c] and follows
a_t = a_{t-1} exp(m_{t-1} - m_t) + exp(b_t - m_t): a c-step loop over the
sub-chunk positions, vectorised over everything else. The same prefix
logsumexp chains the sub-chunks of a chunk; a logcumsumexp over the chunk
totals (1/C of the elements) chains the chunks, and z_t =
logaddexp(z before t's sub-chunk, m_t + log a_t).
"""

from __future__ import annotations

import torch

from ._exp import exp_nonpositive_, logaddexp

# Sub-chunk size. The diagonal blocks cost about T (c + 1) / 2 L elementwise
# work, the off-diagonal ones a matmul per sub-chunk; on the 2-core CPU 8
# was as fast as 4 and faster than 16 (chunks of 16, 32 and 64).
SUB_CHUNK = 8


def sub_chunk_size(chunk_size: int) -> int:
    return min(SUB_CHUNK, chunk_size)


def padded_chunk_size(chunk_size: int) -> int:
    """The kernel's chunk: chunk_size rounded up to a multiple of the sub-chunk."""
    c = sub_chunk_size(chunk_size)
    return -(-chunk_size // c) * c


def _running_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """cummax(x, dim).values, a step at a time along a short dim (torch.cummax
    is a scalar scan that also builds indices: ~10x slower here)."""
    m = x.clone()
    steps = m.unbind(dim)  # views: one op for all of them
    for t in range(1, len(steps)):
        steps[t].clamp_(min=steps[t - 1])
    return m


def _prefix_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp of x over positions <= t along dim, exactly: with the
    running max m_t, a_t = sum_{s<=t} exp(x_s - m_t) lies in [1, t + 1] and
    follows a_t = a_{t-1} exp(m_{t-1} - m_t) + exp(x_t - m_t) (a loop over
    dim, vectorised over everything else). x finite."""
    n = x.shape[dim]
    m = _running_max(x, dim)
    a = exp_nonpositive_(x - m)  # exp(x_t - m_t), 1 at the running max
    dec = exp_nonpositive_(m.narrow(dim, 0, n - 1) - m.narrow(dim, 1, n - 1))  # exp(m_{t-1} - m_t)
    a_t, dec_t = a.unbind(dim), dec.unbind(dim)
    for t in range(1, n):
        a_t[t].addcmul_(dec_t[t - 1], a_t[t - 1])
    return a.log_().add_(m)


def log_normalisers(b: torch.Tensor, z0: torch.Tensor, c: int, z: torch.Tensor):
    """The log-normalisers of b [n, G, C, L] (contiguous) after z0 [G, L]
    (-inf: empty): writes z_t (token t included) into z [n, G, C, L] and
    returns r [n, G, J, L], z before each sub-chunk, and z_last [G, L].
    Prefix logsumexps inside each sub-chunk (c steps), then over the
    sub-chunk totals of each chunk (J steps), then over the chunk totals
    (logcumsumexp of 1/C of the elements), combined with logaddexp."""
    n, G, C, L = b.shape
    local = _prefix_logsumexp(sub_chunks(b, c), 3)  # [n, G, J, c, L] inside the sub-chunk
    within = _prefix_logsumexp(local[:, :, :, -1], 2)  # [n, G, J, L] sub-chunks 0..j of the chunk
    chain = torch.logcumsumexp(torch.cat([z0.unsqueeze(0), within[:, :, -1]]), 0)  # [n + 1, G, L]
    z_prev = chain[:-1].unsqueeze(2)  # [n, G, 1, L]
    r = torch.cat([z_prev, logaddexp(within[:, :, :-1], z_prev)], 2)  # [n, G, J, L]
    # z = logaddexp(local, r) in place, the smaller term's exponent clamped (_exp.py)
    zs, rs = sub_chunks(z, c), r.unsqueeze(3)
    torch.maximum(local, rs, out=zs)
    zs.add_(exp_nonpositive_(torch.minimum(local, rs, out=local).sub_(zs)).log1p_())
    return r, chain[-1]


def sub_chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """[n, G, C, ...] -> [n, G, J, c, ...] (a view)."""
    return x.view(*x.shape[:2], x.shape[2] // c, c, *x.shape[3:])


def diagonal_blocks(x: torch.Tensor, c: int) -> torch.Tensor:
    """The J diagonal c x c blocks of x [n, G, C, C] as a view [n, G, c(t),
    c(s), J]; .diagonal(-d, 2, 3) of it holds the pairs (t, t - d)."""
    n, G, C, _ = x.shape
    return x.view(n, G, C // c, c, C // c, c).diagonal(0, 2, 4)


def queries(xs: torch.Tensor, d: int) -> torch.Tensor:
    """The rows t of the pairs (t, t - d) in a sub-chunk view xs [n, G, J, c, .]."""
    return xs.narrow(3, d, xs.shape[3] - d)


def keys(xs: torch.Tensor, d: int) -> torch.Tensor:
    """The rows s = t - d of the pairs in a sub-chunk view xs [n, G, J, c, .]."""
    return xs.narrow(3, 0, xs.shape[3] - d)


def diagonal_weights(lqz_s: torch.Tensor, b_s: torch.Tensor, d: int) -> torch.Tensor:
    """P [n, G, J, c - d, L] = q_t exp(b_s - z_t) = exp(lq_t - z_t + b_s) for
    the pairs s = t - d inside one sub-chunk, from the sub-chunk views of
    lqz = lq - z and b."""
    return exp_nonpositive_(queries(lqz_s, d) + keys(b_s, d))


def suffix_sums(x: torch.Tensor, b: torch.Tensor, z: torch.Tensor):
    """For x [n, G, C, L]: rho_s = sum_{t >= s in the chunk} exp(z_s - z_t) x_t
    by the reverse recurrence rho_s = x_s + exp(z_s - z_{s+1}) rho_{s+1}
    (every factor <= 1; a loop over the C positions, vectorised over the
    rest). Returns sum_{t >= s} exp(b_s - z_t) x_t = exp(b_s - z_s) rho_s
    [n, G, C, L] and rho_0 [n, G, 1, L]."""
    decay = exp_nonpositive_(z[:, :, :-1] - z[:, :, 1:])  # exp(z_s - z_{s+1})
    rho = x.clone()
    rho_s, decay_s = rho.unbind(2), decay.unbind(2)
    for s in range(len(rho_s) - 2, -1, -1):
        rho_s[s].addcmul_(decay_s[s], rho_s[s + 1])
    return exp_nonpositive_(b - z).mul_(rho), rho[:, :, :1]


def sub_chunk_ends(z: torch.Tensor, c: int) -> torch.Tensor:
    """z at the last token of each sub-chunk: [n, G, J, L] (a view). The
    reference of query sub-chunk i is the end of sub-chunk i - 1."""
    return z[:, :, c - 1 :: c]


def query_factors(x: torch.Tensor, ends: torch.Tensor, c: int, i: int) -> torch.Tensor:
    """exp(r_i + x_t) for the queries t of sub-chunk i: [n, G, c, L]. With
    x = lq - z: q_t exp(r_i - z_t) (<= 1, r_i <= z_t)."""
    return exp_nonpositive_(x[:, :, i * c : (i + 1) * c] + ends[:, :, i - 1 : i])


def key_factors(b: torch.Tensor, ends: torch.Tensor, c: int) -> torch.Tensor:
    """exp(b_s - z at the end of s's sub-chunk): [n, G, C, L], one per key."""
    return exp_nonpositive_(sub_chunks(b, c) - ends.unsqueeze(3)).view(b.shape)


def key_factors_for(kf: torch.Tensor, ends: torch.Tensor, c: int, i: int) -> torch.Tensor:
    """exp(b_s - r_i) for the keys s < ic: the key factor times
    exp(end of s's sub-chunk - r_i), two factors <= 1 (each >= exp(floor),
    so the product is a normal float): [n, G, ic, L]."""
    n, G, _, L = kf.shape
    ratio = exp_nonpositive_(ends[:, :, :i] - ends[:, :, i - 1 : i])  # [n, G, i, L]
    return (sub_chunks(kf, c)[:, :, :i] * ratio.unsqueeze(3)).view(n, G, i * c, L)
