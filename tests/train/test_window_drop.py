"""Window drop (latte.convert.window_drop): a dropped batch is computed
exactly as by a model converted with the small window (same weights), the
window is restored after, validation never drops, and the draw depends
only on the batch."""

import pytest
import torch

from latte.convert.distill import Distiller
from latte.convert.task import DistillConfig
from latte.convert.window_drop import WindowDropDistiller, dropped, shrunk_window
from tests.convert.test_decode_and_io import W, ids, trained_like


def loss_and_grads(distiller, x):
    distiller.zero_grad()
    labels = torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], 1)
    loss = distiller(x, labels).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in distiller.model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize("to", [1, 3])
def test_a_dropped_batch_is_the_small_window_model(to):
    x = ids(B=2, T=40)
    wide = WindowDropDistiller(trained_like("llama", window_size=W).double(), prob=1.0, to=to).train()
    small = Distiller(trained_like("llama", window_size=to).double()).train()  # the same weights
    got, got_g = loss_and_grads(wide, x)
    want, want_g = loss_and_grads(small, x)
    assert got == pytest.approx(want, rel=1e-10) and got_g.keys() == want_g.keys() and got_g
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-8, atol=1e-10)
    assert all(m.window_size == W for m in wide.model.modules() if hasattr(m, "window_size"))  # restored
    # the check can fail: the full window gives another loss; so do eval mode and prob 0
    full, _ = loss_and_grads(Distiller(trained_like("llama", window_size=W).double()).train(), x)
    assert full != pytest.approx(want, rel=1e-6)
    assert loss_and_grads(wide.eval(), x)[0] == pytest.approx(full, rel=1e-10)
    never = WindowDropDistiller(trained_like("llama", window_size=W).double(), prob=0.0, to=to).train()
    assert loss_and_grads(never, x)[0] == pytest.approx(full, rel=1e-10)


def test_the_draw_depends_on_the_batch_only():
    batches = [ids(B=1, T=16, seed=s) for s in range(400)]
    draws = [dropped(b, 0.3) for b in batches]
    assert draws == [dropped(b, 0.3) for b in batches]  # resumed runs draw the same
    assert 0.2 < sum(draws) / len(draws) < 0.4
    assert not any(dropped(b, 0.0) for b in batches) and all(dropped(b, 1.0) for b in batches)


def test_shrunk_window_restores_after_an_error_and_rejects_nonsense():
    model = trained_like("llama")
    with pytest.raises(RuntimeError, match="boom"), shrunk_window(model, 2):
        raise RuntimeError("boom")
    assert all(m.window_size == W for m in model.modules() if hasattr(m, "window_size"))
    with pytest.raises(ValueError, match="window size 0"), shrunk_window(model, 0):
        pass
    with pytest.raises(ValueError, match="prob=2"):
        WindowDropDistiller(model, prob=2, to=4)


@pytest.mark.parametrize("field,value", [("window_drop", 1.5), ("window_drop", -0.1), ("window_drop_to", 0)])
def test_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        DistillConfig(**{field: value})
