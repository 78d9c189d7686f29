"""Input distributions for the tests, the benchmarks and the cost audit of the ops.

Trained models do not produce standard-normal logits: key logits sharpen as
training goes on (std 10 and more), some positions spike, batches carry
padding. An op whose cost depends on the values would look fine on std-1
inputs only, so `latte bench ops` and `python -m benchmarks.train` time every op on
several of these distributions side by side.

Each distribution turns a standard-normal tensor of logits [B, T, ...] into
the logits to use, and says which tokens are real (a [B, T] mask, or None).
"""

from __future__ import annotations

import torch

DISTRIBUTIONS = ("std1", "std10", "std20", "std40", "std100", "spike80", "padding")
DESCRIPTIONS = {
    "std1": "N(0, 1) logits",
    "std10": "N(0, 10^2) logits (trained-like key logits)",
    "std20": "N(0, 20^2) logits",
    "std40": "N(0, 40^2) logits",
    "std100": "N(0, 100^2) logits",
    "spike80": "N(0, 1) logits, +80 on every 16th token",
    "padding": "N(0, 1) logits; even rows all padding, odd rows' last quarter padding",
}


def check_distribution(name: str) -> None:
    if name not in DISTRIBUTIONS:
        raise ValueError(f"distribution: expected one of {list(DISTRIBUTIONS)}, got {name!r}")


def scale(name: str) -> float:
    """The standard deviation of the distribution's logits."""
    check_distribution(name)
    return float(name[3:]) if name.startswith("std") else 1.0


def logits(x: torch.Tensor, name: str) -> torch.Tensor:
    """Standard-normal x [B, T, ...] -> logits of distribution `name`."""
    out = x * scale(name)
    if name == "spike80":
        out = out.clone()
        out[:, 7::16] += 80.0
    return out


def mask(name: str, B: int, T: int, device=None) -> torch.Tensor | None:
    """[B, T] bool (True = real token) for "padding", else None."""
    check_distribution(name)
    if name != "padding":
        return None
    m = torch.ones(B, T, dtype=torch.bool, device=device)
    m[:, T - T // 4 :] = False
    m[::2] = False  # whole rows of padding (with B = 1: all of it)
    return m
