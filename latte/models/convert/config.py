"""Configs of converted models: ConversionConfig (how each attention becomes
Macchiato) and ConvertedConfig (the config.json of a converted model)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from latte.layers import QK_MIXERS

MIXES = ("joint", "gate")


@dataclass(frozen=True)
class ConversionConfig:
    """How every attention becomes Macchiato (docs/conversion.md).

    window_size: tokens the pretrained attention keeps seeing (itself
        included); capped per layer by the original's own local window.
    latents_per_head: L, new latent states per query head.
    qk_mixer, conv_size: the latent branch's input mixer (latte.layers.QKMixer).
    mix: "joint" (one normaliser over window scores and latent logits) or "gate".
    beta_init: initial latent bias; very negative = exactly the sliding-window
        model (-30 leaves the latents exactly zero weight in float32).
    chunk_size: chunk of the latent kernel.
    lora_rank, lora_alpha: LoRA on q/k/v/o (0 = off).
    """

    window_size: int = 128
    latents_per_head: int = 32
    qk_mixer: str = "conv"
    conv_size: int = 4
    mix: str = "joint"
    beta_init: float = -30.0
    chunk_size: int = 64
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def __post_init__(self):
        for name in ("window_size", "latents_per_head", "conv_size", "chunk_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ConversionConfig.{name}: expected an integer >= 1, got {v!r}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"ConversionConfig.lora_rank: expected an integer >= 0 (0 = no LoRA), got {self.lora_rank!r}")
        if self.qk_mixer not in QK_MIXERS:
            raise ValueError(f"ConversionConfig.qk_mixer: expected one of {QK_MIXERS}, got {self.qk_mixer!r}")
        if self.mix not in MIXES:
            raise ValueError(f"ConversionConfig.mix: expected one of {MIXES}, got {self.mix!r}")
        for name in ("beta_init", "lora_alpha"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
                raise ValueError(f"ConversionConfig.{name}: expected a number, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "conversion") -> "ConversionConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(known)}")
        return cls(**data)


class ConvertedConfig(PreTrainedConfig):
    """config.json of a converted model: the original's config (`text_config`),
    the ConversionConfig (`conversion`) and, when the base weights are not
    stored with the model, a reference to them (`base_weights`: path,
    gguf_file, sha256 of each weight file)."""

    model_type = "latte_converted"
    sub_configs_defaults = {"text_config": SubConfigSpec(AutoConfig, model_type="llama")}

    text_config: dict | PreTrainedConfig | None = None
    conversion: dict | None = None
    base_weights: dict | None = None
    original_attn_implementation: str | None = None
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        self.conversion = ConversionConfig.from_dict(self.conversion or {}, where="config.conversion").to_dict()
        super().__post_init__(**kwargs)
        for name in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self, name, None) is None:  # generation reads these at the top level
                setattr(self, name, getattr(self.text_config, name, None))
        self.tie_word_embeddings = False  # the base model ties its own weights
