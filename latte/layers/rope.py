"""Rotary position embedding (RoPE, Su et al. 2021) for the window branch of
Macchiato and the softmax / sliding-window baselines (docs/math.md §5), and the
positions it rotates by.

Legend: B batch, T time, H heads, E head width (even).

Llama's "rotate half" layout (the first and second halves of a head are the
real and imaginary parts), so pretrained Llama/Gemma q/k projections can be
reused as they are in Hugging Face checkpoints. Positions are given per token
(real tokens counted only, see `real_positions`), never assumed to be 0..T-1,
so left padding and cached decoding rotate every token by its true position.
"""

from __future__ import annotations

import torch
from torch import nn

from latte._checks import check_positive_int

from ._checks import check_rope_theta


class RotaryEmbedding(nn.Module):
    """x [B, T, H, E], pos [B, T] int -> x rotated by angle pos * theta^(-2i/E).

    No buffers: the inverse frequencies are recomputed in float32 each call
    (E / 2 numbers), so `module.to(torch.bfloat16)` cannot degrade them.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim: RoPE needs an even head width, got {head_dim}")
        check_rope_theta(theta)
        if theta is None:
            raise ValueError("rope_theta: expected a positive number, got None")
        self.head_dim = head_dim
        self.theta = float(theta)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        E = self.head_dim
        inv_freq = self.theta ** (-torch.arange(0, E, 2, device=x.device, dtype=torch.float32) / E)  # [E/2]
        ang = pos.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, T, E/2]
        cos, sin = ang.cos().unsqueeze(2), ang.sin().unsqueeze(2)  # [B, T, 1, E/2]
        x1, x2 = x.to(torch.float32).chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)

    def tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [N, E] at positions pos [N], in the rotate-half layout:
        forward(x, pos) = x * cos + cat(-x2, x1) * sin (memory slots at fixed
        positions, docs/math.md §4.2)."""
        E = self.head_dim
        inv_freq = self.theta ** (-torch.arange(0, E, 2, device=pos.device, dtype=torch.float32) / E)
        ang = pos.to(torch.float32).unsqueeze(-1) * inv_freq  # [N, E/2]
        return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}"


def real_positions(mask: torch.Tensor | None, pos0: torch.Tensor | None, B: int, T: int, device):
    """Position of every token = number of real tokens before it, counting the
    pos0 [B] already seen, so left padding does not shift positions.

    Returns (pos [B, T] int64, pos after the last token [B] int64).
    """
    pos0 = torch.zeros(B, dtype=torch.long, device=device) if pos0 is None else pos0
    if mask is None:
        pos = pos0[:, None] + torch.arange(T, device=device)[None, :]
        return pos, pos0 + T
    m = mask.long()
    c = m.cumsum(1)  # [B, T] real tokens up to and including t
    return pos0[:, None] + c - m, pos0 + c[:, -1]


def layer_positions(positions: torch.Tensor | None, state, mask: torch.Tensor | None, B: int, T: int, device):
    """(positions [B, T], counter for the new state [B] or None) of a layer
    with RoPE.

    Inside a model the positions come from the model, which keeps the one
    counter of the whole cache: the layer state then carries none (None).
    A layer used on its own counts real tokens itself, in `state.pos`."""
    if positions is not None:
        return positions, None
    pos0 = None if state is None else state.pos
    if state is not None and pos0 is None:
        raise ValueError(
            "state: carries no position counter (a model's cache keeps it); pass positions= [B, T] with this state"
        )
    return real_positions(mask, pos0, B, T, device)
