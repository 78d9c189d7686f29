"""Constant-size decoding (prefill + steps == full forward, HF generate,
latte's streaming loop, left padding) and save/load of converted models."""

import copy

import pytest
import torch

from latte.convert import (
    ConversionConfig,
    MacchiatoCache,
    base_reference,
    convert,
    convert_pretrained,
    load_converted,
    register,
)
from latte.eval.generation import stream_tokens
from latte.models.hf_cache import output_cache
from tests.convert.families import FAMILIES, VOCAB, build
from tests.helpers import rel_err

W = 8


def ids(B=2, T=30, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def trained_like(family, seed=0, **conversion):
    """A converted model whose latents carry weight (beta ~ 0, as after
    training), so the latent state matters in every check below."""
    cfg = ConversionConfig(**{"window_size": W, "latents_per_head": 4, **conversion})
    model = convert(build(family, seed), cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.new_parameters().values():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 0.2))
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_steps_equal_the_full_forward(family):
    model = trained_like(family)
    x = ids()
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        out = model(x[:, :11], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        size = cache.nbytes()
        for t in range(11, x.shape[1]):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
    assert isinstance(cache, MacchiatoCache) and cache.get_seq_length() == x.shape[1]
    assert cache.nbytes() == size  # constant in the context
    assert rel_err(torch.cat(logits, 1), full) < 1e-4
    # the latents matter: the sliding-window model alone differs
    with torch.no_grad():
        for attn in model.converted:
            attn.beta.fill_(-30.0)
        assert rel_err(model(x, use_cache=False).logits, full) > 1e-3


@pytest.mark.parametrize("name", ["cache", "past_key_values", "state"])
def test_the_cache_is_taken_under_each_of_its_names(name):
    """`cache` (transformers >= 5.24), `past_key_values` (before) and
    latte's `state` name the same argument; the output holds the cache
    under the installed transformers' name."""
    model = trained_like("llama")
    x = ids(T=12)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        cache = output_cache(model(x[:, :8], use_cache=True))
        step = model(x[:, 8:], **{name: cache}, use_cache=True)
    assert output_cache(step) is step.state is cache and cache.get_seq_length() == 12
    assert rel_err(step.logits, full[:, 8:]) < 1e-4
    with pytest.raises(ValueError, match="name the same cache"):
        model(x, **{name: cache}, **{"cache" if name != "cache" else "state": MacchiatoCache(model.num_layers)})


@pytest.mark.parametrize("mix,mixer", [("gate", "conv_rglru"), ("joint", "none")])
def test_chunked_prefill_with_other_mixers(mix, mixer):
    model = trained_like("qwen2", mix=mix, qk_mixer=mixer)
    x = ids(T=33)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        cache = MacchiatoCache(model.num_layers)
        parts = [model(x[:, i : i + 10], past_key_values=cache).logits for i in range(0, 33, 10)]
    assert rel_err(torch.cat(parts, 1), full) < 1e-4


def test_hf_generate_and_streaming_agree_with_greedy_steps():
    model = trained_like("llama")
    prompt = ids(B=1, T=12)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=10, do_sample=False)
        streamed = list(stream_tokens(model, prompt[0].tolist(), 10, temperature=0))
        seq = prompt.clone()  # greedy by full forwards, no cache at all
        for _ in range(10):
            nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert out[0, 12:].tolist() == streamed == seq[0, 12:].tolist()


def test_left_padded_batch_generates_like_each_row_alone():
    model = trained_like("gemma2")
    a, b = ids(B=1, T=14, seed=3), ids(B=1, T=9, seed=4)
    pad = torch.zeros(1, 5, dtype=torch.long)
    batch = torch.cat([a, torch.cat([pad, b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False)
        alone = [model.generate(x, max_new_tokens=6, do_sample=False) for x in (a, b)]
        streamed = torch.stack(list(model.stream(batch, 6, temperature=0, attention_mask=mask)), 1)
    assert both[0, 14:].tolist() == alone[0][0, 14:].tolist()
    assert both[1, 14:].tolist() == alone[1][0, 9:].tolist()
    assert streamed.tolist() == both[:, 14:].tolist()  # latte's native streaming, same tokens


def test_cache_is_constant_while_a_kv_cache_grows():
    model = trained_like("mistral")
    with torch.no_grad():
        short = model(ids(T=20), use_cache=True).past_key_values.nbytes()
        long = model(ids(T=120), use_cache=True).past_key_values.nbytes()
    assert short == long > 0


def test_wrong_cache_and_masks_are_clear_errors():
    from transformers import DynamicCache

    model = trained_like("llama")
    x = ids()
    with pytest.raises(ValueError, match="MacchiatoCache"):
        model(x, past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="2D padding mask"):
        model(x, attention_mask=torch.ones(2, 1, 30, 30))


@pytest.mark.parametrize("self_contained", [True, False])
def test_save_load_round_trip(tmp_path, self_contained):
    original = build("gemma3_text")
    original.save_pretrained(tmp_path / "base")
    if self_contained:
        model = convert(copy.deepcopy(original), ConversionConfig(window_size=W, latents_per_head=4))
    else:
        model = convert_pretrained(tmp_path / "base", ConversionConfig(window_size=W, latents_per_head=4))
    with torch.no_grad():
        for p in model.new_parameters().values():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval().save_pretrained(tmp_path / "converted")
    saved = (tmp_path / "converted" / "model.safetensors").stat().st_size
    base_size = sum(p.numel() * 4 for p in original.parameters())
    assert (saved > base_size) if self_contained else (saved < base_size / 2)
    x = ids()
    with torch.no_grad():
        ref = model(x, use_cache=False).logits
        loaded = load_converted(tmp_path / "converted")
        assert torch.equal(loaded(x, use_cache=False).logits, ref)
        register()
        from transformers import AutoModelForCausalLM

        auto = AutoModelForCausalLM.from_pretrained(tmp_path / "converted")
        assert type(auto).__name__ == "ConvertedForCausalLM"
        assert torch.equal(auto(x, use_cache=False).logits, ref)


def test_reference_checks_the_base_weights(tmp_path):
    build("llama").save_pretrained(tmp_path / "base")
    ref = base_reference(tmp_path / "base")
    assert set(ref["sha256"]) == {"config.json", "model.safetensors"}
    model = convert_pretrained(tmp_path / "base", ConversionConfig(latents_per_head=4))
    model.save_pretrained(tmp_path / "converted")
    build("llama", seed=5).save_pretrained(tmp_path / "base")  # different weights, same place
    with pytest.raises(ValueError, match="sha256 .* differs"):
        load_converted(tmp_path / "converted")
    with pytest.raises(FileNotFoundError, match="base weights not found"):
        load_converted(tmp_path / "converted", base_path=tmp_path / "elsewhere")
    unreferenced = convert(build("llama"))
    with pytest.raises(ValueError, match="self_contained=False needs a base reference"):
        unreferenced.save_pretrained(tmp_path / "x", self_contained=False)
