"""Chunk-major layout and autograd helpers shared by the chunked kernels.

Legend: B batch, T time, H heads, X any feature width, N chunks, C chunk size.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F


def to_chunks(x, C, value=0.0, multiple=None):
    """[B, T, H, X] -> chunk-major [N, B * H, C, X] (contiguous), time padded
    at the end with `value` to N * C, or to a multiple of `multiple` (itself
    a multiple of C)."""
    B, T, H, X = x.shape
    m = multiple or C
    padded = -(-T // m) * m
    if padded > T:
        x = F.pad(x, (0, 0, 0, 0, 0, padded - T), value=value)
    N = padded // C
    return x.unflatten(1, (N, C)).permute(1, 0, 3, 2, 4).reshape(N, B * H, C, X).contiguous()


def from_chunks(y, B, T):
    """The inverse of to_chunks: [N, B * H, C, X] -> [B, T, H, X] (padding dropped)."""
    N, G, C, X = y.shape
    return y.view(N, B, G // B, C, X).permute(1, 0, 3, 2, 4).reshape(B, N * C, G // B, X)[:, :T]


def no_autocast(device_type: str):
    """A region with autocast off on device_type (nothing to turn off on a
    device without autocast, such as meta, which the device tests use)."""
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def without_autocast(fn):
    """For an autograd.Function's forward/backward: the kernels compute in
    their inputs' float32 (states are float32 by design); under an autocast
    region their matmuls would otherwise drop to bf16 and the backward would
    mix dtypes."""

    @functools.wraps(fn)
    def run(ctx, first, *rest):
        with no_autocast(first.device.type):
            return fn(ctx, first, *rest)

    return run
