"""argparse types shared by the command lines (`latte generate`, `latte bench`,
the laboratory's studies, ...). Each one parses one flag's text or raises
argparse.ArgumentTypeError saying what is allowed and what it got; argparse
then prints `argument --flag: <that>` and exits 2, before anything runs. A
base module (it imports nothing from latte): every part may use it.

    p.add_argument("--dims", type=int_list(low=1), default="64,128")
    p.add_argument("--threads", type=int_at_least(1), default=1)
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterable


def int_at_least(low: int, what: str = "") -> Callable[[str], int]:
    """An integer >= low; `what` is added to the message, e.g. " (0 = off)"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}{what}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}{what}, got {value}")
        return value

    return parse


def number(allowed: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """A finite float accepted by `ok`; `allowed` describes it ("a number > 0")."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text}")
        return value

    return parse


def _items(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list with no empty item, got {text!r}")
    return items


def int_list(low: int = 1, *, increasing: bool = False, distinct: bool = True) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers >= low ("64,128"), as a tuple."""
    allowed = f"comma-separated integers >= {low}" + (", increasing" if increasing else "")

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(t) for t in _items(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        bad = [v for v in values if v < low]
        if bad:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r} ({bad[0]} < {low})")
        if increasing and any(b <= a for a, b in zip(values, values[1:])):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        if distinct and len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected {allowed} without repeats, got {text!r}")
        return values

    return parse


def float_list(allowed: str, ok: Callable[[float], bool]) -> Callable[[str], tuple[float, ...]]:
    """Comma-separated finite floats each accepted by `ok`; `allowed` describes one."""

    def parse(text: str) -> tuple[float, ...]:
        one = number(allowed, ok)
        values = []
        for t in _items(text):
            try:
                values.append(one(t))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"expected comma-separated {allowed}, got {text!r}") from None
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected comma-separated {allowed} without repeats, got {text!r}")
        return tuple(values)

    return parse


def name_list(allowed: Iterable[str]) -> Callable[[str], tuple[str, ...]]:
    """Comma-separated names, each one of `allowed`."""
    allowed = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(_items(text))
        bad = [n for n in names if n not in allowed]
        if bad:
            unknown = ", ".join(map(repr, bad))
            raise argparse.ArgumentTypeError(f"unknown {unknown}; expected some of {', '.join(allowed)}")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"repeated names in {text!r}")
        return names

    return parse


def folder_name(text: str) -> str:
    """A name used as a folder and a README marker: a letter, then letters,
    digits, '.', '_' or '-' (no separators, nothing a shell or a marker
    would misread)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", text):
        raise argparse.ArgumentTypeError(f"expected a letter, then letters, digits, '.', '_' or '-', got {text!r}")
    return text


def checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """The flag's text as given, once `parse` accepts it (for options whose
    text is shown as typed, e.g. in a results page, and parsed later)."""

    def check(text: str) -> str:
        parse(text)
        return text

    return check
