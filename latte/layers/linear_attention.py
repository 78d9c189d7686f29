"""LinearAttention: the linear-attention baseline (Katharopoulos et al. 2020).

Legend: B batch, T time, H heads, E head width (dim / H).

  u = qk_mixer(x)                      ("none" by default: u = x)
  q = phi(u W_q), k = phi(u W_k) [B, T, H, E] with phi(x) = elu(x) + 1 > 0
  v = x W_v [B, T, H, E]
  y_t = (q_t S_t) / (q_t . z_t + eps),  S_t = sum_{s<=t} k_s v_s^T,  z_t = sum_{s<=t} k_s

`latte.ops.linear_attention` (chunked) for T > 1, `linear_attention_step` for
T == 1. No positional encoding, as in the original. The state (S, z) is
constant in T.

qk_mixer is Latte's (latte.layers.mixers.QKMixer, the same module on the same
input): "conv" gives the baseline the short causal convolution that Latte's
"conv" variant has, so that a recall comparison at equal attention state
differs only in the attention (docs/evaluation.md §4).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from latte.ops import LinearAttentionState, linear_attention, linear_attention_step

from ._checks import check_divides, check_dropout, check_input, check_positive_ints, check_state
from .documents import check_packed, packed_layer
from .mixers import QKMixer


class LinearLayerState(NamedTuple):
    """Decoding state of LinearAttention: constant in T."""

    attn: LinearAttentionState  # S [B, H, E, E], z [B, H, E] (float32)
    conv: torch.Tensor | None = None  # [B, conv_size - 1, dim] last conv inputs, None without conv
    h: torch.Tensor | None = None  # [B, dim] RG-LRU state, None without RG-LRU


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1: positive, so the normaliser q . z never changes sign."""
    return F.elu(x) + 1.0


class LinearAttention(nn.Module):
    """Linear attention layer: forward(x, *, state=None, mask=None) -> (y, state).

    Args:
        dim: model width; num_heads divides it.
        num_heads: heads H.
        causal: causal (True) or bidirectional (False, no state).
        chunk_size: tokens per chunk of the causal op.
        qk_mixer: "none" (default, the original baseline) | "conv" | "rglru" |
            "conv_rglru": Latte's qk mixer in front of the q/k projections.
        conv_size: kernel size of the qk mixer's conv.
        dropout: applied to the layer output in training.
        bias: biases in the projections.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = True,
        chunk_size: int = 64,
        qk_mixer: str = "none",
        conv_size: int = 3,
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        check_positive_ints(dim=dim, num_heads=num_heads, chunk_size=chunk_size)
        check_divides("num_heads", num_heads, "dim", dim)
        check_dropout(dropout)
        self.dim, self.num_heads, self.causal, self.chunk_size = dim, num_heads, causal, chunk_size
        self.qk_mixer = qk_mixer
        self.mixer = QKMixer(dim, num_heads, qk_mixer, conv_size=conv_size, causal=causal)
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, dim, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: LinearLayerState | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LinearLayerState | None]:
        """x [B, T, dim], mask [B, T] bool (False = padding) ->
        (y [B, T, dim], LinearLayerState after the last token; None if not causal).
        positions: accepted for a uniform layer interface (no positional encoding)."""
        B, T = check_input(x, self.dim, mask, positions)
        if cu_seqlens is not None:  # packed documents: each its own padded row (layers/documents.py)
            check_packed(x, cu_seqlens, state=state, mask=mask)
            return packed_layer(self, x, cu_seqlens, positions)
        state = check_state(state, LinearLayerState, B, self.causal)
        H = self.num_heads
        u, conv, h = self.mixer(
            x, mask=mask, conv_state=None if state is None else state.conv, h=None if state is None else state.h
        )
        q = feature_map(self.q_proj(u).view(B, T, H, -1))  # [B, T, H, E]
        k = feature_map(self.k_proj(u).view(B, T, H, -1))
        v = self.v_proj(x).view(B, T, H, -1)
        if not self.causal:
            y, _ = linear_attention(q, k, v, causal=False, mask=mask)
            return self.dropout(self.o_proj(y.flatten(2))), None
        prev = None if state is None else state.attn
        if T == 1:
            m = None if mask is None else mask[:, 0]
            y, attn = linear_attention_step(q[:, 0], k[:, 0], v[:, 0], prev, mask_t=m)
            y = y.unsqueeze(1)
        else:
            y, attn = linear_attention(
                q, k, v, chunk_size=self.chunk_size, initial_state=prev, output_final_state=True, mask=mask
            )
        return self.dropout(self.o_proj(y.flatten(2))), LinearLayerState(attn, conv, h)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}, chunk_size={self.chunk_size}, "
            f"qk_mixer={self.qk_mixer!r}"
        )
