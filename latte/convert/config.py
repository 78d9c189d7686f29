"""Configs of converted models: ConversionConfig (how each attention becomes
Macchiato) and ConvertedConfig (the config.json of a converted model)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from transformers import AutoConfig, PreTrainedConfig
from transformers.configuration_utils import SubConfigSpec

from latte._checks import MAX_WINDOW, WINDOW_ALLOWED, is_int, is_real
from latte.config_io import ConfigErrors, build
from latte.layers import QK_MIXERS
from latte.ops.backend import BACKENDS
from latte.ops.window.memory import MAX_MEMORY_SLOTS, MEMORY_RULES

MIXES = ("joint", "gate")


# beta at which the latents carry exactly zero weight in float32: the converted
# model is then exactly the sliding-window version of the original
PURE_WINDOW_BETA = -30.0


SINK_POSITIONS = ("absolute", "cache")


@dataclass
class ConversionConfig:
    """How every attention becomes Macchiato (docs/conversion.md §1).

    window_size: tokens the pretrained attention keeps seeing (itself
        included); capped per layer by the original's own local window.
    num_sinks: the first tokens of the sequence every query also keeps
        seeing (attention sinks, docs/math.md §4.1; docs/conversion.md §8
        says how the default was chosen); 0 = the window alone.
    sink_positions: "absolute" (a sink keeps its own rotary position, so its
        distance to the query grows with the context) or "cache" (the sinks
        are scored as if they sat just before the window, at a fixed
        distance, as StreamingLLM counts positions inside its cache:
        docs/math.md §4.1).
    memory_slots, memory_rule: up to memory_slots exact tokens beyond the
        window per layer and key/value head, chosen by memory_rule
        (docs/math.md §4.2); 0 = none. Nothing is trained for them, so they
        can be set on a converted model afterwards (`--set
        conversion.memory_slots=64`).
    memory_positions: "absolute" (a slot keeps its key's own rotary
        position) or "cache" (slot i sits at num_sinks + i, the window after
        the slots; with sink_positions "cache" the sinks' query position
        moves past the slots too: docs/math.md §4.2).
    latents_per_head: L, new latent states per query head.
    qk_mixer, conv_size: the latent branch's input mixer (latte.layers.QKMixer).
    mix: "joint" (one normaliser over window scores and latent logits) or "gate".
    beta_init: initial latent bias; very negative = exactly the sliding-window
        model (-30 leaves the latents exactly zero weight in float32).
    chunk_size: chunk of the latent kernel.
    backend: the op's kernels, saved with the model, as LatteConfig.backend
        ("auto": the process default; a saved "fla" where it cannot run is
        refused, naming `--set conversion.backend=torch`).
    lora_rank, lora_alpha: LoRA on q/k/v/o (rank 0 = off).
    """

    window_size: int = 128
    num_sinks: int = 4  # measured: results/convert-sinks (docs/conversion.md §8)
    sink_positions: Literal["absolute", "cache"] = "absolute"
    memory_slots: int = 0
    memory_rule: Literal[MEMORY_RULES] = "recall"
    memory_positions: Literal["absolute", "cache"] = "absolute"
    latents_per_head: int = 32
    qk_mixer: Literal["none", "conv", "rglru", "conv_rglru"] = "conv"
    conv_size: int = 4
    mix: Literal["joint", "gate"] = "joint"
    beta_init: float = PURE_WINDOW_BETA
    chunk_size: int = 64
    backend: Literal["auto", "torch", "fla"] = "auto"
    lora_rank: int = 0
    lora_alpha: float = 16.0

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        for name in ("window_size", "latents_per_head", "conv_size", "chunk_size"):
            v = getattr(self, name)
            e.check(is_int(v) and v >= 1, name, v, "an integer >= 1")
        v = self.window_size
        if is_int(v) and v >= 1:
            e.check(v <= MAX_WINDOW, "window_size", v, WINDOW_ALLOWED)
        e.check(
            is_int(self.lora_rank) and self.lora_rank >= 0, "lora_rank", self.lora_rank, "an integer >= 0 (0 = off)"
        )
        e.check(
            is_int(self.num_sinks) and self.num_sinks >= 0, "num_sinks", self.num_sinks, "an integer >= 0 (0 = none)"
        )
        slots, allowed = self.memory_slots, f"an integer in [0, {MAX_MEMORY_SLOTS}] (0 = none)"
        e.check(is_int(slots) and 0 <= slots <= MAX_MEMORY_SLOTS, "memory_slots", slots, allowed)
        e.check(self.memory_rule in MEMORY_RULES, "memory_rule", self.memory_rule, f"one of {MEMORY_RULES}")
        where = self.memory_positions
        e.check(where in SINK_POSITIONS, "memory_positions", where, f"one of {SINK_POSITIONS}")
        positions = self.sink_positions
        e.check(positions in SINK_POSITIONS, "sink_positions", positions, f"one of {SINK_POSITIONS}")
        e.check(self.qk_mixer in QK_MIXERS, "qk_mixer", self.qk_mixer, f"one of {QK_MIXERS}")
        e.check(self.mix in MIXES, "mix", self.mix, f"one of {MIXES}")
        e.check(self.backend in BACKENDS, "backend", self.backend, f"one of {BACKENDS}")
        for name in ("beta_init", "lora_alpha"):
            v = getattr(self, name)
            e.check(is_real(v) and math.isfinite(v), name, v, "a finite number")
        e.raise_if_any()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "conversion") -> ConversionConfig:
        return build(cls, dict(data), where=where)


class ConvertedConfig(PreTrainedConfig):
    """config.json of a converted model: the original's config (`text_config`),
    the ConversionConfig (`conversion`) and, when the base weights are not
    stored with the model, a reference to them (`base_weights`: path,
    gguf_file, sha256 of each file loading reads); `weights_sha256` is
    the sha256 of the folder's own model.safetensors."""

    model_type = "latte_converted"
    sub_configs_defaults = {"text_config": SubConfigSpec(AutoConfig, model_type="llama")}

    text_config: dict | PreTrainedConfig | None = None
    conversion: dict | None = None
    base_weights: dict | None = None
    weights_sha256: str | None = None  # of the folder's model.safetensors, written by save_converted
    original_attn_implementation: str | None = None
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        conversion = dict(self.conversion or {})
        if conversion and "num_sinks" not in conversion:  # written before sinks existed: it had none
            conversion["num_sinks"] = 0
        self.conversion = ConversionConfig.from_dict(conversion, where="config.conversion").to_dict()
        super().__post_init__(**kwargs)
        for name in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(self, name, None) is None:  # generation reads these at the top level
                setattr(self, name, getattr(self.text_config, name, None))
        self.tie_word_embeddings = False  # the base model ties its own weights
