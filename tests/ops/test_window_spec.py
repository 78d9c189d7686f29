"""One window spec from the layer to the op (issue 58): macchiato and
macchiato_step take the local branch as one frozen WindowSpec, equal to the
keywords it replaces; the native layer and the converted attention build it
from their settings and hand the op that value unchanged."""

import dataclasses

import pytest
import torch

import latte.layers.macchiato_attention as layer_module
from latte.layers import MacchiatoAttention
from latte.ops import WindowSpec, macchiato, macchiato_step
from latte.ops.window.memory import Memory

f64 = torch.float64


def inputs(T=13, B=2, H=4, K=2, L=3, E=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)  # noqa: E731
    return r(B, T, H, L), r(B, T, H, L), r(B, T, K, E), r(B, T, H, E), r(B, T, K, E)


SPEC = dict(window_size=4, num_sinks=1, scale=0.3, softcap=2.5, memory=Memory(2, "key_norm"))


def test_the_spec_equals_the_keywords_it_replaces():
    a, b, v, q, k = inputs()
    spec = WindowSpec(4, num_sinks=1, scale=0.3, softcap=2.5, memory=Memory(2, "key_norm"))
    y_kw, st_kw = macchiato(a, b, v, q, k, **SPEC, output_final_state=True, chunk_size=5)
    y, st = macchiato(a, b, v, q, k, window=spec, output_final_state=True, chunk_size=5)
    assert torch.equal(y, y_kw)
    t = (a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0])
    assert torch.equal(macchiato_step(*t, st, window=spec)[0], macchiato_step(*t, st_kw, **SPEC)[0])


def test_the_spec_is_frozen_and_one_way_at_a_time():
    a, b, v, q, k = inputs()
    spec = WindowSpec(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.size = 5
    with pytest.raises(ValueError, match="either window=WindowSpec"):
        macchiato(a, b, v, q, k, window=spec, num_sinks=1)
    with pytest.raises(ValueError, match="window: expected a WindowSpec, got dict"):
        macchiato(a, b, v, q, k, window={"size": 4})
    with pytest.raises(ValueError, match="window=WindowSpec.*or window_size=W"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0])


def _capture(monkeypatch):
    """Records the `window` each call of the layer module's ops received."""
    seen = []
    for name in ("macchiato", "macchiato_step"):
        op = getattr(layer_module, name)

        def spy(*args, _op=op, **kw):
            seen.append(kw["window"])
            return _op(*args, **kw)

        monkeypatch.setattr(layer_module, name, spy)
    return seen


@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_native_layer_hands_its_spec_down_unchanged(monkeypatch, positions):
    torch.manual_seed(0)
    layer = MacchiatoAttention(32, 4, 2, window_size=5, num_sinks=2, num_kv_heads=2, qk_mixer="none")
    layer.use_memory(3, "key_norm")
    layer.memory_positions = positions
    seen = _capture(monkeypatch)
    x = torch.randn(2, 9, 32)
    _, state = layer(x)
    layer(x[:, :1], state=state)  # one decoding step
    assert len(seen) == 2 and all(isinstance(s, WindowSpec) for s in seen)
    for s in seen:
        assert (s.size, s.num_sinks, s.scale, s.softcap) == (5, 2, None, None)
        assert s.memory[:3] == layer.memory[:3]  # slots, rule, seed
        assert (s.memory.rotary is None) == (positions == "absolute")
    assert layer.window_spec() == WindowSpec(5, 2, memory=layer.memory)


def test_converted_attention_carries_the_originals_scale_and_softcap(monkeypatch):
    pytest.importorskip("transformers")
    from latte.convert import ConversionConfig, convert
    from tests.convert.families import build

    model = convert(build("gemma2"), ConversionConfig(window_size=4, num_sinks=1, latents_per_head=2)).eval()
    seen = _capture(monkeypatch)
    with torch.no_grad():
        model(torch.arange(7)[None] % 50, use_cache=False)
    attn = model.converted[0]
    assert seen and seen[0] == WindowSpec(4, 1, attn.spec.scale, attn.spec.softcap, None)
    assert attn.spec.softcap is not None  # Gemma 2 soft-caps its scores
