"""MacchiatoCore: Macchiato's latent branch and mix, written once and used by
the native layer and the converted attention (latte/convert/attention.py).
Its parameters keep the names they had before it existed, so checkpoints of
native models and folders of converted ones load as they are."""

from __future__ import annotations

import pytest

from latte.layers import MacchiatoAttention
from latte.layers.macchiato_attention import MacchiatoCore

RGLRU = ["mixer.conv.bias", "mixer.conv.weight", "mixer.rglru.c_i", "mixer.rglru.c_r", "mixer.rglru.lam"]
RGLRU += ["mixer.rglru.w_i", "mixer.rglru.w_r"]


@pytest.mark.parametrize("mix", ["joint", "gate"])
@pytest.mark.parametrize("bias", [False, True])
def test_native_layer_keeps_its_state_dict(mix, bias):
    """The names and shapes MacchiatoAttention's state dict had before the
    core was factored out (dim 32, 4 heads, 2 KV heads, 4 latents per head)."""
    layer = MacchiatoAttention(32, 4, 4, num_kv_heads=2, mix=mix, bias=bias, qk_mixer="conv_rglru")
    shapes = {"q_proj": (32, 32), "k_proj": (16, 32), "v_proj": (16, 32), "o_proj": (32, 32)}
    shapes |= {"a_proj": (16, 32), "b_proj": (16, 32)} | ({"gate_proj": (4, 32)} if mix == "gate" else {})
    expected = {f"{n}.weight": s for n, s in shapes.items()}
    expected |= {f"{n}.bias": s[:1] for n, s in shapes.items()} if bias else {}
    expected |= {"beta": (4,)}
    got = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert sorted(k for k in got if k.startswith("mixer.")) == RGLRU
    assert {k: v for k, v in got.items() if not k.startswith("mixer.")} == expected
    assert (layer.beta == 0).all()


def test_both_macchiato_attentions_share_one_core():
    """The latent branch and the mix have one implementation: neither layer
    redefines them."""
    from latte.convert.attention import ConvertedAttention  # optional dependency: transformers

    for cls in (MacchiatoAttention, ConvertedAttention):
        assert issubclass(cls, MacchiatoCore)
        for name in ("add_latent_branch", "latents", "latent_mix"):
            assert getattr(cls, name) is getattr(MacchiatoCore, name), f"{cls.__name__}.{name}"
