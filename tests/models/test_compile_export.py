"""torch.compile and torch.export of the causal LM, every mixer.

- the training forward (with labels: the fused head + loss) traces as one
  graph (fullgraph=True fails on any graph break), and its backward, which
  AOT autograd derives from that graph, gives eager's gradients;
- the compiled step (inductor, the default backend) gives eager's loss and
  gradients;
- torch.export.export of the forward (eval mode) at fixed shapes gives eager's
  logits, run under no_grad as an exported forward is used.
"""

import pytest
import torch

MIXERS = ["latte", "macchiato", "softmax", "linear", "swa"]


def step_fn(model, forward=None):
    """Loss and parameter gradients of one training step; forward: the
    (compiled) callable that runs the model (default: the model itself)."""
    forward = model if forward is None else forward

    def step(ids):
        loss = forward(ids, labels=ids).loss
        grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        return loss, grads

    return step


@pytest.mark.parametrize("mixer", MIXERS)
def test_training_step_has_no_graph_break(make_lm, make_ids, mixer):
    """aot_eager traces the model's forward and derives its backward: any
    graph break or untraceable op fails the fullgraph compile."""
    model = make_lm(mixer).train()
    ids = make_ids(2, 40)  # T not a multiple of the chunk / window block sizes
    torch._dynamo.reset()
    compiled = step_fn(model, torch.compile(model, backend="aot_eager", fullgraph=True))
    torch.manual_seed(0)
    loss, grads = compiled(ids)
    torch.manual_seed(0)
    loss_ref, grads_ref = step_fn(model)(ids)
    torch.testing.assert_close(loss, loss_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["latte", "macchiato"])
def test_inductor_compiled_step_equals_eager(make_lm, make_ids, mixer):
    model = make_lm(mixer).train()
    ids = make_ids(2, 40)
    torch._dynamo.reset()
    loss, grads = step_fn(model, torch.compile(model))(ids)
    loss_ref, grads_ref = step_fn(model)(ids)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-4, atol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("mixer", MIXERS)
def test_export_causal_lm_forward(make_lm, make_ids, mixer):
    model = make_lm(mixer)
    ids = make_ids(2, 40)

    class Logits(torch.nn.Module):  # the exported program returns a tensor, not the output dataclass
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(ids).logits

    wrapped = Logits(model.eval())
    program = torch.export.export(wrapped, (ids,))
    with torch.no_grad():  # inference, what an exported forward is for: the ops' in-place fast paths stay legal
        torch.testing.assert_close(program.module()(ids), wrapped(ids))
        other = make_ids(2, 40, seed=5)
        torch.testing.assert_close(program.module()(other), wrapped(other))
