"""Up-training losses: layer records, layer-wise matching, end-to-end KL + LM,
beta calibration (checked against a dense float64 computation)."""

import copy
import math

import pytest
import torch

from latte.convert import ConversionConfig, convert
from latte.convert.distill import (
    Distiller,
    calibrate_beta,
    chunked_objective,
    end_to_end_loss,
    freeze_base,
    layerwise_loss,
    next_token_nll,
    record_layers,
)
from latte.models import IGNORE_INDEX
from tests.convert.families import VOCAB, build
from tests.convert.test_equivalence import band_mask

T = 40


def ids(B=2, seed=1):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def converted(family="llama", **kw):
    return convert(build(family), ConversionConfig(**{"latents_per_head": 4, **kw}))


def test_freeze_base_leaves_only_the_new_parameters_trainable():
    model = converted(lora_rank=2)
    trainable = freeze_base(model)
    new = model.new_parameters()
    assert {id(p) for p in trainable} == {id(p) for p in new.values()}
    assert not model.base.model.embed_tokens.weight.requires_grad


@pytest.mark.parametrize("family", ["gemma2", "qwen3"])
def test_records_are_the_original_attention_calls(family):
    model = converted(family, window_size=64)
    x = ids()
    records = record_layers(model, x)
    assert len(records) == model.num_layers
    with torch.no_grad():
        for attn, rec in zip(model.converted, records):
            band = band_mask(attn.spec.window or T)
            with model.as_original():
                y, _ = attn.original(rec.x, position_embeddings=rec.position_embeddings, attention_mask=band)
            assert torch.allclose(y, rec.y, atol=1e-5)
            # converted with window >= T and beta = -30: the same output
            y_conv, _ = attn(rec.x, position_embeddings=rec.position_embeddings)
            assert torch.allclose(y_conv, rec.y, atol=1e-4, rtol=1e-4)
    loss, per_layer = layerwise_loss(model, records)
    assert float(loss.detach()) < 1e-8 and len(per_layer) == model.num_layers


def test_gradients_vanish_at_beta_minus_30_and_flow_after_calibration():
    model = converted(window_size=8)
    freeze_base(model)
    records = record_layers(model, ids())
    loss, _ = layerwise_loss(model, records)
    assert float(loss.detach()) > 1e-3
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in model.new_parameters().values())
    model.zero_grad()
    calibrate_beta(model, records)
    loss, _ = layerwise_loss(model, records)
    loss.backward()
    grads = {n: p.grad for n, p in model.new_parameters().items()}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


def _dense_lost_mass_beta(attn, rec, W):
    """beta that gives the latents exactly the mass outside the window, from
    dense float64 scores: median_t log(sum_{s <= t - W} exp(e_ts)) - log L
    (a = 0, so logsumexp(a) = log L)."""
    q, k, _ = attn._qkv(rec.x, rec.position_embeddings)
    q, k = q.double(), k.double().repeat_interleave(q.shape[2] // k.shape[2], 2)
    e = torch.einsum("bthe,bshe->bhts", q, k) * attn.spec.scale
    t = torch.arange(T)
    outside = t[None, :] <= t[:, None] - W  # keys before the window
    lost = torch.logsumexp(e.masked_fill(~outside, float("-inf")), -1)[:, :, W:]  # [B, H, T - W]
    return lost.permute(0, 2, 1).flatten(0, 1).median(0).values - math.log(attn.latents_per_head)


def test_calibration_to_the_lost_mass_matches_a_dense_computation():
    W = 8
    model = converted(window_size=W, num_sinks=0, qk_mixer="none")  # with sinks: test_sinks.py
    with torch.no_grad():
        for attn in model.converted:
            attn.a_proj.weight.zero_()
    records = record_layers(model, ids())
    calibrate_beta(model, records)
    for attn, rec in zip(model.converted, records):
        ref = _dense_lost_mass_beta(attn, rec, W).float()
        assert torch.allclose(attn.beta, ref, atol=1e-3), (attn.beta, ref)


def test_calibration_to_a_fixed_latent_mass():
    model = converted(window_size=8)
    records = record_layers(model, ids())
    calibrate_beta(model, records, latent_mass=0.2)
    for attn, rec in zip(model.converted, records):
        m = attn.log_masses(rec.x, rec.position_embeddings)
        p = torch.sigmoid(m.latent + attn.beta - m.window).flatten(0, 1)  # [B * T, H]
        # 0.2 is a median of every head's latent mass over the tokens
        assert ((p <= 0.2 + 1e-5).float().mean(0) >= 0.5).all() and ((p >= 0.2 - 1e-5).float().mean(0) >= 0.5).all()
        assert (p - 0.2).abs().min(0).values.max() < 1e-5
    with pytest.raises(ValueError, match="latent_mass"):
        calibrate_beta(model, records, latent_mass=1.5)


def test_end_to_end_loss_is_kl_plus_lm():
    original = build("gemma2")
    x = ids()
    model = convert(copy.deepcopy(original), ConversionConfig(window_size=64, latents_per_head=4))
    loss, parts = end_to_end_loss(model, x)
    assert parts["kl"] < 1e-6  # window >= T: the converted model is the original
    with torch.no_grad():
        assert parts["lm"] == pytest.approx(float(next_token_nll(original(x).logits, x)), rel=1e-5)
    assert float(loss) == pytest.approx(parts["kl"] + parts["lm"], rel=1e-6)
    short = convert(copy.deepcopy(original), ConversionConfig(window_size=4, latents_per_head=4))
    _, parts = end_to_end_loss(short, x, lm_weight=0.0)
    assert parts["kl"] > 1e-4


@pytest.mark.parametrize("family", ["gemma2", "llama", "gemma3_text"])
@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (0.5, 2.0, 2.0), (1.0, 0.0, 1.0), (0.0, 1.0, 0.5)])
def test_chunked_objective_equals_the_full_logits_in_float64(family, weights):
    """The training path (head applied in chunks, the hidden states' gradient
    computed in the forward pass) against the full [B, T, vocab] logits, in
    float64: the loss and every trainable parameter's gradient. gemma2 has a
    final logit soft-cap."""
    lm_weight, kl_weight, tau = weights
    model = converted(family, window_size=6, num_sinks=1, lora_rank=2).double()
    freeze_base(model)
    gen = torch.Generator().manual_seed(3)
    # LoRA B starts at 0 and beta at -30: random values let gradients reach A and the latents
    for p in model.new_parameters().values():
        p.data.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    x = ids()
    labels = torch.cat([x[:, 1:], torch.full((2, 1), IGNORE_INDEX)], 1)
    labels[0, :5] = IGNORE_INDEX  # (packed samples' masked targets)
    distiller = Distiller(model, kl_weight=kl_weight, lm_weight=lm_weight, temperature=tau)

    def run(fn):
        model.zero_grad()
        loss = fn()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.new_parameters().items()}

    loss, grads = run(lambda: distiller(x, labels).loss)
    ref, ref_grads = run(lambda: distiller.dense_objective(x, labels))
    assert loss.dtype == torch.float64 and float(ref) > 1.0
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
    assert grads.keys() == ref_grads.keys() and all(g.abs().sum() > 0 for g in ref_grads.values())
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-10, atol=1e-13, msg=n)


def test_chunked_objective_chunk_size_does_not_matter_and_checks_its_arguments():
    model = converted("gemma2").double()
    h = torch.randn(23, model.base.config.hidden_size, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(23, model.base.config.hidden_size, dtype=torch.float64)
    y = torch.randint(0, VOCAB, (23,))
    out = {}
    for chunk in (1, 5, 23, 64):
        h.grad = None
        loss = chunked_objective(model.base, h, teacher, y, temperature=1.5, chunk=chunk)
        loss.backward()
        out[chunk] = (loss.detach(), h.grad.clone())
    for chunk in (1, 5, 23):
        torch.testing.assert_close(out[chunk], out[64], rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="nothing to compute"):
        chunked_objective(model.base, h, None, y, lm_weight=0.0)
    with pytest.raises(ValueError, match="chunk must be >= 1, got 0"):
        chunked_objective(model.base, h, teacher, y, chunk=0)


def test_a_trainable_head_takes_the_full_logits_path():
    model = converted(window_size=6).double()
    freeze_base(model)
    model.get_output_embeddings().weight.requires_grad_(True)
    x = ids()
    labels = torch.cat([x[:, 1:], torch.full((2, 1), IGNORE_INDEX)], 1)
    distiller = Distiller(model)
    loss = distiller(x, labels).loss
    loss.backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0
    torch.testing.assert_close(loss.detach(), distiller.dense_objective(x, labels).detach(), rtol=1e-12, atol=0)
