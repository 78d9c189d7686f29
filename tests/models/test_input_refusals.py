"""An empty batch used to fail deep inside a mixer (ZeroDivisionError,
reshape errors; issue 10, item 10): refused at the model boundary."""

from __future__ import annotations

import pytest
import torch

from latte.models import LatteConfig, LatteForCausalLM


@pytest.mark.parametrize("mixer", ["latte", "macchiato", "swa"])
def test_empty_batch_is_refused(mixer):
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer))
    with pytest.raises(ValueError, match=r"expected shape \[B, T >= 1\] with B >= 1, got \(0, 5\)"):
        model(torch.zeros(0, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(0, 5\)"):
        model.generate(torch.zeros(0, 5, dtype=torch.long), 3)
