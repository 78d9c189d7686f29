"""The chunked causal Latte kernel with an analytic backward (docs/math.md §3.2).

Legend: M sub-chunks (of one segment), G = batch x heads, c sub-chunk size
(t: query, s: key position in a sub-chunk), J sub-chunks per chunk, n = M / J
chunks, L latents, D value width. Tensors are sub-chunk-major, [M, G, c, .]:
a segment (a run of chunks) is one contiguous block, so every product below
is one batched matmul over M * G sub-chunks without a copy.

Inputs are prepared by latte_causal: lq = log softmax(a), key logits b
(masked, centred, padded to whole chunks), values v, initial state (S0, z0).
The kernel works in base 2 (logits times log2(e), _exp.py). With z_t the
log-normaliser, r_m = z before sub-chunk m and e_m = z at its end:
  Q_t   = q_t 2^(r_m - z_t)          (t in sub-chunk m; <= 1)
  kf_s  = 2^(b_s - e_m)              (s in sub-chunk m; <= 1)
  K_m   = sum_{s in m} kf_s v_s      (sub-chunk m's values, normalised at e_m)
  S_m   = 2^(r_m - e_m) S_{m-1} + K_m      (the state after sub-chunk m)
  y_t   = Q_t S_{m-1} + sum_{s<=t in m} q_t 2^(b_s - z_t) v_s
The second sum is the diagonal block of the sub-chunk (intra_chunk.py), the
only pairs taken one by one; every other pair goes through the states
between sub-chunks. The states are scanned in two levels: a J-step loop
vectorised over the chunks of the segment, then a log-depth scan over its
chunks (2 log2(n) steps, each one vectorised over the chunks: the number of
ops does not grow with T but by a log factor).
Backward, with qu_tl = q_tl (dy_t . Vbar_tl) (the gradient w.r.t. lq) and
u = qu / q:
  dv_s  = sum_{t>=s} sum_l q_tl W[t, s, l] dy_t
  db_sl = sum_{t>=s} W[t, s, l] [q_tl (dy_t . v_s) - qu_tl]     (z's share included)
Later sub-chunks enter through reverse states normalised at each sub-chunk end,
  Rv_m = sum_{t after m} 2^(e_m - z_t) q_t dy_t   [L, D]
  Rq_m = sum_{t after m} 2^(e_m - z_t) qu_t       [L]
carried backwards in time by the same two-level scan: dv_s gets kf_s Rv_m,
db_s gets kf_s (v_s . Rv_m - Rq_m), and the diagonal blocks add their pairs.

Every exponent above is a difference of log-normalisers or a logit minus a
later log-normaliser, so <= 0, taken from log space; the work is the same
for any logits: there is no fallback and no branch on values. Only the
inputs, z, r and the states before each chunk are saved; the states between
sub-chunks and the diagonal blocks are rebuilt in the backward.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import torch

from .._exp import LOG2E, exp2_nonpositive_, exp_floor, limit_spread
from ..layout import without_autocast
from .intra_chunk import diagonal_backward, diagonal_blocks, diagonal_key_grads, log_normalisers

# Chunks per segment are chosen so one segment's temporaries hold about this
# many floats per tensor (16 MB): small enough for the allocator to reuse
# freed blocks instead of mapping (and page-faulting) fresh memory for every
# temporary, which made T = 65536 cost 18x T = 16384.
# On a GPU there is no page-faulting to avoid, only its memory to fit:
# segments there hold about 1/256 of the device's memory per tensor
# (_segment_elems), so a long input runs in a few large segments;
# segment_elems fixes the size for a block of code (to count a GPU's ops on
# the CPU, or to test many segments).
_SEGMENT_ELEMS = 1 << 22
_DEVICE_MEMORY_SHARE = 256


# Forward intermediates of one call up to this many floats (32 MB) are kept
# for the backward instead of rebuilt: the query and key factors and the
# diagonal blocks' weights, about 6.75 x L floats per token and head. At a
# research sweep's size (B 64, T <= 256, 32 latents per head) this skips
# about 40% of the backward's exponentials; longer inputs rebuild them, so
# memory stays linear in T with a small constant.
_KEEP_ELEMS = 1 << 23


# A segment budget fixed for the current context (segment_elems): None
# chooses by device. A ContextVar, so it ends with its `with` block and is
# per thread.
_FIXED_ELEMS: contextvars.ContextVar[int | None] = contextvars.ContextVar("latte_segment_elems", default=None)

# An H100's memory: the default device of cuda_segment_elems, for counting
# the ops a GPU would issue without one (latte/bench/op_count.py).
H100_MEMORY = 80 * 10**9


def cuda_segment_elems(total_memory: int = H100_MEMORY) -> int:
    """Floats per temporary of one segment on a CUDA device with
    `total_memory` bytes: 1/256 of it in float32, at least the CPU's."""
    return max(_SEGMENT_ELEMS, total_memory // 4 // _DEVICE_MEMORY_SHARE)


@functools.cache
def _device_memory(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def _device_segment_elems(device: torch.device) -> int:
    return cuda_segment_elems(_device_memory(device))


@contextlib.contextmanager
def segment_elems(elems: int):
    """Within the block (this thread or task only), every call sizes its
    segments to about `elems` floats per temporary, whatever the tensors'
    device: `with segment_elems(cuda_segment_elems()):` runs the segments an
    80 GB GPU would, on any device (`meta` included, to count its ops).
    Results do not depend on it; only the number of segments does. Eager
    calls only: code compiled by torch.compile ignores it."""
    if not isinstance(elems, int) or isinstance(elems, bool) or elems < 1:
        raise ValueError(f"segment_elems: elems must be an int >= 1, got {elems!r}")
    token = _FIXED_ELEMS.set(elems)
    try:
        yield elems
    finally:
        _FIXED_ELEMS.reset(token)


def _segment_elems(device: torch.device | None) -> int:
    """Floats per temporary of one segment on `device` (no host-device sync:
    the device's total memory, read once per device), unless fixed by
    segment_elems (in eager mode: dynamo cannot trace ContextVar.get, so a
    compiled call sizes by its device)."""
    fixed = None if torch.compiler.is_compiling() else _FIXED_ELEMS.get()
    if fixed is not None:
        return fixed
    if device is not None and device.type == "cuda":
        return _device_segment_elems(device)
    return _SEGMENT_ELEMS


def _segments(G, N, C, width, device=None):
    """Runs of whole chunks: [(first, end)) chunk indices."""
    n = max(1, _segment_elems(device) // (G * C * width))
    return [(n0, min(N, n0 + n)) for n0 in range(0, N, n)]


def _mm(a, b, out=None):
    """a @ b for [M, G, i, j] @ [M, G, j, k] as one bmm over M * G (either
    operand may be a transposed view of a contiguous tensor: no copy)."""
    M, G = a.shape[:2]
    o = None if out is None else out.view(M * G, *out.shape[2:])
    res = torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=o)
    return res.view(M, G, *res.shape[1:])


def _add_mm(out, a, b):
    """out += a @ b in place (out contiguous [M, G, i, k])."""
    out.view(-1, *out.shape[2:]).baddbmm_(a.flatten(0, 1), b.flatten(0, 1))


def _t(x):
    return x.transpose(-1, -2)


def _factors(lq, b, z, r):
    """lqz = lq - z [M, G, c, L]; Q = q_t 2^(r_m - z_t) and kf = 2^(b_s - e_m)
    [M, G, c, L]; the sub-chunk decays g_m = 2^(r_m - e_m) [M, G, L]."""
    lqz = lq - z
    e = z[:, :, -1]
    Q = exp2_nonpositive_(lqz + r.unsqueeze(2))
    kf = exp2_nonpositive_(b - e.unsqueeze(2))
    return lqz, Q, kf, exp2_nonpositive_(r - e)


def _combine_(Y, E, first, last, s, reverse):
    """Y_k += 2^(E_j - E_k) Y_j (reverse: 2^(E_k - E_j)) for the targets k =
    first, first + 2s, .., last and their partners j = k - s (reverse:
    k + s): disjoint strided views, so in place."""
    if first > last:
        return
    tgt = slice(first, last + 1, 2 * s)
    src = slice(first + s, last + s + 1, 2 * s) if reverse else slice(first - s, last - s + 1, 2 * s)
    older, newer = (E[tgt], E[src]) if reverse else (E[src], E[tgt])
    Y[tgt].addcmul_(exp2_nonpositive_(older - newer).unsqueeze(-1), Y[src])


def _chunk_scan_(Y, E, reverse=False):
    """In place over chunks, in 2 log2(n) steps (Brent-Kung: O(n) work): Y
    [n, G, L, W] with Y_k normalised at E_k [n, G, L] (base 2,
    non-decreasing in k) becomes sum_{i <= k} 2^(E_i - E_k) Y_i (reverse:
    sum_{i >= k} 2^(E_k - E_i) Y_i). Every partial sum stays normalised at
    its own index's E, so each step's decays come from E directly, an
    exponent <= 0. Reverse runs the same steps on the mirrored indices."""
    n = len(Y)

    def targets(first, s):  # (first, last) of first, first + 2s, .. <= n - 1, mirrored for reverse
        last = first + (n - 1 - first) // (2 * s) * 2 * s
        return (n - 1 - last, n - 1 - first) if reverse else (first, last)

    spans = []
    s = 1
    while s < n:  # up-sweep: Y_k sums the 2s entries up to k
        _combine_(Y, E, *targets(2 * s - 1, s), s, reverse)
        spans.append(s)
        s *= 2
    for s in reversed(spans[:-1]):  # down-sweep: the prefixes in between
        _combine_(Y, E, *targets(3 * s - 1, s), s, reverse)


def _scan(X, g, J, first, reverse=False):
    """In place over the sub-chunks of every chunk at once (a J-step loop):
    X [n * J, G, L, W] holds each sub-chunk's own share; forward, X_m +=
    g_m X_{m-1} with `first` ([n or 1, G, L, W], or None for zero) before
    each chunk's first; reverse, X_m += g_m X_{m+1} with `first` after each
    chunk's last. g [n * J, G, L]."""
    Xs, gs = X.unflatten(0, (-1, J)).unbind(1), g.unflatten(0, (-1, J)).unsqueeze(-1).unbind(1)
    order = range(J - 1, -1, -1) if reverse else range(J)
    prev = 1 if reverse else -1
    for j in order:
        if j == order[0]:
            if first is not None:
                Xs[j].addcmul_(gs[j], first)
        else:
            Xs[j].addcmul_(gs[j], Xs[j + prev])


def _forward_states(Sx, g, z, r, J, S0, S_before):
    """Sx [M + 1, G, L, D] holds K_m in slots 1..M; turns slot m + 1 into
    the state after sub-chunk m and slot 0 into S0, and writes the state
    before each chunk into S_before [n, G, L, D]. One chunk runs the loop from
    S0; several run it from zero, carry the chunk states by a log-depth
    scan over chunks (_chunk_scan_) and add each one's decayed share (two
    levels)."""
    n = len(S_before)
    Sx[0] = S0
    S_before[0] = S0
    X = Sx[1:]
    _scan(X, g, J, S0 if n == 1 else None)
    if n == 1:
        return
    S_before[1:] = X[J - 1 : -1 : J]  # each chunk's end state from zero, normalised at its end
    _chunk_scan_(S_before, r[::J])  # chunk to chunk: S_before[k] is normalised at r before chunk k
    # 2^(z before the chunk - e_m): the chunk's initial state decayed to each sub-chunk end
    decay = exp2_nonpositive_(r[::J].unsqueeze(1) - z[:, :, -1].unflatten(0, (n, J))).unsqueeze(-1)
    X.unflatten(0, (n, J)).addcmul_(decay, S_before.unsqueeze(1))


def _backward_states(Rx, g, z, r, J, init):
    """Rx [M + 1, G, L, W] holds each sub-chunk's share of the reverse state
    (normalised at r_m) in slots 0..M-1; slot M gets `init`, the reverse state
    after the segment; turns slot m into the reverse state before sub-chunk m
    (normalised at r_m), so slot m + 1 is the one after it (at e_m). Two
    levels, as _forward_states."""
    M = len(Rx) - 1
    n = M // J
    Rx[M] = init
    X = Rx[:M]
    _scan(X, g, J, init if n == 1 else None, reverse=True)
    if n == 1:
        return
    after = torch.empty_like(Rx[:n])  # the reverse state after each chunk, normalised at its end
    after[:-1] = X[J::J]  # before each later chunk, from zero after it
    after[-1] = init
    _chunk_scan_(after, z[J - 1 :: J, :, -1], reverse=True)
    decay = exp2_nonpositive_(r.unflatten(0, (n, J)) - z[J - 1 :: J, :, -1].unsqueeze(1)).unsqueeze(-1)
    X.unflatten(0, (n, J)).addcmul_(decay, after.unsqueeze(1))


def _forward_segment(lq, b, v, S0, z0, J, y, S_before, z, r):
    """One segment of n chunks (base 2): lq, b [M, G, c, L], v [M, G, c, D]
    (contiguous), state (S0, z0); writes y [M, G, c, D], S_before
    [n, G, L, D] (the state before each chunk), z [M, G, c, L] and r
    [M, G, L] (z before each sub-chunk); returns the state after the
    segment."""
    r_seg, z_last = log_normalisers(b, z0, J, z)
    r.copy_(r_seg)
    lqz, Q, kf, g = _factors(lq, b, z, r)
    M, G, _, L = lq.shape
    Sx = v.new_empty(M + 1, G, L, v.shape[-1])
    _mm(_t(kf), v, out=Sx[1:])
    _forward_states(Sx, g, z, r, J, S0, S_before)
    _mm(Q, Sx[:M], out=y)  # earlier sub-chunks, through the state before t's
    A, P = diagonal_blocks(lqz, b)
    _add_mm(y, A, v)
    return Sx[M], z_last, (lqz, Q, kf, g, A, P)


def _backward_segment(lq, q, b, v, z, r, S_before, dy, init, J, dlq, db, dv, kept=None):
    """Gradients of one segment given the reverse state `init` = [Rv | Rq]
    [G, L, D + 1] after it: writes dlq (w.r.t. log softmax(a)), db, dv and
    returns the reverse state before it. q: 2^lq, clamped. kept: the
    forward's (lqz, Q, kf, g, A, P), or None to rebuild them."""
    lqz, Q, kf, g = kept[:4] if kept is not None else _factors(lq, b, z, r)
    M, G, _, L = lq.shape
    Sx = v.new_empty(M + 1, G, L, v.shape[-1])
    _mm(_t(kf), v, out=Sx[1:])
    Sx[0] = S_before[0]
    _scan(Sx[1:], g, J, S_before)  # the states again, each chunk from its saved initial state
    _mm(dy, _t(Sx[:M]), out=dlq).mul_(Q)  # qu: q_t (dy_t . Vbar_t), the gradient w.r.t. lq
    A, pairs = diagonal_backward(lqz, b, _mm(dy, _t(v)), dlq, None if kept is None else kept[4:])  # dy_t . v_s
    u = dlq / q  # dy_t . Vbar_t
    db.zero_()
    diagonal_key_grads(pairs, u, db)
    # each sub-chunk's share of the reverse states before it, normalised at r_m: [Rv | Rq]
    D = v.shape[-1]
    R = v.new_empty(M + 1, G, L, D + 1)
    torch.cat([_mm(_t(Q), dy), Q.mul_(u).sum(2).unsqueeze(-1)], -1, out=R[:M])
    _backward_states(R, g, z, r, J, init)
    Rv, Rq = R[1:, ..., :D], R[1:, ..., D:]  # after each sub-chunk
    _mm(_t(A), dy, out=dv)
    _add_mm(dv, kf, Rv)
    db.addcmul_(kf, _mm(v, _t(Rv)).sub_(_t(Rq)))
    return R[0]


def _parts(segments, J, per_sub_chunk, per_chunk):
    """For each segment (m0, m1): the tensors cut to its sub-chunks and to
    its chunks (the tensors themselves for a single segment: no slicing ops)."""
    for m0, m1 in segments:
        if len(segments) == 1:
            yield per_sub_chunk, per_chunk
        else:
            yield [x[m0:m1] for x in per_sub_chunk], [x[m0 // J : m1 // J] for x in per_chunk]


class LatteChunked(torch.autograd.Function):
    """(a, b [M, G, c, L], v [M, G, c, D] sub-chunk-major and contiguous,
    S0 [G, L, D], z0 [G, L], J) -> (y [M, G, c, D], S_last, z_last), M a
    multiple of J (whole chunks of J sub-chunks). a: query logits (the kernel
    takes their log-softmax over the latents), b: key logits (masked). Logits
    in nats, as everywhere else; the kernel scales them to base 2 inside.

    Every latent's key logits are shifted by their maximum (docs/design.md
    §2, "Centring"): the weights are invariant to the shift, and float32
    keeps its precision when all logits share a large offset; the shift is
    added back to the returned z only."""

    @staticmethod
    @without_autocast
    def forward(ctx, a, b, v, S0, z0, J):
        M, G, c, L = a.shape
        D = v.shape[-1]
        assert M % J == 0, "whole chunks of J sub-chunks"
        shift = torch.maximum(b.amax(0).amax(1), z0)  # [G, L] (amax over (0, 2) at once: 40x slower)
        # base 2 inside (_exp.py); limit_spread keeps log_softmax's own exp off its slow lanes
        lq = torch.log_softmax(limit_spread(a, -1), -1).mul_(LOG2E)
        b, z0 = torch.add(shift.unsqueeze(1) * -LOG2E, b, alpha=LOG2E), (z0 - shift).mul_(LOG2E)
        y = v.new_empty(M, G, c, D)
        S_before = v.new_empty(M // J, G, L, D)
        z, r = torch.empty_like(b), b.new_empty(M, G, L)
        width = max(L, D, L * D // c)
        segments = [(n0 * J, n1 * J) for n0, n1 in _segments(G, M // J, J * c, width, v.device)]
        S, zl, kept = S0, z0, []
        keep = M * G * c * L * 7 <= _KEEP_ELEMS
        for (lq_, b_, v_, y_, z_, r_), (Sb_,) in _parts(segments, J, (lq, b, v, y, z, r), (S_before,)):
            S, zl, k = _forward_segment(lq_, b_, v_, S, zl, J, y_, Sb_, z_, r_)
            kept.append(k if keep else None)
        ctx.save_for_backward(lq, b, v, S0, S_before, S, z, r)
        ctx.segments, ctx.J, ctx.kept = segments, J, kept
        return y, S, zl.mul_(math.log(2.0)).add_(shift)

    @staticmethod
    @without_autocast
    def backward(ctx, dy, dS_last, dz_last):
        lq, b, v, S0, S_before, S_last, z, r = ctx.saved_tensors
        J = ctx.J
        dy = dy.contiguous()
        dS_last = torch.zeros_like(S_last) if dS_last is None else dS_last
        dz_last = torch.zeros_like(r[0]) if dz_last is None else dz_last
        # reverse states after the last chunk: the final-state cotangents
        R = torch.cat([dS_last, ((dS_last * S_last).sum(-1) - dz_last).unsqueeze(-1)], -1)  # [G, L, D + 1]
        q = lq.clamp(min=exp_floor(lq.dtype) * LOG2E).exp2_()  # softmax(a), clamped as its weights are
        da, db, dv = torch.empty_like(lq), torch.empty_like(b), torch.empty_like(v)
        parts = list(_parts(ctx.segments, J, (lq, q, b, v, z, r, dy, da, db, dv), (S_before,)))
        for ((lq_, q_, b_, v_, z_, r_, dy_, da_, db_, dv_), (Sb_,)), k in reversed(list(zip(parts, ctx.kept))):
            R = _backward_segment(lq_, q_, b_, v_, z_, r_, Sb_, dy_, R, J, da_, db_, dv_, k)
        ctx.kept = None
        # da holds qu = q (dy . Vbar), the gradient w.r.t. log softmax(a): through the softmax
        da.addcmul_(q, da.sum(-1, keepdim=True), value=-1.0)
        dS0 = R[..., :-1]
        dz0 = (S0 * dS0).sum(-1) - R[..., -1]
        return da, db, dv, dS0, dz0, None
