"""The Hugging Face adapters' generate (native LatteHFForCausalLM and the
converted model) through latte's static decoding step (latte/models/
hf_generate.py): greedy output equal to transformers' own loop
(GenerationMixin.generate), finished rows padded as transformers pads them,
and any other request handed to transformers' loop, said in a log line."""

import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GenerationMixin  # noqa: E402

from latte.models import hf  # noqa: E402
from latte.models.hf import LatteHFConfig, LatteHFForCausalLM  # noqa: E402

LOG = "latte.generate"


def _hf_model(make_lm, mixer, **overrides):
    native = make_lm(mixer, **overrides)
    model = LatteHFForCausalLM(LatteHFConfig.from_latte_config(native.config)).eval()
    model.load_state_dict(native.state_dict())
    return model


def _left_padded(make_ids):
    x = make_ids(3, 9, seed=4)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :6] = 0
    return x, mask


def _calls(model) -> list:
    """Records each forward of the adapter (transformers' loop calls it per token)."""
    calls = []
    model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    return calls


@pytest.mark.parametrize("mixer", ["latte", "macchiato", "softmax", "swa"])
def test_native_adapter_greedy_equals_transformers_loop_with_eos_and_pad(make_lm, make_ids, mixer, caplog):
    model = _hf_model(make_lm, mixer, **({"num_sinks": 1, "memory_slots": 2} if mixer == "macchiato" else {}))
    x, mask = _left_padded(make_ids)
    free = GenerationMixin.generate(model, x, attention_mask=mask, max_new_tokens=12, do_sample=False)
    eos = [int(free[0, 9 + 3]), int(free[2, 9 + 6])]  # two rows stop early, at different steps
    kw = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=1)
    want = GenerationMixin.generate(model, x, **kw)
    calls = _calls(model)
    with caplog.at_level(logging.INFO, logger=LOG):
        got = model.generate(x, **kw)
    assert torch.equal(got, want)
    assert not calls  # not one forward of transformers' loop
    assert "static decoding step" in caplog.text
    assert (want[:, 9:] == 1).any()  # the pad fill was exercised


def test_a_request_beyond_a_plain_decode_goes_to_transformers_loop(make_lm, make_ids, caplog):
    model = _hf_model(make_lm, "latte")
    x = make_ids(2, 6)
    kw = dict(max_new_tokens=5, do_sample=False, repetition_penalty=1.5)
    with caplog.at_level(logging.INFO, logger=LOG):
        got = model.generate(x, **kw)
    assert torch.equal(got, GenerationMixin.generate(model, x, **kw))
    assert "transformers' loop (repetition_penalty=1.5" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOG):
        model.generate(x, max_new_tokens=3, num_beams=2)
    assert "transformers' loop (num_beams=2" in caplog.text
    caplog.clear()
    x[0, 2] = 0  # without a mask transformers takes the pad id in a prompt for padding
    with caplog.at_level(logging.INFO, logger=LOG):
        got = model.generate(x, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(got, GenerationMixin.generate(model, x, max_new_tokens=3, do_sample=False, pad_token_id=0))
    assert "transformers' loop (no attention_mask, and the pad id 0" in caplog.text


def test_sampling_goes_through_the_static_step(make_lm, make_ids, caplog):
    model = _hf_model(make_lm, "macchiato")
    x = make_ids(2, 6)
    calls = _calls(model)
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger=LOG):
        out = model.generate(x, max_new_tokens=7, do_sample=True, temperature=0.8, top_k=10)
    assert out.shape == (2, 13) and torch.equal(out[:, :6], x) and not calls
    assert "static decoding step" in caplog.text


@pytest.mark.parametrize("conversion", [{}, dict(num_sinks=2, memory_slots=2)], ids=str)
def test_converted_generate_greedy_equals_transformers_loop(conversion, caplog):
    from tests.convert.test_decode_and_io import ids, trained_like

    model = trained_like("llama", **conversion)
    batch = ids(B=2, T=11, seed=3)
    mask = torch.ones_like(batch)
    mask[1, :4] = 0
    kw = dict(attention_mask=mask, max_new_tokens=13, do_sample=False)
    with torch.no_grad():
        want = GenerationMixin.generate(model, batch, **kw)
        with caplog.at_level(logging.INFO, logger=LOG):
            got = model.generate(batch, **kw)
    assert torch.equal(got, want)
    assert "ConvertedForCausalLM.generate: latte's static decoding step" in caplog.text


hf.register()
