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
  factors <= 1: a rank-L product, one batched matmul per query sub-chunk i;
- s in t's own sub-chunk: straight from log space, one offset d = t - s at
  a time (strided views of the sub-chunks, c (c + 1) / 2 pairs per
  sub-chunk: the upper triangle is never computed).
Every exponent is clamped to [floor, 0] before exp (_exp.py): the cost of
exp then does not depend on the logits, and a weight below exp(floor) is off
by at most exp(floor). Nothing here branches on values.

z itself is exact in log space: a running max m_t inside the chunk and
a_t = sum_{s<=t} exp(b_s - m_t) in [1, C] by the recurrence
a_t = a_{t-1} exp(m_{t-1} - m_t) + exp(b_t - m_t) (a C-step loop over the
chunk positions, vectorised over chunks, rows and latents); then
z_t = logaddexp(z_prev, m_t + log a_t) with z_prev carried across chunks.
"""

from __future__ import annotations

import torch

from ._exp import exp_nonpositive_ as exp_
from ._exp import logaddexp

# Sub-chunk size: the diagonal blocks cost about T c L / 2 elementwise work,
# the off-diagonal factors about T C L / 2.
SUB_CHUNK = 8


def sub_chunk_size(chunk_size: int) -> int:
    return min(SUB_CHUNK, chunk_size)


def padded_chunk_size(chunk_size: int) -> int:
    """The kernel's chunk: chunk_size rounded up to a multiple of the sub-chunk."""
    c = sub_chunk_size(chunk_size)
    return -(-chunk_size // c) * c


def log_normalisers(b: torch.Tensor, z0: torch.Tensor):
    """b [n, G, C, L] (contiguous), z0 [G, L] the log-normaliser before the
    chunks (-inf: empty). Returns z [n, G, C, L] (z_t, token t included),
    z_prev [n, G, 1, L] (before each chunk) and z_last [G, L] (after them)."""
    C = b.shape[2]
    m = torch.cummax(b, 2).values  # running max inside the chunk
    x = exp_(b - m)  # exp(b_t - m_t), 1 at the running max
    d = exp_(m[:, :, :-1] - m[:, :, 1:])  # exp(m_{t-1} - m_t)
    a = torch.empty_like(x)
    a[:, :, 0] = x[:, :, 0]
    for t in range(1, C):  # a_t = a_{t-1} d_t + x_t, in [1, t + 1]
        torch.addcmul(x[:, :, t], d[:, :, t - 1], a[:, :, t - 1], out=a[:, :, t])
    local = a.log_().add_(m)  # logsumexp of the chunk's logits up to t
    ends = torch.logcumsumexp(torch.cat([z0.unsqueeze(0), local[:, :, -1]]), 0)  # [n + 1, G, L]
    z_prev = ends[:-1].unsqueeze(2)
    return logaddexp(local, z_prev), z_prev, ends[-1]


def sub_chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """[n, G, C, ...] -> [n, G, J, c, ...] (a view)."""
    return x.view(*x.shape[:2], x.shape[2] // c, c, *x.shape[3:])


def block_diagonals(x: torch.Tensor, c: int, d: int) -> torch.Tensor:
    """Entries (t, t - d) of the J diagonal c x c blocks of x [n, G, C, C]:
    a view [n, G, J, c - d] (t from d to c - 1 inside each sub-chunk)."""
    n, G, C, _ = x.shape
    blocks = x.view(n, G, C // c, c, C // c, c).diagonal(0, 2, 4)  # [n, G, c(t), c(s), J]
    return blocks.diagonal(-d, 2, 3)


def diagonal_weights(b: torch.Tensor, z: torch.Tensor, c: int, d: int) -> torch.Tensor:
    """W [n, G, J, c - d, L] = exp(b_s - z_t) for the pairs s = t - d inside
    one sub-chunk (t from d to c - 1)."""
    return exp_(sub_chunks(b, c)[:, :, :, :c - d] - sub_chunks(z, c)[:, :, :, d:])


def queries(x: torch.Tensor, c: int, d: int) -> torch.Tensor:
    """The rows t of the pairs (t, t - d): a view [n, G, J, c - d, .] of x [n, G, C, .]."""
    return sub_chunks(x, c)[:, :, :, d:]


def keys(x: torch.Tensor, c: int, d: int) -> torch.Tensor:
    """The rows s = t - d of the pairs: a view [n, G, J, c - d, .] of x [n, G, C, .]."""
    return sub_chunks(x, c)[:, :, :, :c - d]


def reference(z: torch.Tensor, c: int, i: int) -> torch.Tensor:
    """r_i = z at the end of sub-chunk i - 1: [n, G, 1, L]."""
    return z[:, :, i * c - 1:i * c]


def query_factors(z: torch.Tensor, r: torch.Tensor, c: int, i: int) -> torch.Tensor:
    """exp(r_i - z_t) for the queries t of sub-chunk i: [n, G, c, L]."""
    return exp_(r - z[:, :, i * c:(i + 1) * c])


def key_factors(b: torch.Tensor, r: torch.Tensor, c: int, i: int) -> torch.Tensor:
    """exp(b_s - r_i) for the keys s < ic before sub-chunk i: [n, G, ic, L]."""
    return exp_(b[:, :, :i * c] - r)
