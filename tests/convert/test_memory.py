"""Memory slots in converted models (ConversionConfig.memory_slots,
docs/math.md §4.2): decoding equals the full forward and keeps the slots in
a constant-size cache, the fields are saved and older folders load without
them, and the oracle rule brings back a token the window cannot see."""

import dataclasses
import json

import pytest
import torch

from latte.convert import ConversionConfig, convert, load_converted
from latte.layers.macchiato_attention import memory_marks
from tests.convert.families import FAMILIES, build
from tests.convert.test_decode_and_io import W, ids, trained_like
from tests.helpers import rel_err


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_steps_equal_the_full_forward_with_slots(family):
    model = trained_like(family, num_sinks=1, memory_slots=3, memory_rule="recall")
    x = ids(T=26)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        out = model(x[:, :11], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        sizes = {cache.nbytes()}
        for t in range(11, x.shape[1]):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
            sizes.add(cache.nbytes())
        plain = trained_like(family, num_sinks=1)(x, use_cache=False).logits
    assert rel_err(torch.cat(logits, 1), full) < 1e-4
    assert len(sizes) == 1  # constant: M slots per layer and KV head
    assert rel_err(plain, full) > 1e-3  # and the slots change the result
    for layer, attn in zip(cache.states, model.converted):
        assert layer.attn.memory.k.shape == (2, 3, attn.spec.num_kv_heads, attn.spec.head_dim)


def test_save_load_keeps_the_slots_and_older_folders_load_without(tmp_path):
    model = trained_like("llama", memory_slots=2, memory_rule="key_norm").eval()
    model.save_pretrained(tmp_path / "m")
    x = ids()
    with torch.no_grad():
        loaded = load_converted(tmp_path / "m")
        assert (loaded.conversion.memory_slots, loaded.conversion.memory_rule) == (2, "key_norm")
        assert torch.equal(loaded(x, use_cache=False).logits, model(x, use_cache=False).logits)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    del cfg["conversion"]["memory_slots"], cfg["conversion"]["memory_rule"]  # written before the slots
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert load_converted(tmp_path / "m").conversion.memory_slots == 0
    with pytest.raises(ValueError, match=r"memory_slots: got 5000"):
        ConversionConfig(memory_slots=5000)
    with pytest.raises(ValueError, match="memory_rule: got 'best'"):
        ConversionConfig(memory_rule="best")


def test_oracle_slot_brings_back_a_needle_the_window_cannot_see():
    """At beta's initial value (the latents carry no weight) the last token
    of a 2-layer model sees 2 (W - 1) tokens back at most: a needle at
    position 3 of 30 cannot change its logits, unless a slot holds it."""
    cfg = ConversionConfig(window_size=W, num_sinks=0, latents_per_head=4, memory_slots=2, memory_rule="oracle")
    model = convert(build("llama"), cfg).eval()
    x = ids(B=1, T=30)
    y = x.clone()
    y[0, 3] = (x[0, 3] + 1) % 64  # another needle
    mark = torch.zeros(1, 30, dtype=torch.bool)
    mark[0, 3] = True
    with torch.no_grad():
        blind = [model(z, use_cache=False).logits[0, -1] for z in (x, y)]
        with memory_marks(model, mark):
            seen = [model(z, use_cache=False).logits[0, -1] for z in (x, y)]
        window = convert(build("llama"), dataclasses.replace(cfg, memory_slots=0)).eval()
        assert torch.equal(window(x, use_cache=False).logits[0, -1], blind[0])  # no mark: the window model
    assert torch.equal(blind[0], blind[1])
    assert (seen[0] - seen[1]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_slots_at_fixed_positions_decode_like_the_full_forward(family):
    """memory_positions "cache": the slots read at positions num_sinks + i,
    the queries at num_sinks + M + window_size - 1 (the sinks' too)."""
    kw = dict(num_sinks=2, sink_positions="cache", memory_slots=3, memory_rule="key_norm")
    model = trained_like(family, memory_positions="cache", **kw)
    x = ids(T=28)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        out = model(x[:, :12], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        for t in range(12, x.shape[1]):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
        absolute = trained_like(family, **kw)(x, use_cache=False).logits
    assert rel_err(torch.cat(logits, 1), full) < 1e-4
    assert rel_err(absolute, full) > 1e-3  # the positions matter
    with pytest.raises(ValueError, match="memory_positions: got 'near'"):
        ConversionConfig(memory_positions="near")


@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_left_padded_batch_generates_like_each_row_alone_with_slots(positions):
    """A slot's position is its count of real tokens before it, as the
    rotary positions generate derives from the attention mask."""
    model = trained_like("qwen2", num_sinks=1, memory_slots=2, memory_rule="key_norm", memory_positions=positions)
    a, b = ids(B=1, T=20, seed=3), ids(B=1, T=15, seed=4)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=10, do_sample=False)
        alone = [model.generate(x, max_new_tokens=10, do_sample=False) for x in (a, b)]
    assert both[0, 20:].tolist() == alone[0][0, 20:].tolist()
    assert both[1, 20:].tolist() == alone[1][0, 15:].tolist()


def test_cache_reorders_the_slots_with_the_rows():
    model = trained_like("llama", memory_slots=2)
    with torch.no_grad():
        cache = model(ids(T=20), use_cache=True).past_key_values
    first = cache.states[0].attn.memory.k.clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(cache.states[0].attn.memory.k, first.flip(0))
