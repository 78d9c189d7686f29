"""Packed documents through a layer: one row [1, T] holding N documents.

The boundaries are `cu_seqlens` [N+1] (0, end of document 1, ..., T), as in
the ops (docs/math.md §3.3). Inside a packed row no token sees another
document: positions restart at 0 per document, and every part of a layer
that reads earlier tokens (the qk mixer's conv and RG-LRU, the latents, the
window and its sinks, the memory slots, softmax attention) starts afresh at
each document, exactly as if each document were its own row.

Two ways down to the ops:
  - LatteAttention and MacchiatoAttention pass `cu_seqlens` to their op
    (latte_causal, macchiato: latte_causal's fla path runs the documents
    without copies); their qk mixer runs on the padded copy below.
  - the other layers (softmax, linear, swa) and the qk mixers run on a
    right-padded copy [N, max_len] with the padding masked (`run_padded`),
    then are packed back. Right padding is invisible to a causal layer.
Either way a packed forward keeps no decoding state (it returns None).
"""

from __future__ import annotations

import torch

from latte.ops._checks import check_cu_seqlens
from latte.ops.varlen import pack, unpack


def check_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, *, state, mask) -> None:
    """cu_seqlens of a packed row x [1, T, ...]; a packed call takes no state
    and no padding mask (a document boundary does what padding would)."""
    check_cu_seqlens(cu_seqlens, x.shape[0], x.shape[1])
    if state is not None:
        raise ValueError("state: a packed forward (cu_seqlens) starts every document afresh; pass state=None")
    if mask is not None:
        raise ValueError("mask: a packed forward (cu_seqlens) takes no padding mask; pass mask=None")


def document_positions(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """[1, T] int64: each token's position inside its document (0 at each
    start). No host synchronisation."""
    t = torch.arange(T, device=cu_seqlens.device)
    starts = cu_seqlens[:-1].to(torch.long)
    doc = torch.searchsorted(starts, t, right=True) - 1  # the document of each token
    return (t - starts[doc]).unsqueeze(0)


def run_padded(fn, x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor | None = None):
    """fn(x_padded [N, max_len, F], mask [N, max_len], positions_padded or
    None) -> y_padded [N, max_len, F'], packed back to [1, T, F']."""
    xp, doc = unpack(x, cu_seqlens)
    pp = None if positions is None else unpack(positions.unsqueeze(-1), cu_seqlens)[0].squeeze(-1)
    return pack(fn(xp, doc, pp), doc)


def packed_layer(layer, x: torch.Tensor, cu_seqlens: torch.Tensor, positions: torch.Tensor | None):
    """(y [1, T, dim], None): `layer` run over the documents of x as a
    right-padded batch (its own masked path), packed back."""
    return run_padded(lambda xp, doc, pp: layer(xp, mask=doc, positions=pp)[0], x, cu_seqlens, positions), None


def packed_qk_mixer(mixer, x: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """u [1, T, F] of a QKMixer over the documents of x: its conv and RG-LRU
    restart at each document."""
    if mixer.kind == "none":
        return x
    return run_padded(lambda xp, doc, _: mixer(xp, mask=doc)[0], x, cu_seqlens)
