"""The auxiliary latent loss (distill.latent_aux_weight, docs/conversion.md
§12): the latent-only forward is causal Latte over the layer's own latents
(checked against the float64 reference, forward and backward, and as the
limit of the reference mix when the window's mass vanishes); weight 0 is
the objective alone bit for bit; weight w adds w times the latent-only
objective against the same teacher targets, with window drop too."""

import copy

import pytest
import torch

from latte.convert.distill import Distiller, chunked_objective, freeze_base, layerwise_loss, record_layers
from latte.convert.task import DistillConfig
from latte.convert.window_drop import WindowDropDistiller
from latte.layers.macchiato_attention import latent_branch_only
from latte.models import IGNORE_INDEX
from latte.ops import reference
from tests.convert.test_decode_and_io import W, ids, trained_like


def labels_of(x):
    return torch.cat([x[:, 1:], torch.full_like(x[:, :1], IGNORE_INDEX)], 1)


def loss_and_grads(fn, params):
    loss = fn()
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def layer_inputs(model, T=24):
    """A layer of a double-precision trained-like model, with the input and
    rotary embedding the original passes it."""
    rec = record_layers(model, ids(B=2, T=T))[1]
    return model.converted[1], rec.x.detach().requires_grad_(), rec.position_embeddings


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_latent_only_layer_is_causal_latte_of_its_own_latents(mix):
    model = trained_like("llama", mix=mix).double()
    attn, x, pe = layer_inputs(model)
    params = [x, *(p for n, p in attn.named_parameters() if p.requires_grad)]
    names = ["x", *(n for n, p in attn.named_parameters() if p.requires_grad)]
    g = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(3))

    def fast():
        with latent_branch_only(model):
            return (attn(x, position_embeddings=pe)[0] * g).sum()

    def ref():  # float64 reference: sum_l p(l|t) sum_{s<=t} p(s|l,t) v_s, then o_proj
        a, b, *_ = attn.latents(x)
        _, _, v = attn._qkv(x, pe)
        y, _ = reference.latte_causal(a, b, v.repeat_interleave(a.shape[2] // v.shape[2], 2))
        return (attn._project("o_proj", y.flatten(2)) * g).sum()

    got, got_g = loss_and_grads(fast, params)
    want, want_g = loss_and_grads(ref, params)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for n, a, b in zip(names, got_g, want_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=n)
    by_name = dict(zip(names, got_g))
    assert not by_name["beta"].any()  # the window's mass is 0: beta (and the gate) cancel
    assert by_name["a_proj.weight"].abs().sum() > 0 and by_name["b_proj.weight"].abs().sum() > 0
    assert all(not m.latent_only for m in model.converted)  # restored
    # the check can fail: the mixed layer gives another output
    mixed = (attn(x, position_embeddings=pe)[0] * g).sum()
    assert not torch.allclose(mixed, got, rtol=1e-6)


def test_latent_only_is_the_mix_when_the_window_mass_vanishes():
    model = trained_like("llama").double()
    attn, x, pe = layer_inputs(model)
    with torch.no_grad():
        a, b, *_ = attn.latents(x)
        q, k, v = attn._qkv(x, pe)
        big = torch.full_like(attn.beta, 200.0)  # latents e^200 times heavier than the window
        kw = dict(scale=attn.spec.scale, num_sinks=attn.num_sinks)
        mix = reference.macchiato(a, b, v, q, k, attn.window_size, beta=big, **kw)
        with latent_branch_only(model):
            y = attn(x, position_embeddings=pe)[0]
        torch.testing.assert_close(y, attn._project("o_proj", mix.flatten(2)), rtol=1e-10, atol=1e-12)


def today(distiller, x, labels):
    """The objective as Distiller.forward computed it before the auxiliary loss."""
    m = distiller.model
    if distiller.objective == "layerwise":
        count = (labels != IGNORE_INDEX).sum().clamp(min=1)
        loss, _ = layerwise_loss(m, record_layers(m, x))
        return loss * count
    keep = labels != IGNORE_INDEX
    student = m.base.model(input_ids=x, use_cache=False).last_hidden_state[keep]
    with torch.no_grad(), m.as_original() as base:
        teacher = base.model(input_ids=x, use_cache=False).last_hidden_state[keep]
    return chunked_objective(m.base, student, teacher, labels[keep])


@pytest.mark.parametrize("objective", ["end_to_end", "layerwise"])
def test_weight_zero_is_the_objective_alone_bit_for_bit(objective, monkeypatch):
    model = trained_like("llama")
    freeze_base(model)
    distiller = Distiller(model, objective, latent_aux_weight=0.0).train()
    x = ids(B=2, T=24)
    labels = labels_of(x)
    params = trainable(model)
    got, got_g = loss_and_grads(lambda: distiller(x, labels).loss, params)
    want, want_g = loss_and_grads(lambda: today(distiller, x, labels), params)
    assert torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(got_g, want_g))
    # weight 0 never runs the latent-only forward (no extra cost)
    monkeypatch.setattr(Distiller, "latent_loss", lambda *a: pytest.fail("latent-only forward at weight 0"))
    distiller(x, labels)


@pytest.mark.parametrize("objective,dense", [("end_to_end", False), ("end_to_end", True), ("layerwise", False)])
def test_total_is_main_plus_w_times_aux(objective, dense):
    model = trained_like("llama").double()
    freeze_base(model)
    if dense:  # the head trains: the full-logits path
        model.get_output_embeddings().weight.requires_grad_(True)
    w = 0.5
    distiller = Distiller(model, objective, latent_aux_weight=w).train()
    x = ids(B=2, T=24)
    labels = labels_of(x)
    params = trainable(model)
    targets = distiller.targets(x, labels)
    main, main_g = loss_and_grads(lambda: distiller.student_loss(x, labels, targets), params)
    aux, aux_g = loss_and_grads(lambda: distiller.latent_loss(x, labels, targets), params)
    total, total_g = loss_and_grads(lambda: distiller(x, labels).loss, params)
    torch.testing.assert_close(total, main + w * aux, rtol=1e-12, atol=0)
    for t, m, a in zip(total_g, main_g, aux_g):
        torch.testing.assert_close(t, m + w * a, rtol=1e-10, atol=1e-12)
    assert abs(float(aux - main)) > 1e-6 * abs(float(main))  # the latents alone predict otherwise
    # the auxiliary term is the main objective of a model whose layers are latent-only
    alone = Distiller(model, objective).train()
    with latent_branch_only(model):
        torch.testing.assert_close(alone(x, labels).loss.detach(), aux, rtol=1e-12, atol=0)


def test_window_drop_with_the_auxiliary_loss():
    x = ids(B=2, T=24)
    labels = labels_of(x)
    w, to = 0.25, 2
    wide = WindowDropDistiller(trained_like("llama").double(), prob=1.0, to=to, latent_aux_weight=w).train()
    small = Distiller(trained_like("llama", window_size=to).double()).train()  # the same weights
    got = wide(x, labels).loss
    with latent_branch_only(small.model):  # latent-only: the window's size does not matter
        aux = small(x, labels).loss
    torch.testing.assert_close(got, small(x, labels).loss + w * aux, rtol=1e-12, atol=0)
    assert all(m.window_size == W for m in wide.model.converted)  # restored


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf")])
def test_config_and_distiller_refuse_a_bad_weight(value):
    with pytest.raises(ValueError, match="latent_aux_weight"):
        DistillConfig(latent_aux_weight=value)
    with pytest.raises(ValueError, match="latent_aux_weight"):
        Distiller(trained_like("llama"), latent_aux_weight=value)


def test_the_cli_refuses_a_bad_weight_with_exit_2(capsys):
    from latte.cli import main

    code = main(["convert", "--quick", "--distill.latent_aux_weight=-1", "--train.run_dir=/nonexistent/run"])
    err = capsys.readouterr().err
    assert code == 2 and "distill.latent_aux_weight: got -1.0" in err and "finite number >= 0" in err


def test_a_decoding_state_is_refused_in_latent_only_mode():
    model = copy.deepcopy(trained_like("llama"))
    with latent_branch_only(model), pytest.raises(ValueError, match="latent_only"):
        model.generate(ids(B=1, T=12), max_new_tokens=2, do_sample=False)
