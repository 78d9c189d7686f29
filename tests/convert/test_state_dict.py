"""A converted model's state dict keeps the names it had before Macchiato's
latent branch and mix moved into latte.layers' MacchiatoCore: the pretrained
weights under their own names, the new parameters beside them, so converted
folders and up-training checkpoints load as they are."""

from __future__ import annotations

import pytest

from latte.convert import ConversionConfig, convert
from tests.convert.families import build

NEW = {"a_proj.weight": (8, 64), "b_proj.weight": (8, 64), "beta": (4,), "mixer.conv.weight": (64, 1, 3)}
NEW |= {"mixer.conv.bias": (64,)}
GATE = {"gate_proj.weight": (4, 64), "gate_proj.bias": (4,)}


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_converted_keys_and_shapes_are_unchanged(mix):
    original = build("llama")
    before = {k: tuple(v.shape) for k, v in original.state_dict().items()}
    cfg = ConversionConfig(window_size=8, latents_per_head=2, qk_mixer="conv", conv_size=3, mix=mix, lora_rank=2)
    model = convert(original, cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    lora = {f"lora.{p}_proj.{m}" for p in "qkvo" for m in "AB"}
    expected = {f"base.{k}": s for k, s in before.items()}
    for i in range(original.config.num_hidden_layers):
        prefix = f"base.model.layers.{i}.self_attn."
        expected |= {prefix + k: s for k, s in (NEW | (GATE if mix == "gate" else {})).items()}
        assert {k.removeprefix(prefix) for k in got if k.startswith(prefix + "lora.")} == lora
    assert {k: s for k, s in got.items() if ".lora." not in k} == expected
    assert set(model.new_parameters()) == {k for k in got if k not in {f"base.{k}" for k in before}}
