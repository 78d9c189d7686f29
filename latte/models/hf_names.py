"""The Hugging Face spelling of the LatteConfig fields, beside the config so
that reading a folder written by transformers' `save_pretrained` needs no
transformers. The adapter (`latte.models.hf`) uses the same map for its
attribute aliases; the rest of the package speaks only the native names."""

from __future__ import annotations

import dataclasses
from typing import Any

from .config import LatteConfig

NATIVE_FIELDS = tuple(f.name for f in dataclasses.fields(LatteConfig))
# transformers name -> LatteConfig field
HF_ATTRIBUTE_MAP = {
    "hidden_size": "dim",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "tie_word_embeddings": "tie_embeddings",
    "num_key_value_heads": "num_kv_heads",
}
# Token ids transformers keeps in config.json; the native model ignores them.
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def is_hf_config(data: dict[str, Any]) -> bool:
    """A config.json written by transformers (it always records its version)."""
    return "transformers_version" in data


def native_config_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A config.json dict written by transformers' `save_pretrained` -> the
    native layout (LatteConfig fields + model_type + architectures)."""
    out = {k: data[k] for k in NATIVE_FIELDS if k in data}
    for alias, name in HF_ATTRIBUTE_MAP.items():
        if alias in data and name not in out:
            out[name] = data[alias]
    if data.get("id2label"):
        out["num_labels"] = len(data["id2label"])
    archs = [a.replace("LatteHF", "Latte") for a in data.get("architectures") or []]
    return {"model_type": data.get("model_type", "latte"), "architectures": archs, **out}
