"""Hugging Face adapter: Auto classes load a native folder; greedy generate
through transformers == native generate; the cache is the recurrent state."""

import json
import warnings

import pytest
import torch

from latte.models import MIXERS, LatteConfig, LatteForSequenceClassification, from_pretrained

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GenerationMixin,
)

from latte.models import hf  # noqa: E402
from latte.models.hf_cache import output_cache  # noqa: E402

hf.register()


@pytest.fixture
def saved(make_lm, tmp_path):
    def save(mixer, **kw):
        model = make_lm(mixer, **kw)
        model.save_pretrained(tmp_path / "native")
        return model, tmp_path / "native"

    return save


@pytest.mark.parametrize("mixer", MIXERS)
def test_auto_classes_load_native_folder_and_greedy_generate_matches(saved, make_ids, mixer):
    model, path = saved(mixer)
    hfm = AutoModelForCausalLM.from_pretrained(path)
    assert isinstance(hfm, hf.LatteHFForCausalLM) and isinstance(AutoConfig.from_pretrained(path), hf.LatteHFConfig)
    assert hfm.config.to_latte_config() == model.config
    x = make_ids(2, 10)
    assert torch.equal(hfm(x).logits, model(x).logits)
    lengths = []
    hfm.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    ours = model.generate(x, 12, temperature=0)
    theirs = GenerationMixin.generate(hfm, x, max_new_tokens=12, do_sample=False)  # transformers' own loop
    assert torch.equal(theirs, ours)
    assert lengths == [10] + [1] * 11  # prefill once, then one token per step from the cache
    assert torch.equal(hfm.generate(x, max_new_tokens=12, do_sample=False), ours)  # the static step


@pytest.mark.parametrize("mixer", ["latte", "macchiato", "softmax"])
def test_left_padded_batch_and_eos_match_native(saved, make_ids, mixer):
    model, path = saved(mixer)
    hfm = AutoModelForCausalLM.from_pretrained(path)
    x = make_ids(3, 9)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0
    free = model.generate(x, 10, temperature=0, attention_mask=mask)
    eos = int(free[1, 9 + 3])
    ours = model.generate(x, 10, temperature=0, attention_mask=mask, eos_token_id=eos)
    kw = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(GenerationMixin.generate(hfm, x, **kw), ours)  # transformers' own loop
    assert torch.equal(hfm.generate(x, **kw), ours)  # the static step


@pytest.mark.parametrize("name", ["cache", "past_key_values"])  # transformers >= 5.24 and before
def test_cache_is_the_native_state(saved, make_ids, name):
    model, path = saved("swa")
    hfm = AutoModelForCausalLM.from_pretrained(path)
    x = make_ids(2, 12)
    out = hfm(x[:, :8], use_cache=True)
    cache = output_cache(out)
    assert isinstance(cache, hf.LatteHFCache) and cache.get_seq_length() == 8 and len(cache) == 2
    step = hfm(x[:, 8:], **{name: cache}, use_cache=True)
    assert output_cache(step) is cache and cache.get_seq_length() == 12
    torch.testing.assert_close(step.logits, model(x).logits[:, 8:], atol=1e-4, rtol=0)
    cache.reorder_cache(torch.tensor([1]))
    assert cache.batch_size == 1
    with pytest.raises(ValueError, match="LatteHFCache"):
        hfm(x, **{name: transformers.DynamicCache()})
    with pytest.raises(ValueError, match="past_key_values, cache name the same cache"):
        hfm(x, past_key_values=cache, cache=hf.LatteHFCache())


def test_loss_matches_native(saved, make_ids):
    model, path = saved("latte")
    hfm = AutoModelForCausalLM.from_pretrained(path)
    x = make_ids(2, 10)
    torch.testing.assert_close(hfm(x, labels=x).loss, model(x, labels=x).loss, atol=0, rtol=0)


def test_hf_save_loads_natively_and_back(saved, make_ids, tmp_path):
    model, path = saved("macchiato", tie_embeddings=False)
    hfm = AutoModelForCausalLM.from_pretrained(path)
    hfm.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "latte"
    native = from_pretrained(tmp_path / "hf")
    x = make_ids(2, 7)
    assert native.config == model.config and torch.equal(native.eval()(x).logits, model(x).logits)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert torch.equal(again(x).logits, model(x).logits)
    assert torch.equal(hfm.to_native().eval()(x).logits, model(x).logits)


def test_sequence_classification_through_auto(tmp_path, make_ids):
    torch.manual_seed(0)
    model = LatteForSequenceClassification(
        LatteConfig.tiny(
            mixer=["latte", "softmax"], causal=False, num_labels=3, pooling="cls", position_embedding="learned"
        )
    ).eval()
    model.save_pretrained(tmp_path)
    hfm = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert isinstance(hfm, hf.LatteHFForSequenceClassification) and hfm.config.num_labels == 3
    x = make_ids(2, 8)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    labels = torch.tensor([2, 0])
    a, b = hfm(x, attention_mask=mask, labels=labels), model(x, attention_mask=mask, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)


def test_invalid_config_is_reported_by_latte_validation(tmp_path, make_lm):
    make_lm("latte").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "latents_per_head": 0, "mix": "sum"}))
    with pytest.raises(ValueError) as e:
        AutoConfig.from_pretrained(tmp_path)
    assert "latents_per_head: got 0" in str(e.value) and "mix: got 'sum'" in str(e.value)


def test_a_folder_saved_with_num_latents_loads_mapped_exactly(tmp_path, make_lm):
    """A config.json written before latents_per_head (num_latents, the total
    over heads) loads both natively and through transformers."""
    make_lm("macchiato").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    per_head = cfg.pop("latents_per_head")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_latents": per_head * cfg["num_heads"]}))
    with pytest.warns(FutureWarning, match="num_latents"):
        assert AutoConfig.from_pretrained(tmp_path).to_latte_config() == LatteConfig.tiny(mixer="macchiato")
    with pytest.warns(FutureWarning, match="num_latents"):
        assert from_pretrained(tmp_path).config == LatteConfig.tiny(mixer="macchiato")


def test_direct_construction_and_hf_names(make_ids):
    cfg = hf.LatteHFConfig(
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        latents_per_head=2,
        vocab_size=64,
        mixer="latte",
        tie_word_embeddings=False,
        num_labels=5,
    )
    native = cfg.to_latte_config()
    assert (native.dim, native.num_layers, native.num_heads, native.tie_embeddings) == (48, 3, 4, False)
    assert cfg.hidden_size == 48 and cfg.num_labels == 5 and native.num_labels == 5
    torch.manual_seed(0)
    model = hf.LatteHFForCausalLM(cfg).eval()
    assert model.lm_head.weight is not model.model.embed.weight
    out = model(make_ids(2, 6), labels=make_ids(2, 6))
    assert torch.isfinite(out.logits).all() and abs(out.loss.item() - 4.16) < 0.5  # ~ln 64 at init
    assert hf.LatteHFConfig.from_latte_config(native).to_latte_config() == native


def test_resize_token_embeddings_accepts_the_new_ids(saved, make_ids):
    model, path = saved("latte")
    hfm = AutoModelForCausalLM.from_pretrained(path)
    hfm.resize_token_embeddings(70)
    assert hfm.model.config.vocab_size == hfm.config.vocab_size == 70
    assert hfm.lm_head.weight is hfm.model.embed.weight and hfm.lm_head.weight.shape == (70, 32)
    x = torch.tensor([[1, 2, 69, 65]])
    out = hfm(x, labels=x)  # ids 64..69 were rejected before the fix
    assert out.logits.shape == (1, 4, 70) and torch.isfinite(out.loss)
    assert hfm.generate(x, max_new_tokens=2, do_sample=False).shape == (1, 6)
    native = hfm.to_native()
    assert native.config.vocab_size == 70
    with pytest.raises(ValueError, match=r"found id 70, but ids must be in \[0, 69\]"):
        hfm(torch.tensor([[70]]))


def test_gradient_checkpointing_through_transformers(saved, make_ids):
    model, path = saved("macchiato")
    x = make_ids(2, 12)
    grads = []
    for enable in (False, True):
        hfm = AutoModelForCausalLM.from_pretrained(path).train()
        if enable:
            with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing_enable
                warnings.simplefilter("ignore", FutureWarning)
                hfm.gradient_checkpointing_enable()
            assert hfm.model.gradient_checkpointing
        runs = []
        hfm.model.blocks[1].register_forward_pre_hook(lambda *a, runs=runs: runs.append(1))
        hfm(x, labels=x).loss.backward()
        assert len(runs) == (2 if enable else 1)
        grads.append({n: p.grad for n, p in hfm.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5, msg=name)


def test_hf_saved_folder_loads_natively_without_transformers(saved, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    model, path = saved("latte", tie_embeddings=False)
    AutoModelForCausalLM.from_pretrained(path).save_pretrained(tmp_path / "hf")
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of transformers fails
        "from latte.models import from_pretrained\n"
        f"m = from_pretrained({str(tmp_path / 'hf')!r}); print(type(m).__name__, m.config.dim)"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stdout.split() == ["LatteForCausalLM", "32"], out.stderr
