"""Argument checks of the attention layers. Every check raises ValueError
naming the argument, the value and what is allowed (a user can cause each of
these); none reads a tensor's values, so none synchronises with the device."""

from __future__ import annotations

import math

import torch

from latte._checks import check_positive_int, is_real
from latte.ops.backend import BACKENDS

from .states import state_batch_size


def check_positive_ints(**values) -> None:
    for name, value in values.items():
        check_positive_int(name, value)


def check_divides(name: str, value: int, other_name: str, other: int) -> None:
    """`other` must be a multiple of `value` (e.g. num_heads divides dim)."""
    if other % value:
        raise ValueError(f"{other_name}={other} must be divisible by {name}={value}")


def check_dropout(dropout) -> None:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout: expected a float in [0, 1), got {dropout!r}")


def check_rope_theta(rope_theta) -> None:
    if rope_theta is None:
        return
    if not is_real(rope_theta) or not math.isfinite(rope_theta) or rope_theta <= 0:
        raise ValueError(f"rope_theta: expected a finite number > 0 (or None for no RoPE), got {rope_theta!r}")


def check_choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")


def check_backend(backend) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None (the process default), got {backend!r}")


def check_input(x, dim: int, mask, positions=None) -> tuple[int, int]:
    """x [B, T, dim] floating, B >= 1 and T >= 1 (as in the ops); mask None or bool [B, T]; positions
    None or integer [B, T]. Returns (B, T)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a floating-point tensor [B, T, dim], got {got}")
    B, T, D = x.shape
    if D != dim or B < 1 or T < 1:
        raise ValueError(f"x: expected [B >= 1, T >= 1, dim={dim}], got shape {tuple(x.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, T):
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask: expected a bool tensor [B, T] = {(B, T)} (True = real token), got {got}")
    if positions is not None:
        if (
            not isinstance(positions, torch.Tensor)
            or positions.is_floating_point()
            or positions.dtype == torch.bool
            or tuple(positions.shape) != (B, T)
        ):
            got = (
                f"{positions.dtype} {tuple(positions.shape)}"
                if isinstance(positions, torch.Tensor)
                else type(positions).__name__
            )
            raise ValueError(f"positions: expected an integer tensor [B, T] = {(B, T)}, got {got}")
    return B, T


def check_state(state, cls, batch: int, causal: bool = True):
    """None or an instance of `cls` holding `batch` rows."""
    if state is None:
        return None
    if not causal:
        raise ValueError("state: a bidirectional layer (causal=False) has no decoding state; pass state=None")
    if not isinstance(state, cls):
        raise ValueError(f"state: expected a {cls.__name__}, got {type(state).__name__}")
    rows = state_batch_size(state)
    if rows is not None and rows != batch:
        raise ValueError(f"state: holds batch {rows}, expected batch {batch} (one row per input row)")
    return state


def check_window_heads(dim, num_heads, num_kv_heads, rope_theta, dropout, **more_positive) -> int:
    """Validation shared by the softmax and sliding-window layers (head width
    dim / num_heads); returns num_kv_heads with its default (num_heads) applied."""
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    check_positive_ints(dim=dim, num_heads=num_heads, num_kv_heads=num_kv_heads, **more_positive)
    check_divides("num_heads", num_heads, "dim", dim)
    check_divides("num_kv_heads", num_kv_heads, "num_heads", num_heads)
    check_rope_theta(rope_theta)
    check_dropout(dropout)
    return num_kv_heads
