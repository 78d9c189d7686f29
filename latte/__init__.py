"""Latte: linear-time latent attention for PyTorch (arXiv 2402.17512).

    import latte
    config = latte.LatteConfig(vocab_size=50257, dim=512, num_layers=8, mixer="latte")
    model = latte.LatteForCausalLM(config)
    layer = latte.LatteAttention(dim=512, num_heads=8, latents_per_head=32)

The names below are imported on first use, so `import latte` (and the `latte`
command's start) stays fast; `latte.models`, `latte.layers` and `latte.ops`
hold the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from latte._version import __version__

# public name -> the module that defines it
_EXPORTS = {
    "LatteConfig": "latte.models",
    "LatteForCausalLM": "latte.models",
    "LatteForSequenceClassification": "latte.models",
    "LatteModel": "latte.models",
    "LatteCache": "latte.models",
    "from_pretrained": "latte.models",
    "LatteAttention": "latte.layers",
    "MacchiatoAttention": "latte.layers",
    "SoftmaxAttention": "latte.layers",
    "SlidingWindowAttention": "latte.layers",
    "LinearAttention": "latte.layers",
}
# every subpackage (tests/test_package.py checks the list against the folders)
_SUBPACKAGES = ("ops", "layers", "models", "data", "train", "eval", "bench", "convert")

# Written out (not built from _EXPORTS) so that linters and IDEs see the
# re-exports; tests/test_package.py checks the two agree.
__all__ = [
    "__version__",
    "LatteConfig",
    "LatteForCausalLM",
    "LatteForSequenceClassification",
    "LatteModel",
    "LatteCache",
    "from_pretrained",
    "LatteAttention",
    "MacchiatoAttention",
    "SoftmaxAttention",
    "SlidingWindowAttention",
    "LinearAttention",
]

if TYPE_CHECKING:  # for IDEs and type checkers; at run time __getattr__ imports on demand
    from latte.layers import (
        LatteAttention,
        LinearAttention,
        MacchiatoAttention,
        SlidingWindowAttention,
        SoftmaxAttention,
    )
    from latte.models import (
        LatteCache,
        LatteConfig,
        LatteForCausalLM,
        LatteForSequenceClassification,
        LatteModel,
        from_pretrained,
    )


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"latte.{name}")
    raise AttributeError(f"module 'latte' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_SUBPACKAGES])
