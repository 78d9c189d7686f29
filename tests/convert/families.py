"""Tiny randomly initialised decoders of every supported family, built from
transformers configs (seconds to build and run). Each one exercises its
family's quirks: grouped KV heads, RoPE scaling, biases, q/k norms, head_dim
!= dim / heads, soft-capping, local/global layers."""

import torch
import transformers as tf

VOCAB = 97
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    attn_implementation="eager",
)


def configs():
    return {
        "llama": tf.LlamaConfig(
            **COMMON,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 5000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "mistral": tf.MistralConfig(**COMMON, sliding_window=16),
        "qwen2": tf.Qwen2Config(
            **{**COMMON, "num_hidden_layers": 3}, use_sliding_window=True, sliding_window=16, max_window_layers=1
        ),
        "qwen3": tf.Qwen3Config(**COMMON, head_dim=24),
        "gemma": tf.GemmaConfig(**COMMON, head_dim=32),
        "gemma2": tf.Gemma2Config(
            **COMMON,
            head_dim=16,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=8.0,
            sliding_window=16,
        ),
        "gemma3_text": tf.Gemma3TextConfig(
            **COMMON,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    }


FAMILIES = list(configs())


def build(family, seed=0):
    """A tiny random *ForCausalLM of `family` in eval mode (float32). Weights
    scaled up so attention is far from uniform (a weak test otherwise)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(configs()[family]).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    return model
