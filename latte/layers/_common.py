"""Helpers shared by the attention layers: argument checks, real-token
positions, state sizes. Every check raises ValueError naming the argument, the
value and what is allowed (STYLE.md habits 5, 6)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

QK_MIXERS = ("none", "conv", "rglru", "conv_rglru")


def check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")


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
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or rope_theta <= 0:
        raise ValueError(f"rope_theta: expected a positive number (or None for no RoPE), got {rope_theta!r}")


def check_choice(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")


def check_backend(backend) -> None:
    from latte.ops.backend import BACKENDS

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS} or None (the process default), got {backend!r}")


def check_input(x, dim: int, mask) -> tuple[int, int]:
    """x [B, T, dim] floating, T >= 1; mask None or bool [B, T]. Returns (B, T)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a floating-point tensor [B, T, dim], got {got}")
    B, T, D = x.shape
    if D != dim or T < 1:
        raise ValueError(f"x: expected [B, T >= 1, dim={dim}], got shape {tuple(x.shape)}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, T):
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask: expected a bool tensor [B, T] = {(B, T)} (True = real token), got {got}")
    return B, T


def check_state(state, cls, batch: int, causal: bool = True):
    """None or an instance of `cls` whose `pos` has one entry per batch row."""
    if state is None:
        return None
    if not causal:
        raise ValueError("state: a bidirectional layer (causal=False) has no decoding state; pass state=None")
    if not isinstance(state, cls):
        raise ValueError(f"state: expected a {cls.__name__}, got {type(state).__name__}")
    if tuple(state.pos.shape) != (batch,):
        got = tuple(state.pos.shape)
        raise ValueError(f"state.pos: expected shape ({batch},) (one count per batch row), got {got}")
    return state


def real_positions(mask: torch.Tensor | None, pos0: torch.Tensor | None, B: int, T: int, device):
    """Position of every token = number of real tokens before it, counting the
    pos0 [B] already in the state, so left padding does not shift positions.

    Returns (pos [B, T] int64, pos after the last token [B] int64).
    """
    pos0 = torch.zeros(B, dtype=torch.long, device=device) if pos0 is None else pos0
    if mask is None:
        pos = pos0[:, None] + torch.arange(T, device=device)[None, :]
        return pos, pos0 + T
    m = mask.long()
    c = m.cumsum(1)  # [B, T] real tokens up to and including t
    return pos0[:, None] + c - m, pos0 + c[:, -1]


def state_nbytes(state) -> int:
    """Bytes held by a decoding state (tensors inside tuples, NamedTuples,
    dataclasses, lists, dicts; None counts 0). Constant in the context length
    for every layer except SoftmaxAttention, whose KV cache grows."""
    if state is None:
        return 0
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_nbytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    if isinstance(state, (tuple, list)):
        return sum(state_nbytes(s) for s in state)
    if isinstance(state, dict):
        return sum(state_nbytes(s) for s in state.values())
    if isinstance(state, (int, float, bool)):
        return 0
    raise ValueError(f"state: cannot size an object of type {type(state).__name__}")


def build_qkvo(module: nn.Module, dim: int, num_heads: int, num_kv_heads: int, head_dim: int,
               rope_theta: float | None, bias: bool) -> None:
    """Give `module` the window/softmax projections under Llama's names
    (q_proj, k_proj, v_proj, o_proj: pretrained decoders convert into them)
    and its RoPE; shared by the softmax, sliding-window and Macchiato layers."""
    from .rope import RotaryEmbedding

    module.rope = None if rope_theta is None else RotaryEmbedding(head_dim, rope_theta)
    module.q_proj = nn.Linear(dim, num_heads * head_dim, bias=bias)
    module.k_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
    module.v_proj = nn.Linear(dim, num_kv_heads * head_dim, bias=bias)
    module.o_proj = nn.Linear(num_heads * head_dim, dim, bias=bias)


def project_qkv(module: nn.Module, x: torch.Tensor, pos_BT: torch.Tensor):
    """x [B, T, dim] -> q [B, T, H, E], k, v [B, T, K, E], RoPE at the real positions."""
    B, T = x.shape[:2]
    H, K, E = module.num_heads, module.num_kv_heads, module.head_dim
    q = module.q_proj(x).view(B, T, H, E)
    k = module.k_proj(x).view(B, T, K, E)
    v = module.v_proj(x).view(B, T, K, E)
    if module.rope is not None:
        q, k = module.rope(q, pos_BT), module.rope(k, pos_BT)
    return q, k, v


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
