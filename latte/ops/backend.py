"""Which implementation runs an op: the project's torch kernels or fused CUDA kernels.

Backends (the `backend=` argument of latte_causal, latte_causal_step,
macchiato, macchiato_step and of the layers):
  "torch": the project's kernels (chunked.py, window_tiles.py) on any device.
           They are the reference every other path is tested against.
  "fla":   causal Latte as a gated linear attention through
           flash-linear-attention's Triton kernels (fla-core; gla.py), CUDA
           tensors only; in Macchiato the window branch then runs through
           torch's flex_attention (flex_window.py).
  "auto":  on a CUDA tensor, "fla" for the latents when fla-core and Triton
           import and flex_attention for the window; the torch kernels on any
           other device or dtype (float64 stays on the exact torch path).
None means the process default: set_backend(...), else the LATTE_BACKEND
environment variable as it was when latte was imported, else "torch" (read
once, so that torch.compile sees a plain global).

An explicit "fla" fails with a clear error where it cannot run (no CUDA
tensor, float64, fla-core or Triton missing) instead of falling back.
"""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("torch", "fla", "auto")
_env_default = os.environ.get("LATTE_BACKEND") or None
_default: str | None = None


def _check_name(name, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"{where}: expected one of {BACKENDS}, got {name!r}")
    return name


def set_backend(name: str | None) -> None:
    """Process-wide default for backend=None (None: back to LATTE_BACKEND / "torch")."""
    global _default
    _default = None if name is None else _check_name(name, "backend")


def get_backend() -> str:
    """The default in force: set_backend's, else LATTE_BACKEND's, else "torch"."""
    if _default is not None:
        return _default
    if _env_default is not None:
        return _check_name(_env_default, "LATTE_BACKEND (environment)")
    return "torch"


@functools.cache
def fla_missing() -> str | None:
    """None when fla-core's GLA kernels import, else why not (one line)."""
    try:
        import triton  # noqa: F401  (fla imports it lazily in places; fail here, clearly)
        from fla.ops.gla import chunk_gla, fused_recurrent_gla  # noqa: F401
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return None


def _fla_error(x: torch.Tensor) -> str | None:
    if x.device.type != "cuda":
        return f"its kernels need CUDA tensors, got device {x.device}"
    if x.dtype == torch.float64:
        return "its kernels compute in float32/bfloat16; float64 runs on backend='torch'"
    missing = fla_missing()
    if missing is not None:
        return f"fla-core is not usable ({missing}); install it with pip install 'latte[cuda]'"
    return None


def resolve_latent(backend: str | None, x: torch.Tensor) -> str:
    """ "torch" or "fla" for causal Latte on tensors like x."""
    name = get_backend() if backend is None else _check_name(backend, "backend")
    if name == "torch":
        return "torch"
    err = _fla_error(x)
    if name == "fla" and err is not None:
        raise ValueError(f"backend='fla': {err}")
    return "fla" if err is None else "torch"


def resolve_window(backend: str | None, x: torch.Tensor) -> str:
    """ "tiles" (window_tiles.py) or "flex" (flex_attention) for Macchiato's window."""
    name = get_backend() if backend is None else _check_name(backend, "backend")
    if name == "torch":
        return "tiles"
    if x.device.type != "cuda" or x.dtype == torch.float64:
        if name == "fla":
            raise ValueError(
                f"backend='fla': the flex_attention window needs CUDA float32/bfloat16 "
                f"tensors, got {x.dtype} on {x.device}"
            )
        return "tiles"
    return "flex"
