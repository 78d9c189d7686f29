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


def test_a_model_on_the_meta_device_runs_without_reading_values():
    """Issue 59: the id range check called `.item()` on meta ids. Value checks
    are skipped on meta tensors (latte._checks.values_readable); shapes flow."""
    with torch.device("meta"):
        model = LatteForCausalLM(LatteConfig.tiny(mixer=["latte", "macchiato"], num_layers=2)).eval()
    ids = torch.zeros(2, 7, dtype=torch.long, device="meta")
    out = model(ids, labels=ids, attention_mask=torch.ones(2, 7, dtype=torch.long, device="meta"), use_cache=True)
    assert out.logits.shape == (2, 7, 64) and out.logits.device.type == "meta" and out.loss.device.type == "meta"
    step = model(ids[:, :1], state=out.state)
    assert step.logits.shape == (2, 1, 64)
    with pytest.raises(ValueError, match="input_ids: found id 64"):  # a real tensor is still checked
        LatteForCausalLM(LatteConfig.tiny())(torch.full((1, 3), 64))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_the_per_token_decoding_step_reads_no_value(monkeypatch, positions):
    """Value checks run once at the model boundary (the prompt and the whole
    continuation, before the first token); each generated token reads none."""
    from latte.models import modeling

    reads = []
    real = modeling.value_checks
    monkeypatch.setattr(modeling, "value_checks", lambda *a: reads.append(a) or real(*a))
    cfg = LatteConfig.tiny(mixer="macchiato", position_embedding=positions, max_position_embeddings=64)
    model = LatteForCausalLM(cfg).eval()
    prompt = torch.randint(0, 64, (2, 5))
    counts = []
    for new in (1, 9):
        reads.clear()
        model.generate(prompt, new)
        counts.append(len(reads))
    assert counts[0] == counts[1], counts  # the same whatever the number of new tokens
    with pytest.raises(ValueError, match="max_new_tokens=61: a 5-token prompt leaves room for at most 60"):
        model.generate(prompt, 61)  # still refused up front, before any token
