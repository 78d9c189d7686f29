"""Bad inputs fail with a ValueError before any compute; absolute positions
have a limit, Latte itself has none."""

import pytest
import torch

from latte.models import LatteConfig, LatteForCausalLM, LatteForSequenceClassification


@pytest.fixture
def model_and_calls(make_lm):
    model = make_lm("latte")
    calls = []
    model.model.embed.register_forward_hook(lambda *a: calls.append(1))
    return model, calls


@pytest.mark.parametrize(
    "x, match",
    [
        (torch.tensor([[1, 2, 64]]), r"found id 64, but ids must be in \[0, 63\] \(max id 63, vocab_size 64\)"),
        (torch.tensor([[1, -3, 2]]), r"found id -3"),
        (torch.tensor([[1.0, 2.0]]), "integer dtype"),
        (torch.tensor([True, False])[None], "integer dtype"),
        (torch.tensor([1, 2, 3]), r"shape \[B, T >= 1\]"),
        (torch.zeros(2, 0, dtype=torch.long), r"shape \[B, T >= 1\]"),
        ([[1, 2]], "integer tensor"),
    ],
)
def test_bad_input_ids_raise_before_compute(model_and_calls, x, match):
    model, calls = model_and_calls
    with pytest.raises(ValueError, match=match):
        model(x)
    with pytest.raises(ValueError, match=match):
        model.generate(x, 3) if isinstance(x, torch.Tensor) and x.dim() == 2 else model(x)
    assert calls == []


def test_bad_labels_and_masks(make_lm, make_ids):
    model = make_lm("latte")
    x = make_ids(2, 5)
    with pytest.raises(ValueError, match=r"labels: found 64"):
        model(x, labels=torch.full((2, 5), 64))
    with pytest.raises(ValueError, match="labels: expected shape"):
        model(x, labels=x[:, :3])
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        model(x, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="attention_mask: expected bool or 0/1"):
        model(x, attention_mask=torch.ones(2, 5))  # float


def test_loss_is_shifted_ignores_minus_100_and_padding(make_lm, make_ids):
    model = make_lm("softmax")
    x = make_ids(2, 9)
    out = model(x, labels=x)
    logp = out.logits[:, :-1].log_softmax(-1).gather(-1, x[:, 1:, None])[..., 0]
    torch.testing.assert_close(out.loss, -logp.mean())
    labels = x.clone()
    labels[0, 4:] = -100
    ref = -(logp[0, :3].sum() + logp[1].sum()) / (3 + 8)
    torch.testing.assert_close(model(x, labels=labels).loss, ref)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :6] = False  # left padding: targets 1..5 of row 1 are padding
    out = model(x, labels=x, attention_mask=mask)
    lp = out.logits[:, :-1].log_softmax(-1).gather(-1, x[:, 1:, None])[..., 0]
    torch.testing.assert_close(out.loss, -(lp[0].sum() + lp[1, 5:].sum()) / (8 + 3))
    assert model(x, labels=torch.full_like(x, -100)).loss.item() == 0.0


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_absolute_positions_raise_naming_the_limit(kind):
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(position_embedding=kind, max_position_embeddings=16)).eval()
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="17 positions exceeds max_position_embeddings=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    state = model(torch.zeros(1, 10, dtype=torch.long), use_cache=True).state
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        model(torch.zeros(1, 7, dtype=torch.long), state=state)
    # padding does not count: 20 columns, 16 real tokens
    mask = torch.ones(1, 20, dtype=torch.bool)
    mask[0, :4] = False
    model(torch.zeros(1, 20, dtype=torch.long), attention_mask=mask)


def test_latte_has_no_length_limit_and_stays_finite(make_lm):
    model = make_lm("latte", chunk_size=64)
    with torch.no_grad():
        out = model(torch.randint(0, 64, (1, 5000)))
    assert torch.isfinite(out.logits).all()


def test_models_check_config_direction():
    with pytest.raises(ValueError, match="causal=True"):
        LatteForCausalLM(LatteConfig.tiny(causal=False))
    with pytest.raises(ValueError, match="causal=False"):
        LatteForSequenceClassification(LatteConfig.tiny())
    enc = LatteForSequenceClassification(LatteConfig.tiny(causal=False))
    with pytest.raises(ValueError, match="keeps no decoding state"):
        enc.model(torch.zeros(1, 3, dtype=torch.long), use_cache=True)


def test_inputs_are_checked_once_and_positions_counted_once(make_lm, make_ids, monkeypatch):
    """One validation per forward (each value check is a host sync), and the
    positions come from the model: no layer counts them again, and the
    cache holds the one counter (layer states carry none)."""
    import latte.layers.rope as rope
    import latte.models.modeling as modeling

    model = make_lm(["macchiato", "softmax"])
    x = make_ids(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    calls = {"ids": 0, "mask": 0, "layer positions": 0}

    def counting(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)

        return wrapped

    monkeypatch.setattr(modeling, "check_input_ids", counting("ids", modeling.check_input_ids))
    monkeypatch.setattr(modeling, "check_attention_mask", counting("mask", modeling.check_attention_mask))
    monkeypatch.setattr(rope, "real_positions", counting("layer positions", rope.real_positions))
    out = model(x, labels=x, attention_mask=mask, use_cache=True)
    assert calls == {"ids": 1, "mask": 1, "layer positions": 0}
    assert all(s.pos is None for s in out.state.layers) and out.state.pos.tolist() == [6, 9]
    model.generate(x, 4, attention_mask=mask, temperature=0)
    assert calls == {"ids": 2, "mask": 2, "layer positions": 0}  # once for the prompt, never per token


def test_mask_errors_name_the_value_and_small_int_ids_work(make_lm, make_ids):
    model = make_lm("latte")
    x = make_ids(1, 4)
    with pytest.raises(ValueError, match="attention_mask: expected bool or 0/1 integers .*found value 2"):
        model(x, attention_mask=torch.tensor([[1, 2, 1, 1]]))
    assert torch.equal(model(x.to(torch.uint8)).logits, model(x).logits)


def test_value_checks_can_be_switched_off(make_lm):
    """validate_inputs=False skips the checks that read values (host syncs):
    a bad id then reaches the embedding, which fails in its own words."""
    model = make_lm("latte")
    bad = torch.tensor([[1, 2, 64]])
    with pytest.raises(ValueError, match="found id 64"):
        model(bad)
    model.model.validate_inputs = False
    with pytest.raises(IndexError):
        model(bad)
    with pytest.raises(ValueError, match="integer dtype"):  # structural checks stay: they cost nothing
        model(bad.float())


@pytest.mark.parametrize("mixer", ["linear", "softmax"])
def test_model_boundary_compiles_without_graph_breaks(make_lm, make_ids, mixer):
    """Under torch.compile the value checks are skipped (no .item(), no
    graph break): fullgraph=True fails on any break. The mixers chosen here
    have ops without breaks of their own; the checks are the same for all."""
    model = make_lm(mixer)
    x = make_ids(2, 12)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    step = torch.compile(
        lambda ids, am: model(ids, attention_mask=am, labels=ids).loss, backend="eager", fullgraph=True
    )
    torch.testing.assert_close(step(x, mask), model(x, attention_mask=mask, labels=x).loss)
