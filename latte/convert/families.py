"""Which Hugging Face decoders convert, and what each attention layer needs.

The converted layer reuses the original attention module's own projections,
q/k norms and score scale, and receives the model's own rotary embedding
(cos, sin) from the decoder layer, exactly as the original does; what differs
between families is read here from the module itself, not re-derived from
configs (docs/conversion.md):

  family        model_type     quirks carried over
  Llama         llama          grouped KV heads, RoPE scaling types
  Mistral       mistral        sliding_window on every layer
  Qwen2         qwen2          q/k/v biases, sliding layers (layer_types)
  Qwen3         qwen3          per-head RMSNorm on q and k
  Gemma         gemma          head_dim != dim / heads, scaled embeddings
  Gemma 2       gemma2         query_pre_attn_scalar, attention soft-capping,
                               local/global layers, final logit soft-capping
  Gemma 3       gemma3_text    q/k norms, local/global layers with their own RoPE

Everything outside attention (embeddings, norms, MLPs, head, soft-capping of
logits) is the original module, untouched.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

# model_type -> (the attention class every decoder layer must hold, family name)
SUPPORTED: dict[str, tuple[str, str]] = {
    "llama": ("LlamaAttention", "Llama"),
    "mistral": ("MistralAttention", "Mistral"),
    "qwen2": ("Qwen2Attention", "Qwen2"),
    "qwen3": ("Qwen3Attention", "Qwen3"),
    "gemma": ("GemmaAttention", "Gemma"),
    "gemma2": ("Gemma2Attention", "Gemma 2"),
    "gemma3_text": ("Gemma3Attention", "Gemma 3 (text)"),
}


def supported_list() -> str:
    return ", ".join(f"{name} ({t})" for t, (_, name) in SUPPORTED.items())


@dataclass(frozen=True)
class AttentionSpec:
    """What one pretrained attention layer computes, as the window branch needs it."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # score scale (1/sqrt(head_dim), or query_pre_attn_scalar ** -0.5)
    softcap: float | None  # scores c * tanh(s / c) (Gemma 2), or None
    window: int | None  # the original's own local window (sliding layers), or None
    apply_rope: Callable  # the family's apply_rotary_pos_emb(q, k, cos, sin)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM (`model.model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"{type(model).__name__}: expected decoder layers at .model.layers "
            f"(a Hugging Face *ForCausalLM); supported: {supported_list()}"
        )
    return layers


def rotary_of(model: nn.Module, layer_idx: int) -> tuple[nn.Module, str | None]:
    """What computes layer `layer_idx`'s rotary (cos, sin): the model's
    `rotary_emb` and, where it takes one (Gemma 3: local and global layers
    rotate differently), the layer's type."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if not isinstance(rotary, nn.Module):
        raise ValueError(f"{type(model).__name__}: expected its rotary embedding at .model.rotary_emb")
    if "layer_type" not in inspect.signature(rotary.forward).parameters:
        return rotary, None
    return rotary, model.config.layer_types[layer_idx]


def check_supported(model: nn.Module) -> str:
    """The model_type of a convertible model; a ValueError naming what is
    supported otherwise."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(
            f"model_type {model_type!r} ({type(model).__name__}) cannot be converted; supported: {supported_list()}"
        )
    if not type(model).__name__.endswith("ForCausalLM"):
        raise ValueError(f"{type(model).__name__}: expected a causal LM (*ForCausalLM) of a supported family")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(
            f"{model_type}: use_bidirectional_attention=True is not a causal decoder; "
            "only causal attention converts into Macchiato"
        )
    expected = SUPPORTED[model_type][0]
    for i, layer in enumerate(decoder_layers(model)):
        got = type(getattr(layer, "self_attn", None)).__name__
        if got != expected:
            raise ValueError(
                f"layer {i}: attention is {got}, expected {expected} for model_type {model_type!r} "
                "(already converted, or a modified model)"
            )
    return model_type


def attention_spec(attn: nn.Module, config) -> AttentionSpec:
    """Read one original attention module (after check_supported)."""
    module = sys.modules[type(attn).__module__]
    window = getattr(attn, "sliding_window", None)
    if window is None and config.model_type == "mistral":
        window = getattr(config, "sliding_window", None)  # Mistral: one window for every layer
    softcap = getattr(attn, "attn_logit_softcapping", None)
    return AttentionSpec(
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=attn.head_dim,
        scale=float(attn.scaling),
        softcap=None if softcap is None else float(softcap),
        window=None if window is None else int(window),
        apply_rope=module.apply_rotary_pos_emb,
    )
