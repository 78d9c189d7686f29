"""Every parameter learns; the paper's Table 6 model builds and trains."""

import time

import pytest
import torch

from latte.models import MIXERS, LatteConfig, LatteForCausalLM, LatteForSequenceClassification


def assert_every_parameter_has_a_gradient(model):
    missing = [
        n
        for n, p in model.named_parameters()
        if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0
    ]
    assert not missing, f"no (or zero / non-finite) gradient for {missing}"


@pytest.mark.parametrize("mixer", [*MIXERS, ["latte", "macchiato"]])
@pytest.mark.parametrize(
    "extra",
    [
        {},
        dict(
            mix="gate", tie_embeddings=False, position_embedding="learned", mlp="gelu", norm="layernorm", num_kv_heads=1
        ),
    ],
)
def test_every_parameter_gets_a_gradient(make_lm, make_ids, mixer, extra):
    model = make_lm(mixer, **extra).train()
    x = make_ids(2, 20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :5] = False
    model(x, labels=x, attention_mask=mask).loss.backward()
    assert_every_parameter_has_a_gradient(model)


@pytest.mark.parametrize("mixer", ["latte", "softmax", "linear"])
def test_classifier_parameters_get_gradients(make_ids, mixer):
    torch.manual_seed(0)
    model = LatteForSequenceClassification(
        LatteConfig.tiny(mixer=mixer, causal=False, qk_mixer="conv", position_embedding="learned")
    )
    model(make_ids(3, 9), labels=torch.tensor([0, 1, 1])).loss.backward()
    assert_every_parameter_has_a_gradient(model)


def test_a_few_steps_reduce_the_loss(make_lm, make_ids):
    model = make_lm("macchiato").train()
    x = make_ids(4, 24)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("mixer", MIXERS)
def test_paper_table6_preset_forward_backward_at_512(mixer):
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.paper_table6(mixer=mixer))
    n = model.num_parameters()
    t = time.perf_counter()
    x = torch.randint(0, 50257, (1, 512))
    out = model(x, labels=x)
    out.loss.backward()
    print(
        f"\nTable 6 preset, mixer={mixer}: {n:,} parameters "
        f"({model.num_parameters(exclude_embeddings=True):,} without embeddings), "
        f"forward+backward at T=512: {time.perf_counter() - t:.2f}s"
    )
    assert out.logits is None and torch.isfinite(out.loss)  # training: the fused loss skips logits
    assert abs(out.loss.item() - 10.8) < 1.0  # ~ln(50257) at init
    assert 45e6 < n < 60e6


@pytest.mark.parametrize("tie", [True, False])
def test_fused_training_loss_equals_the_logits_path(make_lm, make_ids, tie):
    """Training mode skips the [B, T, V] logits (fused head + cross-entropy);
    loss and every gradient equal those of the plain logits path."""
    x = make_ids(3, 17)
    mask = torch.ones(3, 17, dtype=torch.bool)
    mask[2, :4] = False
    grads = []
    for return_logits in (False, True):
        model = make_lm("macchiato", tie_embeddings=tie, dropout=0.0).train()
        out = model(x, labels=x, attention_mask=mask, return_logits=return_logits)
        assert (out.logits is None) == (not return_logits)
        out.loss.backward()
        grads.append((out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    for n, g in grads[1][1].items():
        torch.testing.assert_close(grads[0][1][n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_logits_default_by_mode(make_lm, make_ids):
    model, x = make_lm("latte"), make_ids(2, 9)
    assert model.train()(x, labels=x).logits is None  # training with gradients: fused
    assert model(x).logits.shape == (2, 9, 64)  # no labels: logits
    with torch.no_grad():
        assert model(x, labels=x).logits is not None
    assert model.eval()(x, labels=x).logits is not None


def test_shift_labels_equal_labels_shifted_inside(make_lm, make_ids):
    model = make_lm("latte").eval()
    w = make_ids(2, 12)
    ref = model(w, labels=w).loss
    y = torch.nn.functional.pad(w[:, 1:], (0, 1), value=-100)
    torch.testing.assert_close(model(w, shift_labels=y).loss, ref)
    with pytest.raises(ValueError, match="labels, shift_labels: give exactly one"):
        model(w, labels=w, shift_labels=y)
    with pytest.raises(ValueError, match="shift_labels: found 64"):
        model(w, shift_labels=torch.full_like(w, 64))
    with pytest.raises(ValueError, match="return_logits=False needs labels"):
        model(w, return_logits=False)


@pytest.mark.parametrize("mixer", ["macchiato", "latte", "softmax"])
def test_gradient_checkpointing_recomputes_blocks_with_the_same_gradients(make_lm, make_ids, mixer):
    """Activation checkpointing: each block runs again in the backward, and
    loss and gradients (dropout included: the RNG is replayed) are unchanged."""
    x = make_ids(2, 20)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :5] = False
    grads = []
    for enable in (False, True):
        model = make_lm(mixer, dropout=0.1).train()
        if enable:
            model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing == enable
        runs = []
        model.model.blocks[0].register_forward_pre_hook(lambda *a, runs=runs: runs.append(1))
        torch.manual_seed(7)
        loss = model(x, labels=x, attention_mask=mask).loss
        loss.backward()
        assert len(runs) == (2 if enable else 1)  # forward, then the recompute in the backward
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = grads
    assert torch.equal(l0, l1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-6, rtol=1e-5, msg=name)
    model.gradient_checkpointing_disable()
    model.eval()
    model.gradient_checkpointing_enable()
    runs.clear()
    model.generate(x[:, :4], 2)  # no effect in eval mode / without gradients
    assert len(runs) == 2
