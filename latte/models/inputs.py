"""Validation of what a user hands a model: input_ids and attention_mask,
checked once at the model boundary (the head's forward or generate), never
again inside.

Two kinds of check. Structural ones (type, dtype, shape) read only tensor
metadata: free, and always on. Value checks (ids in range, a mask of 0/1,
an all-ones mask dropped for the unmasked fast path) read the values: each is
a device-to-host synchronisation and, under torch.compile, a graph break. They
run in eager mode by default and are skipped while torch.compile traces
(`torch.compiler.is_compiling()`) or when a model's `validate_inputs` is False,
so compiled code has no graph break and a tight loop no sync; eager users keep
the clear error.
"""

from __future__ import annotations

import torch

INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def value_checks(enabled: bool) -> bool:
    """Whether value checks (host syncs) run: enabled and not compiling."""
    return enabled and not torch.compiler.is_compiling()


def check_input_ids(input_ids, vocab_size: int, *, values: bool = True) -> tuple[int, int]:
    """input_ids: integer tensor [B, T >= 1] with ids in [0, vocab_size).
    Runs before any compute so a bad id never reaches an embedding lookup."""
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids: expected an integer tensor [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in INT_DTYPES:
        raise ValueError(f"input_ids: expected an integer dtype (torch.long), got {input_ids.dtype}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected shape [B, T >= 1] with B >= 1, got {tuple(input_ids.shape)}")
    if values and input_ids.numel():
        lo, hi = torch.aminmax(input_ids)
        lo, hi = int(lo), int(hi)  # one host sync for both
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"input_ids: found id {bad}, but ids must be in [0, {vocab_size - 1}] "
                f"(max id {vocab_size - 1}, vocab_size {vocab_size})"
            )
    return tuple(input_ids.shape)


def check_attention_mask(attention_mask, shape: tuple[int, int], *, values: bool = True) -> torch.Tensor | None:
    """[B, T] bool, or integers 0/1 (1 = real token) -> bool mask; None when
    there is no mask or (with value checks) every token is real, which
    selects the unmasked fast path."""
    if attention_mask is None:
        return None
    m = attention_mask
    if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(shape):
        got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
        raise ValueError(f"attention_mask: expected shape {tuple(shape)} like input_ids, got {got}")
    if m.dtype != torch.bool:
        if m.dtype not in INT_DTYPES:
            raise ValueError(f"attention_mask: expected bool or 0/1 integers (1 = real token), got dtype {m.dtype}")
        if values:
            bad = m[(m != 0) & (m != 1)]
            if bad.numel():
                raise ValueError(
                    f"attention_mask: expected bool or 0/1 integers (1 = real token), found value {int(bad[0])}"
                )
        m = m != 0
    return None if values and bool(m.all()) else m


def check_inputs(
    input_ids, attention_mask, vocab_size: int, *, values: bool = True
) -> tuple[int, int, torch.Tensor | None]:
    """Both checks: (B, T, bool mask or None)."""
    B, T = check_input_ids(input_ids, vocab_size, values=values)
    return B, T, check_attention_mask(attention_mask, (B, T), values=values)
