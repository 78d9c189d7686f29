"""The sliding-window softmax kernel: WindowTiles (docs/math.md §4, the l = 0 state).

Legend: N query blocks of Q tokens, c + 1 key tiles of Q seen by each block,
X = B * K rows (batch x KV heads), G query heads per KV head, E query/key
width, D value width, P = W - 1 earlier tokens in the window.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ..layout import without_autocast

# One segment's score tensor holds about this many floats (16 MB), as in the
# chunked Latte kernel.
_SEGMENT_ELEMS = 1 << 22

# exp() on CPU leaves its vectorised path for arguments whose result is
# subnormal or zero (below about -87.3 in float32): such lanes cost ~20-150x
# more, and a window block has a third of its scores masked to -inf. The
# arguments are therefore clamped to this floor and masked entries zeroed
# after the exp; an unmasked weight below exp(floor) (relative to the row's
# largest) is then off by at most exp(floor).
_EXP_FLOOR = {torch.float64: -700.0}


def _by_head(p):
    """Scores [c+1, n, X, G*Q, Q] viewed as [c+1, n, X, G, Q, Q] (rows (g, r)),
    so that masks broadcast over the G query heads of a KV head."""
    Q = p.shape[-1]
    return p.view(*p.shape[:3], -1, Q, Q)


def _apply(x, band, per_key, op):
    """x <op>= band, then <op>= per_key (if any) except on the own-key entries
    (query r, key r of the last tile), which a query always keeps."""
    x6 = _by_head(x)
    op(x6, band)
    if per_key is not None:
        own = torch.diagonal(x6[-1], dim1=-2, dim2=-1)  # [n, X, G, Q] view
        saved = own.clone()
        op(x6, per_key)
        own.copy_(saved)
    return x


def _masked_exp_(p, shift, masks):
    """exp(p - shift) in place, exactly 0 for the keys a query must not see
    (the upper clamp keeps an unmasked hidden score from overflowing to inf,
    which the mask would turn into NaN)."""
    floor = _EXP_FLOOR.get(p.dtype, -80.0)
    p.sub_(shift).clamp_(min=floor, max=-floor).exp_()
    return _apply(p, masks.keep, masks.key_keep, torch.Tensor.mul_)


class _Masks(NamedTuple):
    """Float masks broadcast against _by_head(scores): 1 / 0 to multiply and
    0 / -inf (band) or 0 / -1e30 (padded keys) to add."""

    keep: torch.Tensor  # [c+1, 1, 1, 1, Q(r), Q(j)] the window band
    bias: torch.Tensor
    key_keep: torch.Tensor | None  # [c+1, n, X, 1, 1, Q(j)] padded keys, if any
    key_bias: torch.Tensor | None


def _visible(key_ok, K, P, c, n0, n1, masked):
    """Which keys query r of block n sees in tile n + m: the band of the window
    (the same for every block) and, only where a key of the segment can be
    padding, a per-key mask; a query always sees its own key. Both are small
    next to the scores: a float multiply / add by them is ~10x faster than
    masked_fill_ with a full-size boolean on CPU. key_ok [B, N + c, Q].
    Whether a segment needs the per-key mask follows from the call alone
    (never from the values, so the work is the same for any input): always
    with a token mask (`masked`), else only blocks n < c, which see cached
    slots (empty ones are masked)."""
    B, _, Q = key_ok.shape
    dev = key_ok.device
    m = torch.arange(c + 1, device=dev)[:, None, None]
    r = torch.arange(Q, device=dev)[:, None]
    j = torch.arange(Q, device=dev)[None, :]
    d = m * Q + j - c * Q - r  # key position - query position: [c+1, Q, Q]
    band = ((d >= -P) & (d <= 0)).view(c + 1, 1, 1, 1, Q, Q)
    zero = torch.zeros((), device=dev)
    key_keep = key_bias = None
    if masked or n0 < c:
        ok = key_ok.unfold(1, c + 1, 1)[:, n0:n1]  # [B, n, Q(j), c+1]: key j of tile n + m
        ok = ok.permute(3, 1, 0, 2)[:, :, :, None].expand(-1, -1, -1, K, -1).reshape(c + 1, n1 - n0, B * K, 1, 1, Q)
        key_keep, key_bias = ok.float(), torch.where(ok, zero, -1e30)
    return _Masks(band.float(), torch.where(band, zero, float("-inf")), key_keep, key_bias)


def _segments(N, per_block):
    """Block ranges [n0, n1) whose scores hold about _SEGMENT_ELEMS floats."""
    step = max(1, _SEGMENT_ELEMS // per_block)
    return [(n0, min(N, n0 + step)) for n0 in range(0, N, step)]


def _flat(x):
    return x.flatten(0, 1)


def _tile_products(a, tiles, n0, out):
    """out[m] = a @ tiles[n0 + m]^T for every tile offset m: a [n, X, R, E],
    tiles [N + c, X, Q, E] -> out [c+1, n, X, R, Q] (contiguous, so each
    out[m] is a plain bmm target)."""
    n = a.shape[0]
    for m in range(out.shape[0]):
        torch.bmm(_flat(a), _flat(tiles[n0 + m : n0 + m + n]).transpose(1, 2), out=_flat(out[m]))
    return out


class WindowTiles(torch.autograd.Function):
    """Blocked window softmax with recomputation (the FlashAttention recipe
    at block granularity): only q, k, v, y and lse are saved; each segment's
    probabilities are rebuilt in the backward.

    Queries are cut into blocks of Q, keys into tiles of Q; block n sees tiles
    n .. n + c (c = ceil(P / Q), the keys padded in front to c * Q cached
    slots). Block-major and tile-major layouts with the KV head inner
    (q [N, X, G*Q, E], k [N + c, X, Q, E], v [N + c, X, Q, D], X = B * K)
    make every product a bmm on contiguous slabs, and the key gradients
    accumulate into their tiles in place (no overlapping blocks are built).
    (q, k, v, key_ok [B, N + c, Q], K, P, scale, masked, softcap) -> (y [N, X, G*Q, D], lse [N, X, G*Q]);
    masked: whether keys after the cache can be padding (a token mask was given).
    Gradient of a row with p = softmax(s):  ds = p (dy v^T - dy . y + dlse).
    softcap (None or c > 0): scores c * tanh(s / c) as in Gemma 2, whose
    derivative 1 - tanh^2 multiplies ds.
    """

    @staticmethod
    @without_autocast
    def forward(ctx, q, k, v, key_ok, K, P, scale, masked, softcap=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        N, X, GQ, _ = q.shape
        c, Q = k.shape[0] - N, k.shape[2]
        segments = _segments(N, (c + 1) * X * GQ * Q)
        y = v.new_empty(N, X, GQ, v.shape[-1])
        lse = q.new_empty(N, X, GQ)
        for n0, n1 in segments:
            masks = _visible(key_ok, K, P, c, n0, n1, masked)
            s = _tile_products(q[n0:n1], k, n0, q.new_empty(c + 1, n1 - n0, X, GQ, Q)).mul_(scale)
            if softcap is not None:
                s.div_(softcap).tanh_().mul_(softcap)
            _apply(s, masks.bias, masks.key_bias, torch.Tensor.add_)
            m = s.amax((0, 4), keepdim=True)  # finite: every row sees its own key
            p = _masked_exp_(s, m, masks)
            total = p.sum((0, 4), keepdim=True)
            lse[n0:n1] = (m + total.log())[0, ..., 0]
            p.div_(total)
            out = _flat(y[n0:n1])
            torch.bmm(_flat(p[0]), _flat(v[n0:n1]), out=out)
            for i in range(1, c + 1):
                out.baddbmm_(_flat(p[i]), _flat(v[n0 + i : n1 + i]))
        ctx.save_for_backward(q, k, v, key_ok, y, lse)
        ctx.K, ctx.P, ctx.scale, ctx.segments, ctx.masked, ctx.softcap = K, P, scale, segments, masked, softcap
        return y, lse

    @staticmethod
    @once_differentiable
    @without_autocast
    def backward(ctx, dy, dlse):
        q, k, v, key_ok, y, lse = ctx.saved_tensors
        K, P, scale, masked, softcap = ctx.K, ctx.P, ctx.scale, ctx.masked, ctx.softcap
        N, X, GQ, _ = q.shape
        c, Q = k.shape[0] - N, k.shape[2]
        dy = dy.contiguous()  # autograd materialises unused output gradients as zeros
        row = (dy * y).sum(-1).sub_(dlse)  # [N, X, G*Q]
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for n0, n1 in ctx.segments:
            masks = _visible(key_ok, K, P, c, n0, n1, masked)
            p = _tile_products(q[n0:n1], k, n0, q.new_empty(c + 1, n1 - n0, X, GQ, Q)).mul_(scale)
            dcap = None
            if softcap is not None:  # p holds tanh(s / c) until the exp
                p.div_(softcap).tanh_()
                dcap = 1 - p * p
                p.mul_(softcap)
            _masked_exp_(p, lse[None, n0:n1, ..., None], masks)
            ds = _tile_products(dy[n0:n1], v, n0, torch.empty_like(p))  # dy . v
            ds.sub_(row[None, n0:n1, ..., None]).mul_(p).mul_(scale)
            if dcap is not None:
                ds.mul_(dcap)
            dq_seg, dy_seg, q_seg = _flat(dq[n0:n1]), _flat(dy[n0:n1]), _flat(q[n0:n1])
            torch.bmm(_flat(ds[0]), _flat(k[n0:n1]), out=dq_seg)
            for i in range(c + 1):
                tile = slice(n0 + i, n1 + i)  # tiles seen at offset i; their gradients accumulate in place
                _flat(dv[tile]).baddbmm_(_flat(p[i]).transpose(1, 2), dy_seg)
                _flat(dk[tile]).baddbmm_(_flat(ds[i]).transpose(1, 2), q_seg)
                if i:
                    dq_seg.baddbmm_(_flat(ds[i]), _flat(k[tile]))
        return dq, dk, dv, None, None, None, None, None, None
