"""save_pretrained / from_pretrained: a folder with `config.json` and
`model.safetensors`.

config.json holds the LatteConfig fields plus `model_type: "latte"` and
`architectures: [class name]`, so the Hugging Face adapter (`latte.models.hf`)
reads the same folder. Tied weights are stored once (the first name in
state_dict order, e.g. `model.embed.weight`, not `lm_head.weight`). Loading
checks every tensor name and shape and reports all problems in one
ValueError naming the file; nothing is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..config_io import atomic_write
from .config import LatteConfig, read_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "latte"
_META_KEYS = ("model_type", "architectures", "latte_version")


def _architectures() -> dict[str, type]:
    from .causal_lm import LatteForCausalLM
    from .classification import LatteForSequenceClassification

    return {c.__name__: c for c in (LatteForCausalLM, LatteForSequenceClassification)}


def unique_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict with every shared (tied) tensor kept once, under its first name."""
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def save_pretrained(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Writes `directory/config.json` and `directory/model.safetensors`."""
    from .. import __version__

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in unique_state_dict(model).items()}
    tmp = d / f".{WEIGHTS_NAME}.tmp-{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, d / WEIGHTS_NAME)
    meta = {"model_type": MODEL_TYPE, "architectures": [type(model).__name__], "latte_version": __version__}
    atomic_write(d / CONFIG_NAME, json.dumps({**meta, **model.config.to_dict()}, indent=2) + "\n")


def load_config(directory: str | os.PathLike) -> tuple[LatteConfig, str | None]:
    """(LatteConfig, architecture name or None) from `directory/config.json`."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a folder written by save_pretrained)")
    data = read_json(path)
    if data.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ValueError(f"{path}: model_type is {data['model_type']!r}, expected {MODEL_TYPE!r}")
    if "transformers_version" in data:  # written by the Hugging Face adapter: map its names back
        from .hf import native_config_dict

        data = native_config_dict(data)
    arch = (data.get("architectures") or [None])[0]
    fields = {k: v for k, v in data.items() if k not in _META_KEYS}
    return LatteConfig.from_dict(fields, where=str(path)), arch


def from_pretrained(directory: str | os.PathLike, *, cls: type | None = None) -> torch.nn.Module:
    """The model saved in `directory`, of class `cls` or else the class named
    in config.json (LatteForCausalLM when none is named)."""
    config, arch = load_config(directory)
    if cls is None:
        archs = _architectures()
        if arch is not None and arch not in archs:
            raise ValueError(f"{Path(directory) / CONFIG_NAME}: unknown architecture {arch!r}; "
                             f"expected one of {sorted(archs)}")
        cls = archs[arch or "LatteForCausalLM"]
    model = cls(config)
    load_weights(model, Path(directory) / WEIGHTS_NAME)
    return model


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise ValueError(f"{path}: not a valid safetensors file ({e})") from None


def load_weights(model: torch.nn.Module, path: str | os.PathLike, *,
                 expected: dict[str, torch.Tensor] | None = None) -> None:
    """Loads `path` into `model` after checking names and shapes: one
    ValueError lists every missing, unexpected and mismatched tensor.
    expected: the tensors the file must hold (default: the whole state dict)."""
    tensors = read_safetensors(path)
    expected = unique_state_dict(model) if expected is None else expected
    problems = [f"missing tensor {k} {tuple(v.shape)}" for k, v in expected.items() if k not in tensors]
    problems += [f"unexpected tensor {k} {tuple(v.shape)}" for k, v in tensors.items() if k not in expected]
    problems += [f"shape mismatch for {k}: file {tuple(tensors[k].shape)}, model {tuple(v.shape)}"
                 for k, v in expected.items() if k in tensors and tensors[k].shape != v.shape]
    if problems:
        n = len(problems)
        raise ValueError(f"{path}: {n} problem{'s' * (n != 1)} loading into {type(model).__name__}:\n  "
                         + "\n  ".join(problems))
    with torch.no_grad():
        for k, v in expected.items():
            v.copy_(tensors[k])


class PretrainedMixin:
    """`model.save_pretrained(dir)` and `Class.from_pretrained(dir)`."""

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Any:
        return from_pretrained(directory, cls=cls)
