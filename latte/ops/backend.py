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
           import; the torch kernels on any other device or dtype (float64
           stays on the exact torch path). Macchiato's window takes
           flex_attention where its compile (one per shape) is paid once:
           inside a compiled caller, or in a training call (gradients on,
           no cached window: the shapes repeat step after step); inference
           (prefill of any length, decoding) keeps the tiles kernel, which
           needs no compile per new length.
None means the process default: set_backend(...), else the LATTE_BACKEND
environment variable as it was when latte was imported, else "auto" (read
once, so that torch.compile sees a plain global): fla's kernels on CUDA, the
torch kernels on the CPU and for float64.

How backend "fla" builds the kernel's inputs (q, k, g from the logits) is a
second, independent switch, FLA_CONSTRUCTIONS:
  "fused":    q = softmax(a), then k, g and z in one pass by fla's
              fused_additive_gate (custom op latte::additive_gate,
              gla_ops.py), one kernel each way; its scan runs each
              sequence serially.
  "eager":    op by op, z by a two-level logcumsumexp (~15 elementwise
              passes over [B, T, H, L] forward, more backward).
  "compiled": "eager" through torch.compile with dynamic shapes, fused into
              a few kernels; compiled on the first call (about 40 s for
              forward and backward on this project's 2-core CPU under load).
  "auto":     (the default) "fused", except where the gate's serial scan
              has too few programs for a long sequence (gla.fused_wins):
              there "eager".
None of them has been timed on a GPU. Set it with set_fla_construction(...)
or LATTE_FLA_CONSTRUCTION (read at import). Inside a caller that
torch.compile already traces, "compiled" is traced with it. docs/gpu.md §2.2-2.3.

An explicit "fla" fails with a clear error where it cannot run (no CUDA
tensor, float64, fla-core or Triton missing) instead of falling back.

What "auto" chose is logged once per choice and reason (logger
"latte.ops.backend", level INFO) and kept in `chosen` ({"latents": (name,
why), "window": (name, why)}; eager calls only).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os

import torch

BACKENDS = ("torch", "fla", "auto")
_env_default = os.environ.get("LATTE_BACKEND") or None
_default: str | None = None
FLA_CONSTRUCTIONS = ("auto", "fused", "eager", "compiled")
_env_construction = os.environ.get("LATTE_FLA_CONSTRUCTION") or None
_construction: str | None = None
log = logging.getLogger(__name__)
chosen: dict[str, tuple[str, str]] = {}
_logged: set[tuple[str, str, str]] = set()


def _choose(kind: str, name: str, why: str) -> str:
    """Record (and log once) what runs `kind` ("latents" / "window") and why."""
    if not torch.compiler.is_compiling():
        chosen[kind] = (name, why)
        if (kind, name, why) not in _logged:
            _logged.add((kind, name, why))
            log.info("latte: %s on %s (%s)", kind, name, why)
    return name


def _check(name, allowed: tuple[str, ...], where: str) -> str:
    if name not in allowed:
        raise ValueError(f"{where}: expected one of {allowed}, got {name!r}")
    return name


def _in_force(chosen: str | None, env_value: str | None, allowed: tuple[str, ...], env_name: str, default: str) -> str:
    """A process-wide choice: the one set in code, else the environment
    variable's (checked when used), else the default."""
    if chosen is not None:
        return chosen
    if env_value is not None:
        return _check(env_value, allowed, f"{env_name} (environment)")
    return default


def _check_name(name, where: str) -> str:
    return _check(name, BACKENDS, where)


def set_backend(name: str | None) -> None:
    """Process-wide default for backend=None (None: back to LATTE_BACKEND / "auto")."""
    global _default
    _default = None if name is None else _check_name(name, "backend")


def get_backend() -> str:
    """The default in force: set_backend's, else LATTE_BACKEND's, else "auto"."""
    return _in_force(_default, _env_default, BACKENDS, "LATTE_BACKEND", "auto")


def set_fla_construction(name: str | None) -> None:
    """How backend "fla" builds q, k, g: one of FLA_CONSTRUCTIONS (None: back
    to LATTE_FLA_CONSTRUCTION / "auto")."""
    global _construction
    _construction = None if name is None else _check(name, FLA_CONSTRUCTIONS, "fla construction")


@contextlib.contextmanager
def using_fla_construction(name: str):
    """The construction `name` inside the block; the earlier choice (set or
    not) after it."""
    global _construction
    before = _construction
    set_fla_construction(name)
    try:
        yield
    finally:
        _construction = before


def get_fla_construction() -> str:
    """The construction in force: set_fla_construction's, else LATTE_FLA_CONSTRUCTION's, else "auto"."""
    return _in_force(_construction, _env_construction, FLA_CONSTRUCTIONS, "LATTE_FLA_CONSTRUCTION", "auto")


@functools.cache
def fla_missing() -> str | None:
    """None when fla-core's GLA kernels and its gate (with gate_dtype) import, else why not (one line)."""
    try:
        import triton  # noqa: F401  (fla imports it lazily in places; fail here, clearly)
        from fla.ops.gla import chunk_gla, fused_recurrent_gla  # noqa: F401
        from fla.ops.gsa.gate import fused_additive_gate_fwd
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    if "gate_dtype" not in inspect.signature(fused_additive_gate_fwd).parameters:
        return "fla.ops.gsa.gate.fused_additive_gate_fwd has no gate_dtype argument (fla-core 0.6.0 has it)"
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
    if name == "fla":
        return "fla"
    return _choose("latents", "torch" if err else "fla", err or "CUDA tensors, fla-core and Triton import")


def resolve_window(backend: str | None, x: torch.Tensor, *, cached: bool = False) -> str:
    """ "tiles" (window_tiles.py) or "flex" (flex_attention) for Macchiato's
    window on queries like x; cached: the call continues from a window state."""
    name = get_backend() if backend is None else _check_name(backend, "backend")
    if name == "torch":
        return "tiles"
    if x.device.type != "cuda" or x.dtype == torch.float64:
        if name == "fla":
            raise ValueError(
                f"backend='fla': the flex_attention window needs CUDA float32/bfloat16 "
                f"tensors, got {x.dtype} on {x.device}"
            )
        return _choose("window", "tiles", f"{x.dtype} on {x.device.type}")
    if name == "fla":
        return "flex"
    if torch.compiler.is_compiling():
        return _choose("window", "flex", "inside a compiled caller: compiled once with it")
    if torch.is_grad_enabled() and not cached:
        return _choose("window", "flex", "training: the shapes repeat, one compile per shape")
    return _choose("window", "tiles", "inference: a new length would compile flex_attention again")


def saved_backend(name: str, where: str, override: str) -> str | None:
    """A model's saved backend (its config's `where` field) -> the layers'
    `backend=`: None for "auto" (the process default). A "fla" this machine
    cannot run (no CUDA device, fla-core missing) is a ValueError naming the
    `override` that runs the torch kernels instead."""
    name = _check_name(name, where)
    if name == "fla":
        why = "no CUDA device" if not torch.cuda.is_available() else fla_missing()
        if why is not None:
            raise ValueError(
                f"{where}: got 'fla' (saved with the model), but this machine cannot run it ({why}); "
                f"run the torch kernels with {override}"
            )
    return None if name == "auto" else name
