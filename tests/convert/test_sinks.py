"""Attention sinks in converted models (ConversionConfig.num_sinks,
docs/math.md §4.1, docs/conversion.md §1), for every supported family:
at beta's initial value the converted model IS the window + sinks model (the
masked original of the sinks evaluation); a window covering the sequence is
still the original; decoding keeps the sinks once in a constant-size cache."""

import copy
import json

import pytest
import torch

from latte.convert import ConversionConfig, MacchiatoCache, convert, load_converted
from latte.convert.distill import calibrate_beta, record_layers
from latte.eval.long_context import converted_nll, original_window_nll
from tests.convert.families import FAMILIES, build
from tests.convert.test_decode_and_io import W, ids, trained_like
from tests.convert.test_equivalence import band_mask
from tests.helpers import rel_err


def sink_mask(window, sinks, T):
    """Additive 4D mask: query t sees keys (t - window, t] and keys < sinks (<= t)."""
    t = torch.arange(T)
    back = t[:, None] - t[None, :]
    allowed = (back >= 0) & ((back < window) | (t[None, :] < sinks))
    return torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("family", FAMILIES)
def test_at_initial_beta_the_converted_model_is_window_plus_sinks(family):
    original = build(family)
    x = ids(B=1, T=40)
    conv = convert(copy.deepcopy(original), ConversionConfig(window_size=W, num_sinks=3, latents_per_head=4)).eval()
    with torch.no_grad():
        ref = original(x, attention_mask=sink_mask(W, 3, 40)).logits
        got = conv(x, use_cache=False).logits
        assert rel_err(got, ref) < 1e-4
        # the sinks matter here: the band alone differs
        assert rel_err(original(x, attention_mask=band_mask(W)).logits, ref) > 1e-3
    # fed 16 tokens at a time through the cache == the sinks stage's masked original
    cached = converted_nll(conv, x[0], contexts=(), chunk=16).nll
    masked = original_window_nll(conv, x[0], window=W, sinks=3).nll
    assert (cached - masked).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_window_covering_the_sequence_is_still_the_original(family):
    original = build(family)
    x = ids()
    conv = convert(copy.deepcopy(original), ConversionConfig(window_size=64, num_sinks=4, latents_per_head=4))
    with torch.no_grad():
        assert rel_err(conv.eval()(x, use_cache=False).logits, original(x).logits) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("prefill", [1, 11])
def test_prefill_then_steps_equal_the_full_forward_with_sinks(family, prefill):
    """Trained-like latents (beta ~ 0); prefill 1: the sinks fill while decoding."""
    model = trained_like(family, num_sinks=2)
    x = ids(T=26)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        out = model(x[:, :prefill], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        sizes = {prefill: cache.nbytes()}  # positions fed: bytes
        for t in range(prefill, x.shape[1]):
            out = model(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits)
            sizes[t + 1] = cache.nbytes()
    assert rel_err(torch.cat(logits, 1), full) < 1e-4
    # the window buffer grows with the first W - 1 positions, then stays; the sinks are
    # stored once, from the first step on: constant from W - 1 positions on
    assert len({n for fed, n in sizes.items() if fed >= W - 1}) == 1
    for layer, attn in zip(cache.states, model.converted):
        sinks = layer.attn.sinks
        assert sinks.k.shape == (2, 2, attn.spec.num_kv_heads, attn.spec.head_dim) and bool(sinks.mask.all())
    with torch.no_grad():  # and the sinks change the result
        plain = trained_like(family)(x, use_cache=False).logits
    assert rel_err(plain, full) > 1e-3


def test_left_padded_batch_generates_like_each_row_alone_with_sinks():
    model = trained_like("qwen2", num_sinks=2)
    a, b = ids(B=1, T=14, seed=3), ids(B=1, T=9, seed=4)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], 1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, max_new_tokens=12, do_sample=False)
        alone = [model.generate(x, max_new_tokens=12, do_sample=False) for x in (a, b)]
    assert both[0, 14:].tolist() == alone[0][0, 14:].tolist()
    assert both[1, 14:].tolist() == alone[1][0, 9:].tolist()


def test_save_load_keeps_the_sinks_and_older_folders_load_without(tmp_path):
    model = trained_like("llama", num_sinks=3).eval()
    model.save_pretrained(tmp_path / "m")
    x = ids()
    with torch.no_grad():
        ref = model(x, use_cache=False).logits
        loaded = load_converted(tmp_path / "m")
        assert loaded.conversion.num_sinks == 3 and torch.equal(loaded(x, use_cache=False).logits, ref)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    del cfg["conversion"]["num_sinks"]  # a folder written before sinks existed
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert load_converted(tmp_path / "m").conversion.num_sinks == 0
    with pytest.raises(ValueError, match="num_sinks: got -1"):
        ConversionConfig(num_sinks=-1)


def test_cache_reorders_the_sinks_with_the_rows():
    model = trained_like("llama", num_sinks=2)
    with torch.no_grad():
        cache = model(ids(T=12), use_cache=True).past_key_values
    assert isinstance(cache, MacchiatoCache)
    first = cache.states[0].attn.sinks.k.clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(cache.states[0].attn.sinks.k, first.flip(0))


def test_calibration_counts_the_sinks_as_seen():
    """The latents start with the mass the window AND the sinks lost: with
    every key but the window's and the sinks' in the latents' share, the
    joint normaliser equals the original's (median over tokens)."""
    model = convert(build("llama"), ConversionConfig(window_size=W, num_sinks=2, latents_per_head=4, qk_mixer="none"))
    with torch.no_grad():
        for attn in model.converted:
            attn.a_proj.weight.zero_()
    records = record_layers(model, ids(T=40))
    calibrate_beta(model, records)
    for attn, rec in zip(model.converted, records):
        q, k, _ = attn._qkv(rec.x, rec.position_embeddings)
        k = k.repeat_interleave(q.shape[2] // k.shape[2], 2)
        e = torch.einsum("bthe,bshe->bhts", q.double(), k.double()) * attn.spec.scale
        t = torch.arange(40)
        outside = (t[None, :] <= t[:, None] - W) & (t[None, :] >= 2)  # neither window nor sink
        lost = torch.logsumexp(e.masked_fill(~outside, float("-inf")), -1)[:, :, W + 2 :]
        ref = lost.permute(0, 2, 1).flatten(0, 1).median(0).values - torch.log(torch.tensor(4.0))
        assert torch.allclose(attn.beta, ref.float(), atol=1e-3)


def test_as_sliding_window_with_sinks_is_the_masked_original_and_restores():
    model = trained_like("gemma3_text", lora_rank=2, num_sinks=1)  # local layers: window 8 < their 16
    x = ids(B=1, T=40)[0]
    before = converted_nll(model, x, contexts=(), chunk=16).nll
    for k in (0, 4):
        with model.as_sliding_window(num_sinks=k):
            assert [a.num_sinks for a in model.converted] == [k, k]
            got = converted_nll(model, x, contexts=(), chunk=16).nll
        assert (got - original_window_nll(model, x, window=W, sinks=k).nll).abs().max() < 1e-4
    assert [a.num_sinks for a in model.converted] == [1, 1]
    assert torch.equal(converted_nll(model, x, contexts=(), chunk=16).nll, before)
    with pytest.raises(ValueError, match="num_sinks"), model.as_sliding_window(num_sinks=-2):
        pass


def test_with_sinks_switches_off_the_sinks_alone_and_restores():
    """The sinks ablation `converted-nosinks` of latte/eval/subjects.py:
    with_sinks(0) on weights up-trained with sinks is the same weights
    converted without them (latents, beta and LoRA kept)."""
    model = trained_like("llama", lora_rank=2, num_sinks=2)
    plain = trained_like("llama", lora_rank=2, num_sinks=0)  # the same new parameters (same seed)
    x = ids(B=1, T=40)[0]
    before = converted_nll(model, x, contexts=(), chunk=16).nll
    with model.with_sinks(0):
        assert [a.num_sinks for a in model.converted] == [0] * len(model.converted)
        assert model.converted[0].lora is not None
        got = converted_nll(model, x, contexts=(), chunk=16).nll
    assert (got - converted_nll(plain, x, contexts=(), chunk=16).nll).abs().max() < 1e-5
    assert (got - before).abs().max() > 1e-3  # the sinks mattered
    assert [a.num_sinks for a in model.converted] == [2] * len(model.converted)
    assert torch.equal(converted_nll(model, x, contexts=(), chunk=16).nll, before)
    with pytest.raises(ValueError, match="num_sinks"), model.with_sinks(-1):
        pass


# sink_positions="cache": the sinks scored at a fixed offset, as StreamingLLM counts positions in its cache


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_sink_positions_rotate_every_sink_query_to_one_position(family):
    """Every query scores the sinks as if it sat at P = window + sinks - 1,
    with the model's own rotary for that layer (Gemma 3: its layer type)."""
    model = trained_like(family, num_sinks=2, sink_positions="cache")
    P = W + 2 - 1
    x = ids(B=1, T=P + 9)
    records = record_layers(model, x)
    for attn, rec in zip(model.converted, records):
        q0, k0, _ = attn._unrotated_qkv(rec.x)
        got = attn._sink_queries(q0, rec.x)
        if attn.num_sinks == 0:  # a native local layer kept at its own window gets no sinks
            assert got is None
            continue
        module, layer_type = attn.rotary
        at = torch.full((1, x.shape[1]), P)
        pe = module(rec.x, at) if layer_type is None else module(rec.x, at, layer_type)
        assert torch.equal(got, attn._rope(q0, k0, pe)[0])
        q = attn._rope(q0, k0, rec.position_embeddings)[0]  # the real positions
        assert rel_err(got[:, P], q[:, P]) < 1e-6 and rel_err(got[:, P + 5], q[:, P + 5]) > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_sink_positions_decode_like_the_full_forward(family):
    model = trained_like(family, num_sinks=2, sink_positions="cache")
    x = ids(T=26)
    with torch.no_grad():
        full = model(x, use_cache=False).logits
        out = model(x[:, :5], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        for t in range(5, x.shape[1]):
            logits.append(model(x[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
        assert rel_err(torch.cat(logits, 1), full) < 1e-4
        with model.with_sinks(positions="absolute"):  # the queries before the first sink leaves the window agree
            absolute = model(x, use_cache=False).logits
    assert rel_err(absolute[:, :W], full[:, :W]) < 1e-6 and rel_err(absolute[:, W + 4 :], full[:, W + 4 :]) > 1e-4


def test_cache_sink_positions_are_saved_and_checked(tmp_path):
    model = trained_like("llama", num_sinks=3, sink_positions="cache").eval()
    model.save_pretrained(tmp_path / "m")
    x = ids()
    with torch.no_grad():
        loaded = load_converted(tmp_path / "m")
        assert loaded.conversion.sink_positions == "cache"
        assert torch.equal(loaded(x, use_cache=False).logits, model(x, use_cache=False).logits)
    with pytest.raises(ValueError, match="sink_positions: got 'far'"):
        ConversionConfig(sink_positions="far")
    with pytest.raises(ValueError, match="positions: expected one of"), model.with_sinks(positions="far"):
        pass
