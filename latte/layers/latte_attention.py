"""LatteAttention: the Latte layer (docs/math.md §2, §3, §5).

Legend: B batch, T time, H heads, L latents per head (latents_per_head),
D value width per head (dim / H).

  u = qk_mixer(x)                      (order for the latent logits, docs/math.md §5)
  a = u W_a, b = u W_b  [B, T, H, L]   (latent logits, no 1/sqrt(d) scale)
  v = x W_v             [B, T, H, D]
  y = (Latte(a, b, v) merged over heads) W_o, then dropout

causal=True uses the chunked op for T > 1 and the recurrent step for T == 1;
causal=False (encoders) uses the bidirectional op and has no state. The
bidirectional layer takes qk_mixer "none" (its default) or "conv" (a centred
conv); the RG-LRU mixers are causal-only and raise ValueError.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from latte.ops import LatteState, latte_bidirectional, latte_causal, latte_causal_step

from ._checks import check_backend, check_divides, check_dropout, check_input, check_positive_ints, check_state
from .documents import check_packed, packed_layer, packed_qk_mixer
from .mixers import QKMixer


class LatteLayerState(NamedTuple):
    """Decoding state of a causal LatteAttention: constant in T."""

    attn: LatteState  # S [B, H, L, D], z [B, H, L] (float32)
    conv: torch.Tensor | None  # [B, conv_size - 1, dim] last conv inputs (float32), None without conv
    h: torch.Tensor | None  # [B, dim] RG-LRU state (float32), None without RG-LRU


class LatteAttention(nn.Module):
    """Latte attention layer: forward(x, *, state=None, mask=None) -> (y, state).

    Args:
        dim: model width; num_heads divides it.
        num_heads: heads H.
        latents_per_head: L, the latents of each head (num_heads * L in all).
        causal: language-model Latte (True) or bidirectional (False, no state).
        qk_mixer: "none" | "conv" | "rglru" | "conv_rglru"; default
            "conv_rglru" when causal, "none" when not.
        conv_size: kernel of the depthwise conv mixer.
        chunk_size: tokens per chunk of the causal op.
        dropout: applied to the layer output (after W_o) in training.
        bias: biases in the a, b, v, o projections.
        backend: kernels of the causal op, "torch" | "fla" | "auto" | None
            (the process default); see latte.ops.backend.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        latents_per_head: int,
        *,
        causal: bool = True,
        qk_mixer: str | None = None,
        conv_size: int = 3,
        chunk_size: int = 64,
        dropout: float = 0.0,
        bias: bool = False,
        backend: str | None = None,
    ):
        super().__init__()
        check_positive_ints(dim=dim, num_heads=num_heads, latents_per_head=latents_per_head, chunk_size=chunk_size)
        check_backend(backend)
        check_divides("num_heads", num_heads, "dim", dim)
        check_dropout(dropout)
        if qk_mixer is None:
            qk_mixer = "conv_rglru" if causal else "none"
        self.dim, self.num_heads, self.latents_per_head = dim, num_heads, latents_per_head
        self.causal, self.chunk_size, self.qk_mixer = causal, chunk_size, qk_mixer
        self.backend = backend
        self.mixer = QKMixer(dim, num_heads, qk_mixer, conv_size=conv_size, causal=causal)
        self.a_proj = nn.Linear(dim, num_heads * latents_per_head, bias=bias)
        self.b_proj = nn.Linear(dim, num_heads * latents_per_head, bias=bias)
        self.v_proj = nn.Linear(dim, dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        *,
        state: LatteLayerState | None = None,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LatteLayerState | None]:
        """x [B, T, dim], mask [B, T] bool (False = padding) ->
        (y [B, T, dim], LatteLayerState after the last token; None if not causal).
        positions: accepted for a uniform layer interface; Latte takes order
        from its qk mixer and the causal sum, not from positions.
        cu_seqlens: the documents of a packed row (B == 1; layers/documents.py)."""
        B, T = check_input(x, self.dim, mask, positions)
        if cu_seqlens is not None:
            return self._packed(x, cu_seqlens, state, mask)
        state = check_state(state, LatteLayerState, B, self.causal)
        H, L = self.num_heads, self.latents_per_head
        u, conv, h = self.mixer(
            x, mask=mask, conv_state=None if state is None else state.conv, h=None if state is None else state.h
        )
        a = self.a_proj(u).view(B, T, H, L)
        b = self.b_proj(u).view(B, T, H, L)
        v = self.v_proj(x).view(B, T, H, -1)  # [B, T, H, D]
        if not self.causal:
            y = latte_bidirectional(a, b, v, mask=mask)
            return self._out(y), None
        prev = None if state is None else state.attn
        if T == 1:  # decoding: O(1) recurrent step (docs/math.md §3.1)
            m = None if mask is None else mask[:, 0]
            y, attn = latte_causal_step(a[:, 0], b[:, 0], v[:, 0], prev, mask_t=m, backend=self.backend)
            y = y.unsqueeze(1)
        else:
            y, attn = latte_causal(
                a,
                b,
                v,
                chunk_size=self.chunk_size,
                initial_state=prev,
                output_final_state=True,
                mask=mask,
                backend=self.backend,
            )
        return self._out(y), LatteLayerState(attn, conv, h)

    def _packed(self, x, cu_seqlens, state, mask) -> tuple[torch.Tensor, None]:
        """Packed documents: the qk mixer per document, the op with cu_seqlens
        (bidirectional: the whole layer per document)."""
        check_packed(x, cu_seqlens, state=state, mask=mask)
        if not self.causal:
            return packed_layer(self, x, cu_seqlens, None)
        T, H, L = x.shape[1], self.num_heads, self.latents_per_head
        u = packed_qk_mixer(self.mixer, x, cu_seqlens)
        a, b = self.a_proj(u).view(1, T, H, L), self.b_proj(u).view(1, T, H, L)
        v = self.v_proj(x).view(1, T, H, -1)
        y, _ = latte_causal(a, b, v, chunk_size=self.chunk_size, cu_seqlens=cu_seqlens, backend=self.backend)
        return self._out(y), None

    def _out(self, y: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.o_proj(y.flatten(2)))  # [B, T, H, D] -> [B, T, dim]

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, latents_per_head={self.latents_per_head}, "
            f"causal={self.causal}, qk_mixer={self.qk_mixer!r}, chunk_size={self.chunk_size}"
        )
