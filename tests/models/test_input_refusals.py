"""Model inputs that used to fail deep inside (issue 10, item 10): a clear
ValueError naming the problem, before any compute."""

from __future__ import annotations

import pytest
import torch

from latte.models import LatteConfig, LatteForCausalLM


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LatteForCausalLM(LatteConfig.tiny(mixer="macchiato"))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_small_integer_ids_are_refused_naming_the_dtype(model, dtype):
    with pytest.raises(ValueError, match=rf"input_ids: expected an integer dtype torch.long \(or torch.int32\), got {dtype}"):
        model(torch.zeros(2, 5, dtype=dtype))
    assert model(torch.zeros(2, 5, dtype=torch.int32)).logits.shape == (2, 5, 64)


def test_empty_batch_is_refused(model):
    with pytest.raises(ValueError, match=r"expected shape \[B, T >= 1\] with B >= 1, got \(0, 5\)"):
        model(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(0, 5\)"):
        model.generate(torch.zeros(0, 5, dtype=torch.long), 3)


def test_mask_value_other_than_0_or_1_is_named(model):
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3] = 2
    with pytest.raises(ValueError, match=r"attention_mask: expected 0/1 values .*found 2 at \(1, 3\)"):
        model(torch.zeros(2, 5, dtype=torch.long), attention_mask=mask)
