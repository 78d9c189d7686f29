"""Opening a saved folder as the model class its config.json names (the
native classes here; the transformers ones through `latte.models.hf`)."""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from .causal_lm import LatteForCausalLM
from .classification import LatteForPairClassification, LatteForSequenceClassification
from .pretrained import CONFIG_NAME, load_config

ARCHITECTURES = {c.__name__: c for c in (LatteForCausalLM, LatteForSequenceClassification, LatteForPairClassification)}


def from_pretrained(directory: str | os.PathLike, *, cls: type | None = None) -> nn.Module:
    """The model saved in `directory`, of class `cls` or else the class named
    in config.json (LatteForCausalLM when none is named)."""
    if cls is None:
        _, arch = load_config(directory)
        if arch is not None and arch not in ARCHITECTURES:
            raise ValueError(
                f"{Path(directory) / CONFIG_NAME}: unknown architecture {arch!r}; "
                f"expected one of {sorted(ARCHITECTURES)}"
            )
        cls = ARCHITECTURES[arch or "LatteForCausalLM"]
    return cls.from_pretrained(directory)
