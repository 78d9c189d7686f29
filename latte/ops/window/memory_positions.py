"""Fixed rotary positions for the memory slots (docs/math.md §4.2,
`memory_positions: cache`): the sinks at 0..n-1, slot i (in arrival order)
at n + i, the window after them, the query at n + M + w - 1.

Legend: B batch, T time (queries), K key/value heads, G queries per KV head,
E query/key width, M slots, C keys of one block.

The slots keep their keys before the rotation (a leaving key is rotated back
by its own position) and rotate them at read time by their slot's position.
A query block reads each visible key at the index it has among the keys that
query sees: the keys of a block are in position order, so that index is a
running count. `rotary` maps integer positions [N] to (cos, sin) [N, E] in
Llama's rotate-half layout, the rotation the model's own keys carry.
"""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x rotated by the angles of (cos, sin) (broadcast over x's leading dims)."""
    return x * cos + _rotate_half(x) * sin


def unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The inverse of rotate: x rotated back by the same angles."""
    return x * cos - _rotate_half(x) * sin


def slot_tables(rotary, num_sinks: int, slots: int, like: torch.Tensor):
    """(cos, sin) [M, E] of the slots' positions n .. n + M - 1."""
    cos, sin = rotary(torch.arange(num_sinks, num_sinks + slots, device=like.device))
    return cos.to(like.dtype), sin.to(like.dtype)


def unrotated(rotary, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """k [B, N, K, E] rotated at positions pos [B, N], rotated back to 0."""
    cos, sin = rotary(pos.reshape(-1))
    shape = (*pos.shape, 1, k.shape[-1])
    return unrotate(k, cos.to(k.dtype).reshape(shape), sin.to(k.dtype).reshape(shape))


def indexed_scores(q: torch.Tensor, ks: torch.Tensor, keep: torch.Tensor, tables) -> torch.Tensor:
    """q [B, T, K, G, E] . (key c rotated to its slot's position for query t):
    [B, K, G, T, C]; ks [B, K, C, E] unrotated, keep [B, K, T, C] (the keys
    each query sees, in position order), tables: slot_tables."""
    cos, sin = tables
    M = cos.shape[0]
    B, T, K, G, _ = q.shape
    C = ks.shape[2]
    kr = rotate(ks[:, :, None], cos[:, None], sin[:, None])  # [B, K, M, C, E]: key c at slot i
    s = torch.einsum("btkge,bkice->bkgtic", q, kr)
    idx = (keep.long().cumsum(-1) - 1).clamp(0, M - 1)  # [B, K, T, C]: slot of key c for query t
    return s.gather(4, idx[:, :, None, :, None, :].expand(B, K, G, T, 1, C)).squeeze(4)
