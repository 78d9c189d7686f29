"""Argument checks used at every level of the package (ops, layers, models,
train, eval). The lowest module: it imports nothing from latte, so any
module may import it. A check raises ValueError naming the argument, what
was received and what is allowed: a user can cause all of these.

Structural checks (types, dtypes, shapes, Python scalars) read no tensor and
always run. A check that reads a tensor's values is a device-to-host copy;
it runs only where `values_readable` says so (one rule for the package)."""

from __future__ import annotations

import numbers
from typing import Any

import torch

# The largest window a config accepts: 2^24 tokens, beyond any sequence the
# models run on, and the last integer float32 holds exactly (positions and
# distances stay exact). A window is a bound on the work, never its size: the
# window buffers hold min(window, positions) tokens (ops/window/sliding_window.py).
MAX_WINDOW = 1 << 24
WINDOW_ALLOWED = f"an integer in [1, {MAX_WINDOW}] (2^24)"


def is_int(value: Any) -> bool:
    """An integer of any kind (Python, numpy, ...) but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number of any kind (ints included) but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(name: str, value: Any) -> None:
    """`value` is an int >= 1 (bool is refused: True is not a size)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")


def values_readable(*tensors: Any) -> bool:
    """Whether a check may read tensor values: not on a meta tensor (it has
    none), not while torch.compile traces (a graph break) and not during CUDA
    graph capture (a copy to the host is illegal there). The value checks run
    once, at the op or model boundary; a decoding step that the boundary has
    vouched for reads none."""
    if torch.compiler.is_compiling():
        return False
    if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors):
        return False
    return not (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
