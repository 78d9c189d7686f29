"""A model folder: `config.json` (the LatteConfig fields plus `model_type:
"latte"` and `architectures: [class name]`) beside `model.safetensors` (the
format of `latte.models.weights`). The Hugging Face adapter reads the same
folder, and a folder written by transformers loads here too, without
transformers.

`PretrainedMixin` gives the model classes `save_pretrained`,
`from_pretrained` (into that class), `num_parameters` and the activation
checkpointing switch. Picking the class named in config.json is
`latte.models.auto.from_pretrained`, above the model classes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from ..config_io import atomic_write
from .config import LatteConfig, read_json
from .hf_names import TOKEN_ID_KEYS, is_hf_config, native_config_dict
from .weights import WEIGHTS_NAME, load_weights, save_weights

CONFIG_NAME = "config.json"
MODEL_TYPE = "latte"
# Keys of config.json beside the LatteConfig fields (ignored when building it).
META_KEYS = ("model_type", "architectures", "latte_version", *TOKEN_ID_KEYS)


def save_pretrained(
    model: nn.Module, directory: str | os.PathLike, *, extra_config: dict[str, Any] | None = None
) -> None:
    """Writes `directory/config.json` and `directory/model.safetensors`;
    extra_config adds keys to config.json (only META_KEYS: token ids)."""
    from .. import __version__

    extra = dict(extra_config or {})
    bad = sorted(set(extra) - set(META_KEYS))
    if bad:
        raise ValueError(f"extra_config: unknown keys {bad}; allowed: {', '.join(TOKEN_ID_KEYS)}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    save_weights(model.state_dict(), d / WEIGHTS_NAME)
    meta = {"model_type": MODEL_TYPE, "architectures": [type(model).__name__], "latte_version": __version__}
    atomic_write(d / CONFIG_NAME, json.dumps({**meta, **extra, **model.config.to_dict()}, indent=2) + "\n")


def load_config(directory: str | os.PathLike) -> tuple[LatteConfig, str | None]:
    """(LatteConfig, architecture name or None) from `directory/config.json`,
    written natively or by transformers."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a folder written by save_pretrained)")
    data = read_json(path)
    if data.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ValueError(f"{path}: model_type is {data['model_type']!r}, expected {MODEL_TYPE!r}")
    if is_hf_config(data):
        data = native_config_dict(data)
    arch = (data.get("architectures") or [None])[0]
    fields = {k: v for k, v in data.items() if k not in META_KEYS}
    return LatteConfig.from_dict(fields, where=str(path)), arch


def num_parameters(model: nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Distinct parameters (a tied weight counts once)."""
    params = {id(p): p for p in model.parameters()}
    if exclude_embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                params.pop(id(m.weight), None)
    return sum(p.numel() for p in params.values())


class PretrainedMixin:
    """`model.save_pretrained(dir)`, `Class.from_pretrained(dir)`,
    `model.num_parameters()` and activation checkpointing, for a module whose
    backbone is `self.model` (a LatteModel)."""

    def save_pretrained(self, directory: str | os.PathLike, **kwargs: Any) -> None:
        save_pretrained(self, directory, **kwargs)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Any:
        """The model saved in `directory`, built as this class."""
        config, _ = load_config(directory)
        model = cls(config)
        load_weights(model, Path(directory) / WEIGHTS_NAME)
        return model

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude_embeddings=exclude_embeddings)

    def gradient_checkpointing_enable(self) -> None:
        """Recompute each block in the backward pass instead of keeping its
        activations (training memory ~ one block instead of all); forward
        results and gradients are unchanged. Only in training mode with
        gradients on; evaluation and decoding are unaffected."""
        self.model.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.model.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.model.gradient_checkpointing
