"""The masked sliding-window diagnostic of latte.eval.long_context against
the converted model's own window cache (before up-training, beta = -30) and
against the original's full attention."""

import pytest
import torch

from latte.eval.long_context import converted_nll, original_nll, original_window_nll
from tests.convert.families import FAMILIES
from tests.convert.test_decode_and_io import W, ids, trained_like


@pytest.mark.parametrize("family", FAMILIES)
def test_window_mask_equals_the_converted_model_before_up_training(family):
    model = trained_like(family, num_sinks=0)  # the window alone; tests/convert/test_sinks.py adds sinks
    with torch.no_grad():
        for attn in model.converted:
            attn.beta.fill_(-30.0)
    x = ids(B=1, T=40)[0]
    cached = converted_nll(model, x, contexts=(), chunk=16).nll
    masked = original_window_nll(model, x, window=W).nll
    assert masked.shape == cached.shape == (39,)
    assert (masked - cached).abs().max() < 1e-4
    # keeping the first tokens visible changes the later tokens' losses only
    sink = original_window_nll(model, x, window=W, sinks=2).nll
    assert (sink[:W] - masked[:W]).abs().max() < 1e-5 and (sink[W:] - masked[W:]).abs().max() > 1e-4
    if family == "llama":  # no native sliding window: a window as long as the document is full attention
        assert (original_window_nll(model, x, window=40).nll - original_nll(model, x).nll).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_original_through_its_cache_equals_one_pass(family):
    """The original read in chunks through its KV cache (masks [chunk, T]:
    what lets Gemma reach 32K tokens in memory) is the one-pass forward."""
    model = trained_like(family)
    x = ids(B=1, T=40)[0]
    whole = original_nll(model, x, chunk=None).nll
    for chunk in (7, 16, 39, 64):
        chunked = original_nll(model, x, chunk=chunk).nll
        assert chunked.shape == whole.shape == (39,)
        assert (chunked - whole).abs().max() < 1e-4, chunk


def test_window_arguments_are_checked():
    model = trained_like("llama")
    with pytest.raises(ValueError, match="window must be >= 1"):
        original_window_nll(model, ids(B=1)[0], window=0)


def test_as_sliding_window_switches_off_lora_and_the_latents():
    model = trained_like("llama", lora_rank=2, num_sinks=0)  # LoRA B non-zero: the adapters change q/k/v/o
    x = ids(B=1, T=40)[0]
    before = converted_nll(model, x, contexts=(), chunk=16).nll
    with model.as_sliding_window():
        swa = converted_nll(model, x, contexts=(), chunk=16).nll
    assert (swa - original_window_nll(model, x, window=W).nll).abs().max() < 1e-4
    assert (converted_nll(model, x, contexts=(), chunk=16).nll - before).abs().max() == 0  # restored
    assert (swa - before).abs().max() > 1e-3
