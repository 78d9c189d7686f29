"""Argument checks shared by the ops.

Every check raises ValueError naming the argument, what was received and what
is expected: a user can cause all of these, so they are not asserts.
Nothing here broadcasts silently.
"""

from __future__ import annotations

import math

import torch

from latte._checks import check_positive_int, is_real, values_readable  # noqa: F401  (re-exported for the ops)

# A key logit that contributes exactly nothing: exp(NEG - z) underflows to 0 in
# float32 and float64 as soon as any real logit has been seen. It is finite, so
# differences of two masked logits stay 0 instead of becoming inf - inf = NaN.
NEG = -1e30


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """States and accumulations are float32 for any input dtype (bf16/fp16
    included); float64 inputs keep float64 so the references can be tight."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_float(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


_SIZES = {"B": "batch size B", "T": "sequence length T"}


def check_nonempty(name: str, x: torch.Tensor, dims: str) -> None:
    """The leading sizes named by `dims` ("BT": batch and time; "B") are >= 1:
    an empty batch or sequence has nothing to attend to, and each kernel
    would fail its own way on it (a division by zero, a reshape)."""
    for i, letter in enumerate(dims):
        if x.shape[i] < 1:
            raise ValueError(f"{name}: {_SIZES[letter]} must be >= 1, got 0 (shape {tuple(x.shape)})")


def check_finite(name: str, value, *, low: float, low_open: bool = True, allow_none: bool = True) -> None:
    """A float argument of an op: a real Python number (not a tensor, not a
    bool), finite and above `low` (at or above it when `low_open` is False).
    Checked once at the op boundary, on the Python scalar: no tensor is read."""
    if value is None and allow_none:
        return
    ok = is_real(value) and math.isfinite(value)
    if not ok or value < low or (low_open and value == low):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ValueError(f"{name}: expected {'None or ' if allow_none else ''}a finite number {bound}, got {value!r}")


def check_rank(name: str, x: torch.Tensor, rank: int, layout: str) -> None:
    check_float(name, x)
    if x.dim() != rank:
        raise ValueError(f"{name}: expected a {rank}-d tensor {layout}, got shape {tuple(x.shape)}")


def check_same(names: str, sizes: list[int], what: str) -> None:
    if len(set(sizes)) != 1:
        raise ValueError(f"{names}: {what} must match, got {sizes}")


def check_shape(name: str, x: torch.Tensor, expected: tuple[int, ...], what: str) -> None:
    check_float(name, x)
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} {what}, got {tuple(x.shape)}")


def check_mask(name: str, mask: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name}: expected a bool tensor (True = real token), got {got}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(mask.shape)}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, length: int) -> None:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise ValueError("cu_seqlens: expected an int32/int64 tensor [N+1]")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens: expected a 1-d tensor with N+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    if batch != 1:
        raise ValueError(f"cu_seqlens: packed input needs batch size 1, got {batch}")
    if not values_readable(cu_seqlens):
        return
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0, got {cu[0]}")
    if any(b <= a for a, b in zip(cu[:-1], cu[1:])):
        raise ValueError(f"cu_seqlens: must be strictly increasing, got {cu}")
    if cu[-1] != length:
        raise ValueError(f"cu_seqlens: must end at T={length}, got {cu[-1]}")
