"""The bidirectional classifier: padding never changes the prediction."""

import pytest
import torch

from latte.models import LatteConfig, LatteForSequenceClassification


def make(mixer, pooling, position_embedding="learned"):
    torch.manual_seed(0)
    cfg = LatteConfig.tiny(mixer=mixer, causal=False, num_labels=3, pooling=pooling,
                           position_embedding=position_embedding)
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
