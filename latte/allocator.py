"""Keep freed memory in the process instead of returning it to the kernel.

On Linux with glibc, every allocation of 32 MiB or more (a [4096, 2048]
float32 MLP activation, an LM head's weight gradient) is a fresh mmap, and
every first touch of its pages is a page fault; a Table 6 training step of
8 x 512 tokens faulted ~1.5-1.9 GB of pages per step on the 2-core VM here
and spent 1-3 s of its 8-11 s in the kernel. With mmap disabled and the heap
trimmed only past 2 GiB free at its top, freed blocks are reused from one step to
the next, as jemalloc or tcmalloc would (PyTorch's CPU tuning guides
recommend those via LD_PRELOAD; this needs nothing installed).

`latte train`, `eval`, `generate` and `bench` call `tune()` at start;
LATTE_MALLOC=default turns it off. Library imports never change the
allocator. Peak RSS is about the same; memory is simply not given back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM = 2**31 - 1  # mallopt takes an int: trim only past 2 GiB free at the heap top
_applied: str | None = None


def tune() -> str | None:
    """Apply the setting once (glibc only); returns what was set, or None
    when it does not apply (other platform, other libc, LATTE_MALLOC=default)."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get("LATTE_MALLOC", "").lower() == "default" or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _TRIM) != 1:
        return None
    _applied = f"glibc mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD={_TRIM})"
    return _applied
