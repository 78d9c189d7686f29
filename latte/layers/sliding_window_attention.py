"""SlidingWindowAttention: the window-only baseline (SWA; docs/math.md §4, l = 0).

Legend: B batch, T time, H query heads, K key/value heads, E head width
(dim / H), W window size.

Exact causal softmax attention over the last W tokens (itself included) with
RoPE and grouped KV heads: `latte.ops.sliding_window_attention` for T > 1,
`sliding_window_step` for T == 1. The state is a buffer of the last
min(W - 1, positions) keys/values: constant in T once it holds W - 1. It is
Macchiato without the latents.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from latte.ops import WindowState, sliding_window_attention, sliding_window_step

from ._checks import check_input, check_state, check_window_heads
from .documents import check_packed, packed_layer
from .llama_projections import add_qkvo, project_qkv
from .rope import layer_positions


class WindowLayerState(NamedTuple):
    """Decoding state of SlidingWindowAttention: bounded by the window."""

    attn: WindowState  # k [B, P, K, E], v [B, P, K, E] (float32), mask [B, P]; P = min(W - 1, positions)
    pos: torch.Tensor | None  # [B] int64 real tokens seen so far; None inside a model (its cache counts)


class SlidingWindowAttention(nn.Module):
    """Sliding-window attention layer: forward(x, *, state=None, mask=None) -> (y, state).

    Args:
        dim: model width; num_heads divides it.
        num_heads: query heads.
        window_size: tokens each query sees, itself included.
        num_kv_heads: key/value heads, divides num_heads (default num_heads).
        rope_theta: RoPE base (None: no RoPE).
        dropout: applied to the layer output in training.
        bias: biases in the projections.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        window_size: int = 128,
        num_kv_heads: int | None = None,
        rope_theta: float | None = 10000.0,
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        num_kv_heads = check_window_heads(dim, num_heads, num_kv_heads, rope_theta, dropout, window_size=window_size)
        self.dim, self.num_heads, self.num_kv_heads, self.window_size = dim, num_heads, num_kv_heads, window_size
        self.head_dim = dim // num_heads
        add_qkvo(self, dim, num_heads, num_kv_heads, self.head_dim, rope_theta, bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: WindowLayerState | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, WindowLayerState | None]:
        """x [B, T, dim], mask [B, T] bool (False = padding), positions [B, T]
        (RoPE positions; default: real tokens counted from state.pos) ->
        (y [B, T, dim], WindowLayerState after the last token)."""
        B, T = check_input(x, self.dim, mask, positions)
        if cu_seqlens is not None:  # packed documents: each its own padded row (layers/documents.py)
            check_packed(x, cu_seqlens, state=state, mask=mask)
            return packed_layer(self, x, cu_seqlens, positions)
        state = check_state(state, WindowLayerState, B)
        pos_BT, pos = layer_positions(positions, state, mask, B, T, x.device)
        q, k, v = project_qkv(self, x, pos_BT)
        prev = None if state is None else state.attn
        if T == 1:
            y, attn = sliding_window_step(
                q[:, 0],
                k[:, 0],
                v[:, 0],
                window_size=self.window_size,
                mask_t=None if mask is None else mask[:, 0],
                state=prev,
            )
            y = y.unsqueeze(1)
        else:
            y, attn = sliding_window_attention(
                q, k, v, window_size=self.window_size, mask=mask, initial_state=prev, output_final_state=True
            )
        y = self.dropout(self.o_proj(y.flatten(2)))  # [B, T, H, E] -> [B, T, dim]
        return y, WindowLayerState(attn, pos)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"window_size={self.window_size}"
        )
