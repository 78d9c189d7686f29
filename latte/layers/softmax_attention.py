"""SoftmaxAttention: the standard-attention baseline with a KV cache.

Legend: B batch, T new tokens, S cached tokens, H query heads, K key/value
heads, E head width (dim / H).

torch's scaled_dot_product_attention with RoPE and grouped KV heads. The
decoding state is a KV cache that grows with the context: the one layer whose
state is not constant in T (that is the point of the comparison). Padded keys
are masked out; every query also sees its own key, so a padded query's row is
never empty (no NaN) and real queries are unaffected.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_input, check_state, check_window_heads
from .documents import check_packed, packed_layer
from .llama_projections import add_qkvo, project_qkv
from .rope import layer_positions


class KVCache(NamedTuple):
    """Decoding state of SoftmaxAttention: grows with the context."""

    k: torch.Tensor  # [B, S, K, E] keys (RoPE applied), input dtype
    v: torch.Tensor  # [B, S, K, E] values, input dtype
    mask: torch.Tensor  # [B, S] bool, True for real tokens
    pos: torch.Tensor | None  # [B] int64 real tokens seen so far; None inside a model (its cache counts)


class StaticKVCache(NamedTuple):
    """A KV cache allocated once for a whole generation (latte/models/static_decode.py):
    N = prompt + max_new_tokens slots, filled in order; a decoding step writes
    its key at `index` in place and attends to the slots its mask marks, so
    every step has the same shapes (gpt-fast's static cache)."""

    k: torch.Tensor  # [B, N, K, E] keys (RoPE applied)
    v: torch.Tensor  # [B, N, K, E] values
    mask: torch.Tensor  # [B, N] bool, True for a slot holding a real token
    index: torch.Tensor  # [] int64: the slot the next token is written to


def _allowed(key_mask: torch.Tensor, T: int, causal: bool) -> torch.Tensor:
    """Boolean attention mask [B, 1, T, S + T] for the T newest queries."""
    B, ST = key_mask.shape
    i = torch.arange(T, device=key_mask.device)[:, None] + (ST - T)  # absolute query index
    j = torch.arange(ST, device=key_mask.device)[None, :]
    allowed = key_mask[:, None, :] & ((j <= i) if causal else True)  # [B, T, S + T]
    return (allowed | (j == i)).unsqueeze(1)  # own key always visible


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention: forward(x, *, state=None, mask=None) -> (y, state).

    Args:
        dim: model width; num_heads divides it.
        num_heads: query heads.
        num_kv_heads: key/value heads, divides num_heads (default num_heads).
        causal: causal LM attention (True) or bidirectional (False, no state).
        rope_theta: RoPE base (None: no RoPE, e.g. encoders with absolute
            positions).
        dropout: applied to the layer output in training (as every layer here,
            so comparisons are like for like).
        bias: biases in the projections.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        causal: bool = True,
        rope_theta: float | None = 10000.0,
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        num_kv_heads = check_window_heads(dim, num_heads, num_kv_heads, rope_theta, dropout)
        self.dim, self.num_heads, self.num_kv_heads, self.causal = dim, num_heads, num_kv_heads, causal
        self.head_dim = dim // num_heads
        add_qkvo(self, dim, num_heads, num_kv_heads, self.head_dim, rope_theta, bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: KVCache | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache | None]:
        """x [B, T, dim], mask [B, T] bool (False = padding), positions [B, T]
        (RoPE positions; default: real tokens counted from state.pos) ->
        (y [B, T, dim], KVCache with every token so far; None if not causal)."""
        B, T = check_input(x, self.dim, mask, positions)
        if cu_seqlens is not None:  # packed documents: each its own padded row (layers/documents.py)
            check_packed(x, cu_seqlens, state=state, mask=mask)
            return packed_layer(self, x, cu_seqlens, positions)
        if isinstance(state, StaticKVCache):
            return self._static_step(x, state, mask, positions)
        state = check_state(state, KVCache, B, self.causal)
        H, K = self.num_heads, self.num_kv_heads
        pos_BT, pos = layer_positions(positions, state, mask, B, T, x.device)
        q, k, v = project_qkv(self, x, pos_BT)
        key_mask = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask
        if state is not None:
            k = torch.cat([state.k.to(k.dtype), k], 1)  # [B, S + T, K, E]
            v = torch.cat([state.v.to(v.dtype), v], 1)
            key_mask = torch.cat([state.mask, key_mask], 1)
        new_state = KVCache(k, v, key_mask, pos) if self.causal else None
        # [B, L, K, E] -> [B, K, L, E]; SDPA maps query head h to KV head h // (H / K)
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)
        gqa = dict(enable_gqa=True) if H != K else {}
        if mask is None and state is None:  # plain causal / full attention: fast path
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, is_causal=self.causal, **gqa)
        elif T == 1 and mask is None and bool(key_mask.all()):  # decoding, no padding: sees every key
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, **gqa)
        else:
            allowed = _allowed(key_mask, T, self.causal)  # [B, 1, T, S + T]
            y = F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, attn_mask=allowed, **gqa)
        y = self.dropout(self.o_proj(y.transpose(1, 2).flatten(2)))  # [B, H, T, E] -> [B, T, dim]
        return y, new_state

    def _static_step(self, x, state: StaticKVCache, mask, positions) -> tuple[torch.Tensor, StaticKVCache]:
        """One token x [B, 1, dim] into the static cache, in place: its key and
        value at slot `index`, then attention over the marked slots (its own
        included). No value is read and no shape depends on the context."""
        if x.shape[1] != 1 or positions is None:
            raise ValueError("state: a StaticKVCache takes one token at a time, with its positions [B, 1]")
        q, k, v = project_qkv(self, x, positions)
        at = state.index.view(1)
        real = torch.ones(x.shape[0], 1, dtype=torch.bool, device=x.device) if mask is None else mask
        state.k.index_copy_(1, at, k.to(state.k.dtype))
        state.v.index_copy_(1, at, v.to(state.v.dtype))
        state.mask.index_copy_(1, at, real)
        gqa = dict(enable_gqa=True) if self.num_heads != self.num_kv_heads else {}
        kh, vh = state.k.to(q.dtype).transpose(1, 2), state.v.to(q.dtype).transpose(1, 2)
        own = torch.arange(state.mask.shape[1], device=x.device) == state.index  # its own key: always visible
        allowed = (state.mask | own)[:, None, None, :]  # [B, 1, 1, N], as _allowed
        y = F.scaled_dot_product_attention(q.transpose(1, 2), kh, vh, attn_mask=allowed, **gqa)
        state.index.add_(1)
        return self.dropout(self.o_proj(y.transpose(1, 2).flatten(2))), state

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, causal={self.causal}"
