"""A converted model's `stream` through the static decoding state and step
(latte/models/static_decode.py): the tokens of the step-by-step loop over the
cache (static=False) and of transformers' generate."""

import pytest
import torch

from tests.convert.test_decode_and_io import ids, trained_like


@pytest.mark.parametrize("conversion", [{}, dict(num_sinks=2), dict(num_sinks=1, memory_slots=2)], ids=str)
def test_a_converted_model_streams_through_the_static_step(conversion):
    model = trained_like("llama", **conversion)
    batch = ids(B=2, T=11, seed=3)
    mask = torch.ones_like(batch)
    mask[1, :4] = 0
    with torch.no_grad():
        static = list(model.stream(batch, 13, temperature=0, attention_mask=mask, eos_check_every=4))
        value = list(model.stream(batch, 13, temperature=0, attention_mask=mask, static=False))
        hf = model.generate(batch, attention_mask=mask, max_new_tokens=13, do_sample=False)
    assert len(static) == len(value) == 13
    for i, (a, b) in enumerate(zip(static, value)):
        assert torch.equal(a, b), i
    assert torch.stack(static, 1).tolist() == hf[:, 11:].tolist()
