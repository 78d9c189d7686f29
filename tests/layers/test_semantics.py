"""Each layer computes the mathematics it claims: float64 comparisons against
`latte.ops.reference` on the layer's own projections, and the baselines
against each other (Macchiato with beta -> -inf is SWA; SWA with a window
>= T is softmax attention)."""

import pytest
import torch

from latte.layers import LatteAttention, MacchiatoAttention, SlidingWindowAttention, SoftmaxAttention
from latte.ops import reference

DIM, HEADS, LATENTS = 16, 2, 4  # LATENTS per head


def x64(B=2, T=11, seed=1):
    return torch.randn(B, T, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def positions(B, T):
    return torch.arange(T).expand(B, T)


@pytest.mark.parametrize("kind", ["none", "conv", "rglru", "conv_rglru"])
def test_latte_layer_matches_reference(kind):
    torch.manual_seed(0)
    layer = LatteAttention(DIM, HEADS, LATENTS, qk_mixer=kind, chunk_size=4).double()
    x = x64()
    with torch.no_grad():
        y, state = layer(x)
        u = layer.mixer(x)[0]  # the mixer feeds the latent logits only
        a = layer.a_proj(u).view(2, 11, HEADS, 4)
        b = layer.b_proj(u).view(2, 11, HEADS, 4)
        v = layer.v_proj(x).view(2, 11, HEADS, 8)  # values from the raw input
        y_ref, (S, z) = reference.latte_causal(a, b, v)
        y_ref = layer.o_proj(y_ref.flatten(2))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(state.attn.S, S)
    torch.testing.assert_close(state.attn.z, z)


@pytest.mark.parametrize("mix,sinks", [("joint", 0), ("gate", 0), ("joint", 2)])
def test_macchiato_layer_matches_reference(mix, sinks):
    torch.manual_seed(0)
    kw = dict(window_size=3, mix=mix, num_kv_heads=1, chunk_size=4, num_sinks=sinks)
    layer = MacchiatoAttention(DIM, HEADS, LATENTS, **kw).double()
    with torch.no_grad():
        layer.beta.copy_(torch.tensor([0.5, -1.0]))
    x = x64()
    with torch.no_grad():
        y, _ = layer(x)
        u = layer.mixer(x)[0]
        a = layer.a_proj(u).view(2, 11, HEADS, 4)
        b = layer.b_proj(u).view(2, 11, HEADS, 4)
        q = layer.rope(layer.q_proj(x).view(2, 11, HEADS, 8), positions(2, 11))
        k = layer.rope(layer.k_proj(x).view(2, 11, 1, 8), positions(2, 11))
        v = layer.v_proj(x).view(2, 11, 1, 8)
        gate = layer.gate_proj(x) if mix == "gate" else None
        y_ref = reference.macchiato(a, b, v, q, k, 3, mix=mix, gate=gate, beta=layer.beta, num_sinks=sinks)
        y_ref = layer.o_proj(y_ref.flatten(2))
    torch.testing.assert_close(y, y_ref)


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_macchiato_with_very_negative_beta_is_sliding_window_attention(mix):
    torch.manual_seed(0)
    mac = MacchiatoAttention(DIM, HEADS, LATENTS, window_size=4, mix=mix, num_kv_heads=1)
    swa = SlidingWindowAttention(DIM, HEADS, window_size=4, num_kv_heads=1)
    shared = ("q_proj", "k_proj", "v_proj", "o_proj")  # Llama's names: the window branch is SWA
    swa.load_state_dict({k: v for k, v in mac.state_dict().items() if k.split(".")[0] in shared})
    with torch.no_grad():
        mac.beta.fill_(-60.0)  # how a pretrained decoder is converted: start as pure SWA
        x = x64().float()
        torch.testing.assert_close(mac(x)[0], swa(x)[0], atol=1e-6, rtol=1e-5)


def test_sliding_window_covering_the_sequence_is_softmax_attention():
    torch.manual_seed(0)
    soft = SoftmaxAttention(DIM, HEADS, num_kv_heads=1)
    swa = SlidingWindowAttention(DIM, HEADS, window_size=32, num_kv_heads=1)
    swa.load_state_dict(soft.state_dict())
    x = x64().float()
    with torch.no_grad():
        torch.testing.assert_close(swa(x)[0], soft(x)[0], atol=1e-5, rtol=1e-5)


def test_softmax_layer_matches_explicit_attention():
    torch.manual_seed(0)
    layer = SoftmaxAttention(DIM, HEADS, num_kv_heads=1).double()
    x = x64(T=7)
    with torch.no_grad():
        y, cache = layer(x)
        q = layer.rope(layer.q_proj(x).view(2, 7, HEADS, 8), positions(2, 7))
        k = layer.rope(layer.k_proj(x).view(2, 7, 1, 8), positions(2, 7))
        v = layer.v_proj(x).view(2, 7, 1, 8)
        s = torch.einsum("bthe,bse->bhts", q, k[:, :, 0]) / 8**0.5
        s = s.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
        y_ref = layer.o_proj(torch.einsum("bhts,bsd->bthd", s.softmax(-1), v[:, :, 0]).flatten(2))
    torch.testing.assert_close(y, y_ref)
    assert cache.k.shape == (2, 7, 1, 8) and cache.mask.all() and cache.pos.tolist() == [7, 7]
