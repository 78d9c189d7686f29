"""Macchiato's window branch on torch's flex_attention (docs/math.md §4;
backend "fla" or "auto" on CUDA, see backend.py).

Legend: B batch, T time, H query heads, K key/value heads, E query/key
width, D value width, W window size, P = W - 1 cached slots, BS block size.

Same contract as sliding_window.window_blocked: the fused kernel returns the
window's output and its log-normaliser lse_t = log sum_{s in W(t)} exp(e_ts),
which Macchiato combines with the latent branch in log space (macchiato._mix).
Keys are the P cached slots (when a state is given) followed by the T new
ones; query i sees key j iff i + P - W < j <= i + P. The block mask of that
band is built directly from block indices (O(T / BS) work, no T x T mask),
and padded or empty cache slots are removed by a score_mod only when there
are any; a query always sees its own key, as in the tiles kernel.

flex_attention is fused only under torch.compile (compiled once per shape
here); on CPU, torch 2.13 compiles it for inference only and without the
log-normaliser, so the CPU path is the tiles kernel (window_tiles.py) and
this file runs there only eagerly, in the tests.
"""

from __future__ import annotations

import functools

import torch

from .._checks import state_dtype
from .sliding_window import extend_window

BLOCK = 128  # flex_attention's default sparse block size
# flex_attention's main Triton kernel, never its decoding one: under "AUTO",
# torch picks the decoding kernel for fewer than 128 queries, whose row block
# (the next power of two of queries x grouped heads) must divide the 128-wide
# sparse block: 100 queries over 2 grouped heads left it no configuration
# ("NoValidChoicesError", seen on an H200 with torch 2.11, docs/gpu.md §5).
# Decoding steps never come here (window_step).
KERNEL_OPTIONS = {"BACKEND": "TRITON"}


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(q, k, v, **kw):
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled_flex() if q.device.type == "cuda" else flex_attention  # eager: the tests on CPU
    return fn(q, k, v, **kw)


def band_blocks(T: int, P: int, W: int, block: int = BLOCK, device="cpu"):
    """Block structure of the window band for T queries over P + T keys:
    (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices), each
    [1, 1, NQ(, NKV)] int32. A block is "full" when every query of it sees
    every key of it and it lies inside both sequences (the mask_mod is then
    skipped); the others are partial (the mask_mod decides per entry)."""
    KV = P + T
    nq, nkv = -(-T // block), -(-KV // block)
    n = torch.arange(nq, device=device)
    q_lo, q_hi = n * block, ((n + 1) * block).clamp(max=T) - 1
    first = (q_lo + P - W + 1).clamp(min=0) // block  # first kv block any query of the row sees
    last = (q_hi + P) // block
    # a row's keys span at most block + W - 1 positions: this many blocks (a
    # plain int, so that torch.compile needs no value from a tensor)
    width = min(nkv, -(-(block + W - 1) // block) + 1)
    m = first[:, None] + torch.arange(width, device=device)  # [NQ, width] candidate kv blocks
    seen = m <= last[:, None]
    kv_lo, kv_hi = m * block, ((m + 1) * block).clamp(max=KV) - 1
    inside = ((m + 1) * block <= KV) & ((n + 1) * block <= T)[:, None]
    full = seen & inside & (kv_hi <= (q_lo + P)[:, None]) & (kv_lo >= (q_hi + P - W + 1)[:, None])

    def ordered(sel):  # selected block indices first, in ascending order, padded to NKV columns
        idx = torch.where(sel, m, nkv).sort(1).values.clamp(max=nkv - 1)
        out = torch.zeros(nq, nkv, dtype=torch.int32, device=device)
        out[:, :width] = idx.to(torch.int32)
        return sel.sum(1).to(torch.int32)[None, None], out[None, None]

    return (*ordered(seen & ~full), *ordered(full))


@functools.lru_cache(maxsize=32)
def window_block_mask(T: int, P: int, W: int, device: str):
    from torch.nn.attention.flex_attention import BlockMask

    def band(b, h, i, j):
        return (j <= i + P) & (j > i + P - W)

    num, idx, full_num, full_idx = band_blocks(T, P, W, BLOCK, device)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=band, seq_lengths=(T, P + T)
    )


def flex_window(q, k, v, window_size, scale, mask, state, lengths=None):
    """window_blocked on flex_attention: (y [B, T, H, D], lse [B, T, H] in the work dtype,
    WindowState)."""
    from torch.nn.attention.flex_attention import AuxRequest

    B, T, H, _ = q.shape
    K = k.shape[2]
    work = state_dtype(q.dtype)
    io = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else work
    kk, vv, km, P, new_state = extend_window(k, v, window_size, mask, state, lengths, work)
    window_size = P + 1  # no query reaches further back (extend_window)
    if state is None and mask is None:  # nothing cached, nothing padded: the new keys alone
        kk, vv, P, score_mod = kk[:, P:], vv[:, P:], 0, None
    else:

        def score_mod(score, b, h, i, j, km=km, P=P):  # padded / empty slots; own key always kept
            return torch.where(km[b, j] | (j == i + P), score, float("-inf"))

    block_mask = window_block_mask(T, P, window_size, str(q.device))
    y, aux = _flex(
        q.to(io).transpose(1, 2),
        kk.to(io).transpose(1, 2),
        vv.to(io).transpose(1, 2),
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=H != K,
        return_aux=AuxRequest(lse=True),
        kernel_options=dict(KERNEL_OPTIONS),
    )
    return y.transpose(1, 2).to(work), aux.lse.transpose(1, 2).to(work), new_state
