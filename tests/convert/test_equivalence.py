"""Before any training a converted model is exactly the sliding-window version
of the original, for every supported family: with window >= T it equals the
original; with window < T it equals the original run with a band mask."""

import copy

import pytest
import torch

from latte.convert import ConversionConfig, convert
from tests.convert.families import FAMILIES, VOCAB, build
from tests.helpers import rel_err

T = 40


def ids(B=2, T=T, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def band_mask(window, T=T):
    """Additive 4D mask: query t sees keys (t - window, t]."""
    t = torch.arange(T)
    allowed = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - window)
    return torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_window_covering_the_sequence_equals_the_original(family):
    original = build(family)
    x = ids()
    with torch.no_grad():
        ref = original(x).logits
        converted = convert(copy.deepcopy(original), ConversionConfig(window_size=64, latents_per_head=4)).eval()
        got = converted(x, use_cache=False).logits
    assert rel_err(got, ref) < 1e-4
    # the reference is not trivial: a 16-token window alone differs (local layers aside)
    with torch.no_grad():
        short = convert(copy.deepcopy(original), ConversionConfig(window_size=4, latents_per_head=4)).eval()
        assert rel_err(short(x, use_cache=False).logits, ref) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_short_window_equals_the_band_masked_original(family):
    W = 8  # below every family's own local window (16)
    original = build(family)
    x = ids(B=1)
    with torch.no_grad():
        ref = original(x, attention_mask=band_mask(W)).logits
        conversion = ConversionConfig(window_size=W, num_sinks=0, latents_per_head=4)  # the window alone
        converted = convert(copy.deepcopy(original), conversion).eval()
        got = converted(x, use_cache=False).logits
    assert rel_err(got, ref) < 1e-4


def test_as_original_runs_the_pretrained_model_and_restores():
    original = build("gemma2")
    x = ids()
    converted = convert(copy.deepcopy(original), ConversionConfig(window_size=4, latents_per_head=4)).eval()
    with torch.no_grad():
        swa = converted(x, use_cache=False).logits
        with converted.as_original() as base:
            assert rel_err(base(x).logits, original(x).logits) < 1e-6
        assert torch.equal(converted(x, use_cache=False).logits, swa)


def test_new_parameters_are_only_the_latent_branch_and_beta():
    converted = convert(build("qwen3"), ConversionConfig(latents_per_head=4, lora_rank=2))
    names = list(converted.new_parameters())
    assert names and all(".self_attn." in n for n in names)
    leaf = {n.split(".self_attn.")[1].split(".")[0] for n in names}
    assert leaf == {"mixer", "a_proj", "b_proj", "beta", "lora"}
    # the pretrained weights keep their names (q_norm: Qwen3)
    sd = converted.state_dict()
    assert "base.model.layers.0.self_attn.q_proj.weight" in sd and "base.model.layers.0.self_attn.q_norm.weight" in sd


def test_lora_starts_as_a_no_op():
    original = build("llama")
    x = ids()
    with torch.no_grad():
        a = convert(copy.deepcopy(original), ConversionConfig(window_size=64, latents_per_head=4)).eval()
        b = convert(copy.deepcopy(original), ConversionConfig(window_size=64, latents_per_head=4, lora_rank=4)).eval()
        assert rel_err(b(x, use_cache=False).logits, a(x, use_cache=False).logits) < 1e-6


def test_unsupported_models_fail_clearly():
    import transformers as tf

    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match=r"model_type 'gpt2'.*supported: Llama \(llama\), Mistral"):
        convert(gpt2)
    base = tf.LlamaModel(
        tf.LlamaConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32, vocab_size=50)
    )
    with pytest.raises(ValueError, match="expected a causal LM"):
        convert(base)
    converted = convert(build("llama"))
    with pytest.raises(ValueError, match="model_type 'latte_converted'"):
        convert(converted)
    with pytest.raises(ValueError, match="window_size"):
        ConversionConfig(window_size=0)
    with pytest.raises(ValueError, match="unknown key"):
        ConversionConfig.from_dict({"windw_size": 3})
