"""Llama-style attention projections with RoPE, shared by the softmax,
sliding-window and Macchiato layers.

Legend: B batch, T time, H query heads, K key/value heads, E head width.

The parameter names are Llama's (q_proj, k_proj, v_proj, o_proj), so the
attention of a pretrained decoder loads into these layers as it is.
"""

from __future__ import annotations

import torch
from torch import nn

from .rope import RotaryEmbedding


def add_qkvo(
    module: nn.Module, dim: int, num_heads: int, num_kv_heads: int, head_dim: int, rope_theta: float | None, bias: bool
) -> None:
    """Gives `module` q_proj, k_proj, v_proj, o_proj and `rope` (None: no RoPE)."""
    module.rope = None if rope_theta is None else RotaryEmbedding(head_dim, rope_theta)
    module.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
    module.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
    module.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
    module.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)


def project_qkv(module: nn.Module, x: torch.Tensor, pos_BT: torch.Tensor):
    """x [B, T, dim] -> q [B, T, H, E], k, v [B, T, K, E], RoPE at positions pos_BT."""
    B, T = x.shape[:2]
    H, K, E = module.num_heads, module.num_kv_heads, module.head_dim
    q = module.q_proj(x).view(B, T, H, E)
    k = module.k_proj(x).view(B, T, K, E)
    v = module.v_proj(x).view(B, T, K, E)
    if module.rope is not None:
        q, k = module.rope(q, pos_BT), module.rope(k, pos_BT)
    return q, k, v
