"""A converted model's `stream` through the static decoding state and step
(latte/models/static_decode.py): the tokens of the step-by-step loop over the
cache (static=False) and of transformers' generate."""

import pytest
import torch
from transformers import GenerationMixin

from latte.models import static_decode
from latte.models.static_decode import allocate, decode_step, layer_windows
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
        hf = GenerationMixin.generate(model, batch, attention_mask=mask, max_new_tokens=13, do_sample=False)
    assert len(static) == len(value) == 13
    for i, (a, b) in enumerate(zip(static, value)):
        assert torch.equal(a, b), i
    assert torch.stack(static, 1).tolist() == hf[:, 11:].tolist()


def test_a_converted_model_steps_through_the_shared_capture_path(monkeypatch):
    # the converted stream hands its step to static_decode.capture, the
    # function that captures the native models' step in a CUDA graph on CUDA
    seen = []
    real = static_decode.capture

    def spy(step, tok, generator=None):
        seen.append(tok.device.type)
        return real(step, tok, generator)

    monkeypatch.setattr(static_decode, "capture", spy)
    model = trained_like("llama", num_sinks=1)
    with torch.no_grad():
        got = list(model.stream(ids(B=2, T=6, seed=2), 5, temperature=0))
    assert seen == ["cpu"] and len(got) == 5


@pytest.mark.parametrize("conversion", [{}, dict(num_sinks=1, memory_slots=2, sink_positions="cache")], ids=str)
def test_the_converted_step_compiles_without_a_graph_break(conversion):
    # no value read and no host copy in the step: what a CUDA graph needs
    model = trained_like("llama", **conversion)
    x = ids(B=2, T=7, seed=3)
    states = []
    for _ in range(2):
        with torch.no_grad():
            cache = model(x, use_cache=True, logits_to_keep=1).state
        states.append((cache, allocate(cache.states, layer_windows(model.converted), torch.full((2,), 6), 7, 5)))

    def feed_of(cache):
        def feed(tok, layers, pos):
            cache.states = list(layers)
            out = model(tok[:, None], position_ids=(pos + 1)[:, None], state=cache, use_cache=True)
            return out.logits[:, -1], cache.states, pos + 1

        return feed

    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    (c1, s1), (c2, s2) = states
    step = torch.compile(
        lambda t: decode_step(feed_of(c1), s1, t, pick, None), fullgraph=True, backend="aot_eager", dynamic=False
    )
    tok = torch.tensor([3, 4])
    with torch.no_grad():
        for _ in range(2):
            got, want = step(tok), decode_step(feed_of(c2), s2, tok, pick, None)
            assert torch.equal(got, want)
            tok = got
