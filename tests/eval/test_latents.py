"""Latent utilisation: the metrics on distributions of known entropy, the
window share against the Macchiato op's own mix, and `latte eval --latents`."""

import math

import pytest
import torch
from torch import nn

from latte.data import TokenWindows
from latte.eval.latents import latent_utilisation, latents_table, layer_probs, utilisation
from latte.layers import MacchiatoAttention
from latte.models import LatteConfig, LatteForCausalLM
from latte.ops import latte_causal, macchiato, sliding_window_attention


@pytest.mark.parametrize(
    "pbar, entropy, effective, used",
    [
        (torch.full((8,), 1 / 8), math.log(8), 8.0, 1.0),  # uniform: every latent used
        (torch.tensor([1.0, 0, 0, 0]), 0.0, 1.0, 0.25),  # collapsed onto one latent
        (torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0]), math.log(2), 2.0, 0.25),
        # mass 0.01 < 1 / (10 L) = 0.025 does not count as used; 0.03 does
        (
            torch.tensor([0.96, 0.03, 0.01, 0.0], dtype=torch.float64),
            -(0.96 * math.log(0.96) + 0.03 * math.log(0.03) + 0.01 * math.log(0.01)),
            None,
            0.5,
        ),
    ],
)
def test_metrics_of_known_distributions(pbar, entropy, effective, used):
    m = utilisation(pbar)
    assert m["entropy"] == pytest.approx(entropy, abs=1e-9)
    assert m["effective_latents"] == pytest.approx(math.exp(entropy) if effective is None else effective)
    assert m["used_fraction"] == used and m["latents_per_head"] == pbar.numel() and "num_latents" not in m
    assert m["max_entropy"] == pytest.approx(math.log(pbar.numel()))


def test_a_record_written_under_the_old_key_still_reads():
    """Cells written before the per-head count was named latents_per_head
    hold it as num_latents: the table and the records read either."""
    from latte.eval.latents import latents_summary

    new = utilisation(torch.tensor([0.5, 0.5, 0.0]))
    old = {("num_latents" if k == "latents_per_head" else k): v for k, v in new.items()}
    for h in (new, old):
        report = {"tokens": 8, "layers": [{"layer": 0, "kind": "latte", "heads": [{"head": 0, **h}]}]}
        records, table = latents_summary([({"model": "m"}, "m", [{"report": report}])])
        assert records[0]["latents_per_head"] == 3 and "num_latents" not in records[0]
        assert "| 0 | 0 | 3 | 0.69 / 1.10 |" in table


def test_metrics_reject_a_non_distribution():
    with pytest.raises(ValueError, match="probability vector"):
        utilisation(torch.tensor([0.5, 0.6]))


def _windows(T=16, n=4, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TokenWindows(torch.randint(0, vocab, (n * T + 1,), generator=g).numpy(), T)


@pytest.mark.parametrize("mixer", ["latte", "macchiato"])
def test_model_with_constant_latent_logits_uses_every_latent_alike(mixer):
    """a_proj = 0: p(l|t) is uniform at every token, so the entropy is log L
    exactly; a bias of +50 on one latent collapses every head onto it."""
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).eval()
    for block in model.model.blocks:
        nn.init.zeros_(block.mixer.a_proj.weight)
    report = latent_utilisation(model, _windows())
    assert report["tokens"] == 64 and len(report["layers"]) == 2
    for layer in report["layers"]:
        for h in layer["heads"]:
            assert h["entropy"] == pytest.approx(math.log(4), abs=1e-9) and h["used_fraction"] == 1.0
            assert ("p_window_mean" in h) == (mixer == "macchiato")
    for block in model.model.blocks:
        dim, L = block.mixer.a_proj.in_features, block.mixer.a_proj.out_features
        block.mixer.a_proj = nn.Linear(dim, L, bias=True)
        nn.init.zeros_(block.mixer.a_proj.weight)
        with torch.no_grad():
            block.mixer.a_proj.bias.copy_(torch.tensor([50.0, 0, 0, 0] * (L // 4)))
    for layer in latent_utilisation(model, _windows())["layers"]:
        for h in layer["heads"]:
            assert h["effective_latents"] == pytest.approx(1.0, abs=1e-6) and h["used_fraction"] == 0.25
    assert "| layer | head |" in latents_table(report)


def test_window_share_is_the_mix_the_op_applies():
    """y = p(window) SWA + (1 - p(window)) Latte, with p(window) from
    layer_probs and the two branches computed separately by the ops."""
    torch.manual_seed(1)
    layer = MacchiatoAttention(32, 2, 4, window_size=5, qk_mixer="conv", chunk_size=4).double()
    with torch.no_grad():
        layer.beta.copy_(torch.tensor([0.7, -1.3], dtype=torch.float64))
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    p, pw = layer_probs(layer, x)
    assert p.shape == (2, 13, 2, 4) and pw.shape == (2, 13, 2) and bool(((pw > 0) & (pw < 1)).all())
    from latte.layers.llama_projections import project_qkv
    from latte.layers.rope import real_positions

    q, k, v = project_qkv(layer, x, real_positions(None, None, 2, 13, x.device)[0])
    u, _, _ = layer.mixer(x)
    a, b = layer.a_proj(u).view(2, 13, 2, 4), layer.b_proj(u).view(2, 13, 2, 4)
    y, _ = macchiato(a, b, v, q, k, window_size=5, beta=layer.beta, chunk_size=4)
    y_win, _ = sliding_window_attention(q, k, v, window_size=5)
    y_lat, _ = latte_causal(a, b, v, chunk_size=4)
    w = pw.unsqueeze(-1)
    assert torch.allclose(y, w * y_win + (1 - w) * y_lat, atol=1e-10)
    assert torch.allclose(p, torch.softmax(a, -1).float(), atol=1e-6)


def test_model_without_latent_layers_is_refused():
    model = LatteForCausalLM(LatteConfig.tiny(mixer="softmax"))
    with pytest.raises(ValueError, match="no latent layers"):
        latent_utilisation(model, _windows())
