"""The mathematics of Latte as pure tensor functions (docs/math.md).

Layout is head-last, [B, T, H, X]; decoding states are float32; outputs have
the input dtype. Every function here has a float64 reference in
`latte.ops.reference` and tests that tie the two together.

The ops come in two families, each in its folder: latte/ (latent attention)
and window/ (sliding window and sinks); macchiato.py composes them. The names
below are the public surface; each checks its inputs once, then runs the
unchecked cores of the families (docs/design.md §10).
"""

from . import reference
from .backend import BACKENDS, get_backend, set_backend
from .cross_entropy import linear_cross_entropy
from .latte.bidirectional import latte_bidirectional
from .latte.causal import LatteState, latte_causal, latte_causal_step
from .latte.recurrence import linear_recurrence
from .linear_attention import LinearAttentionState, linear_attention, linear_attention_step
from .macchiato import MacchiatoState, WindowSpec, macchiato, macchiato_step
from .window.sliding_window import (
    WindowState,
    sliding_window_attention,
    sliding_window_attention_lse,
    sliding_window_step,
)

__all__ = [
    "BACKENDS",
    "LatteState",
    "LinearAttentionState",
    "MacchiatoState",
    "WindowSpec",
    "WindowState",
    "get_backend",
    "latte_bidirectional",
    "latte_causal",
    "latte_causal_step",
    "linear_attention",
    "linear_attention_step",
    "linear_cross_entropy",
    "linear_recurrence",
    "macchiato",
    "macchiato_step",
    "reference",
    "set_backend",
    "sliding_window_attention",
    "sliding_window_attention_lse",
    "sliding_window_step",
]
