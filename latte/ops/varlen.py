"""Packed variable-length batches (docs/math.md §3.3).

A packed batch [1, T, ...] with document boundaries cu_seqlens [N+1] is run
as a right-padded batch [N, max_len, ...] whose padding is masked out, then
packed again. Right padding is invisible to a causal op (it comes after every
real token and its keys are masked), so each document starts from its own
state and never sees another. The copy costs O(T) memory, like the op itself.
"""

from __future__ import annotations

import torch


def unpack(x: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, T, *F] -> ([N, max_len, *F] zero-padded, mask [N, max_len])."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    n, max_len = len(lengths), max(lengths)
    mask = torch.arange(max_len, device=x.device)[None, :] < torch.tensor(lengths, device=x.device)[:, None]
    out = x.new_zeros((n, max_len, *x.shape[2:]))
    out[mask] = x[0]  # row-major order of mask == packed order of documents
    return out, mask


def pack(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[N, max_len, *F] -> [1, T, *F], keeping the positions where mask is True."""
    return x[mask].unsqueeze(0)


def run_packed(fn, tensors, cu_seqlens, mask, initial_state):
    """fn(*padded_tensors, padded_mask, initial_state) -> (y_padded, state).
    tensors: [1, T, ...] each, or None (passed on as None)."""
    padded, doc = [], None  # doc [N, max_len]: real positions of each document
    for t in tensors:
        p, doc = (None, doc) if t is None else unpack(t, cu_seqlens)
        padded.append(p)
    run_mask = doc if mask is None else doc & unpack(mask.unsqueeze(-1), cu_seqlens)[0].squeeze(-1)
    y, state = fn(*padded, run_mask, initial_state)
    return pack(y, doc), state
