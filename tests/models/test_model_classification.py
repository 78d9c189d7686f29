"""The bidirectional classifier: padding never changes the prediction."""

import pytest
import torch

from latte.models import LatteConfig, LatteForSequenceClassification


def make(mixer, pooling, position_embedding="learned"):
    torch.manual_seed(0)
    cfg = LatteConfig.tiny(
        mixer=mixer, causal=False, num_labels=3, pooling=pooling, position_embedding=position_embedding
    )
    return LatteForSequenceClassification(cfg).eval()


@pytest.mark.parametrize("mixer", ["latte", "softmax", "linear", ["latte", "softmax"]])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_does_not_change_the_prediction(make_ids, mixer, pooling):
    model = make(mixer, pooling)
    seqs = [make_ids(1, n, seed=n)[0] for n in (12, 5, 9)]
    ref = torch.cat([model(s[None]).logits for s in seqs])
    for side in ("left", "right"):
        x = torch.full((3, 16), 7, dtype=torch.long)
        mask = torch.zeros(3, 16, dtype=torch.bool)
        for i, s in enumerate(seqs):
            sl = slice(16 - len(s), 16) if side == "left" else slice(0, len(s))
            x[i, sl], mask[i, sl] = s, True
        out = model(x, attention_mask=mask)
        torch.testing.assert_close(out.logits, ref, atol=1e-5, rtol=0)
        # and the mask matters: without it the padded tokens change the logits
        assert not torch.allclose(model(x).logits, ref, atol=1e-3)


def test_loss_and_label_errors(make_ids):
    model = make("latte", "mean", "sinusoidal")
    x = make_ids(4, 10)
    labels = torch.tensor([0, 2, 1, 1])
    out = model(x, labels=labels)
    assert out.logits.shape == (4, 3)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 2\]"):
        model(x, labels=torch.tensor([0, 3, 1, 1]))
    with pytest.raises(ValueError, match="labels: expected integer class ids of shape"):
        model(x, labels=torch.zeros(4, 10, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one real token"):
        model(x, attention_mask=torch.zeros(4, 10, dtype=torch.bool))


# ------------------------------------------------------------------ pairs (two towers)


def make_pair(mixer="latte", pooling="mean"):
    from latte.models import LatteForPairClassification

    torch.manual_seed(0)
    cfg = LatteConfig.tiny(mixer=mixer, causal=False, num_labels=2, pooling=pooling, position_embedding="sinusoidal")
    return LatteForPairClassification(cfg).eval()


def _padded(seqs, T):
    x = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        x[i, : len(s)], mask[i, : len(s)] = s, True
    return x, mask


@pytest.mark.parametrize("mixer", ["latte", "softmax", "linear"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pair_towers_are_independent_of_padding_and_of_each_other(make_ids, mixer, pooling):
    model = make_pair(mixer, pooling)
    a = [make_ids(1, n, seed=n)[0] for n in (7, 12)]
    b = [make_ids(1, n, seed=50 + n)[0] for n in (15, 4)]
    single = torch.cat([model(x[None], y[None]).logits for x, y in zip(a, b)])
    xa, ma = _padded(a, 12)
    xb, mb = _padded(b, 20)
    out = model(xa, xb, attention_mask=ma, attention_mask_2=mb)
    torch.testing.assert_close(out.logits, single, atol=1e-5, rtol=0)
    # the head reads [u, v, u*v, u-v] of the two pooled towers of the shared encoder
    u = torch.stack(
        [model.model(x[None])[0].mean(1)[0] if pooling == "mean" else model.model(x[None])[0][0, 0] for x in a]
    )
    v = torch.stack(
        [model.model(y[None])[0].mean(1)[0] if pooling == "mean" else model.model(y[None])[0][0, 0] for y in b]
    )
    torch.testing.assert_close(model.head(torch.cat([u, v, u * v, u - v], -1)), single, atol=1e-5, rtol=0)


def test_pair_loss_errors_and_save_load(tmp_path, make_ids):
    from latte.models import from_pretrained

    model = make_pair()
    x, y = make_ids(3, 6), make_ids(3, 9, seed=2)
    labels = torch.tensor([0, 1, 1])
    out = model(x, y, labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match=r"input_ids_2: expected \[B, T\] with B=3"):
        model(x, make_ids(2, 9))
    with pytest.raises(ValueError, match=r"class ids must be in \[0, 1\]"):
        model(x, y, labels=torch.tensor([0, 2, 1]))
    model.save_pretrained(tmp_path)
    back = from_pretrained(tmp_path).eval()
    assert type(back).__name__ == "LatteForPairClassification"
    torch.testing.assert_close(back(x, y).logits, model.eval()(x, y).logits)
