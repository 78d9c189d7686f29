"""Argument checks used at every level of the package (ops, layers, models,
train, eval). The lowest module: it imports nothing from latte, so any
module may import it. A check raises ValueError naming the argument, what
was received and what is allowed: a user can cause all of these."""

from __future__ import annotations

import numbers
from typing import Any


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
