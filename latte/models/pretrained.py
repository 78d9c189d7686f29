"""Model folders: `config.json` (the LatteConfig fields plus `model_type:
"latte"` and `architectures: [class name]`) beside `model.safetensors` (the
format of `latte.models.weights`). The Hugging Face adapter reads the same
folder, and a folder written by transformers loads here too, without
transformers (its spelling of the fields is below, `HF_ATTRIBUTE_MAP`; the
adapter `latte.models.hf` uses the same map for its attribute aliases; the
rest of the package speaks only the native names).

`PretrainedMixin` gives the model classes `save_pretrained`,
`from_pretrained` (into that class), `num_parameters` and the activation
checkpointing switch; every class that uses it is recorded by its name, so
`from_pretrained(directory)` opens a folder as the class its config.json
names without importing the classes here (they import this module).

`export_for_transformers` (`latte export RUN_DIR OUT_DIR`) writes a folder
that transformers opens as it opens any causal LM:

    from latte.models import hf; hf.register()
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pipeline("text-generation", model=model, tokenizer=tokenizer)

  config.json             the native config + bos/eos/pad token ids
  model.safetensors       latte.models.weights (tied weights once, mode 0644)
  generation_config.json  eos = the end-of-document token, so generate and the
                          pipeline stop at a document's end
  tokenizer.json, tokenizer_config.json, special_tokens_map.json
                          a PreTrainedTokenizerFast with the end-of-document
                          token as eos, bos and pad (GPT-2's convention), and
                          left padding (batched generation pads on the left)

It needs transformers (the `hf` extra) for the tokenizer files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from .._version import __version__
from ..files import atomic_write
from .config import LatteConfig, read_json
from .weights import WEIGHTS_NAME, load_weights, save_weights

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
MODEL_TYPE = "latte"
NATIVE_FIELDS = tuple(f.name for f in dataclasses.fields(LatteConfig))
# keys of older config.json files that LatteConfig.upgrade_keys still maps
DEPRECATED_FIELDS = ("num_latents",)
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

# Keys of config.json beside the LatteConfig fields (ignored when building it).
META_KEYS = ("model_type", "architectures", "latte_version", *TOKEN_ID_KEYS)
# class name -> model class, filled by @architecture on the model classes
ARCHITECTURES: dict[str, type] = {}


def save_pretrained(
    model: nn.Module, directory: str | os.PathLike, *, extra_config: dict[str, Any] | None = None
) -> None:
    """Writes `directory/config.json` and `directory/model.safetensors`;
    extra_config adds keys to config.json (only META_KEYS: token ids)."""
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


def architecture(cls: type) -> type:
    """Records a model class under its name, for `from_pretrained(directory)`."""
    ARCHITECTURES[cls.__name__] = cls
    return cls


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


def is_hf_config(data: dict[str, Any]) -> bool:
    """A config.json written by transformers (it always records its version)."""
    return "transformers_version" in data


def native_config_dict(data: dict[str, Any]) -> dict[str, Any]:
    """A config.json dict written by transformers' `save_pretrained` -> the
    native layout (LatteConfig fields + model_type + architectures)."""
    out = {k: data[k] for k in (*NATIVE_FIELDS, *DEPRECATED_FIELDS) if k in data}
    for alias, name in HF_ATTRIBUTE_MAP.items():
        if alias in data and name not in out:
            out[name] = data[alias]
    if data.get("id2label"):
        out["num_labels"] = len(data["id2label"])
    archs = [a.replace("LatteHF", "Latte") for a in data.get("architectures") or []]
    return {"model_type": data.get("model_type", "latte"), "architectures": archs, **out}


# ---- the folder `latte export` writes for transformers -------------------------


def _import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("exporting for transformers needs it: pip install 'latte[hf]'") from e
    return transformers


def transformers_tokenizer(tokenizer):
    """A `PreTrainedTokenizerFast` for a latte.data Tokenizer (tokenizer.json
    kind) with the end-of-document token as eos, bos and pad."""
    transformers = _import_transformers()
    if tokenizer.kind != "hf":
        raise ValueError(
            f"tokenizer: export supports tokenizer.json tokenizers, got a {tokenizer.kind} one "
            "(a tiktoken rank file has no transformers tokenizer to write)"
        )
    eos = tokenizer.decode([tokenizer.eos_id])
    with tempfile.TemporaryDirectory() as tmp:
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer.save(tmp)),
            eos_token=eos,
            bos_token=eos,
            pad_token=eos,
            padding_side="left",
            clean_up_tokenization_spaces=False,
        )
    fast.model_max_length = int(1e30)  # no length limit (transformers' own "unset" value)
    return fast


def export_for_transformers(model: nn.Module, tokenizer, directory: str | os.PathLike) -> Path:
    """Writes `model` (a LatteForCausalLM) and `tokenizer` (latte.data
    Tokenizer) into `directory` as transformers expects them; returns it."""
    transformers = _import_transformers()
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer: {tokenizer.vocab_size} tokens, but the model's vocab_size is {model.config.vocab_size}"
        )
    d = Path(directory)
    fast = transformers_tokenizer(tokenizer)  # before writing anything: fails on a tiktoken run
    eos = tokenizer.eos_id
    ids = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
    model.save_pretrained(d, extra_config=ids)
    transformers.GenerationConfig(**ids).save_pretrained(d)
    fast.save_pretrained(d)
    return d
