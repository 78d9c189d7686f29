"""Every tensor the library, the references, the test helpers and the CUDA
benchmarks create takes its device from its inputs (issue 42, item 1).

Run on `meta` tensors: a meta tensor mixed with a CPU tensor raises, as a
CUDA one would, so a mask, index or cotangent built on the CPU fails here on
a CPU-only machine. The forward and backward of every op's torch path run,
with the test helpers' gradients. What meta cannot run at all, because it
has no values: packed documents (`cu_seqlens` is read on the host to size
the padded batch) and the value checks (token ids, targets), which the ops
and models skip on meta or with `validate_inputs = False`; fla and
flex_attention need CUDA and Triton and are not torch paths.
"""

import pytest
import torch

import latte.ops as O
from latte.bench import cuda, cuda_check
from latte.models.causal_lm import LatteForCausalLM
from latte.models.config import LatteConfig
from latte.ops import reference as R
from tests.helpers import grads_of

META = "meta"
B, T, H, L, D, E, W = 2, 37, 2, 4, 5, 6, 8


def _r(*shape):
    return torch.randn(*shape).to(META)


@pytest.fixture(scope="module")
def x():
    a, b, v, q, k = _r(B, T, H, L), _r(B, T, H, L), _r(B, T, H, D), _r(B, T, H, E), _r(B, T, H, E)
    mask = torch.ones(B, T, dtype=torch.bool, device=META)
    return {"a": a, "b": b, "v": v, "q": q, "k": k, "mask": mask}


def _latte(x, **kw):
    return grads_of(lambda a, b, v: O.latte_causal(a, b, v, backend="torch", **kw)[0], [x["a"], x["b"], x["v"]])


def _macchiato(x, **kw):
    fn = lambda a, b, v, q, k: O.macchiato(a, b, v, q, k, window_size=W, backend="torch", **kw)[0]  # noqa: E731
    return grads_of(fn, [x["a"], x["b"], x["v"], x["q"], x["k"]])


CASES = {
    "reference.latte_causal": lambda x: R.latte_causal(x["a"], x["b"], x["v"], mask=x["mask"]),
    "reference.latte_causal, state": lambda x: R.latte_causal(
        x["a"], x["b"], x["v"], initial_state=(_r(B, H, L, D), _r(B, H, L))
    ),
    "reference.latte_causal_matrix": lambda x: R.latte_causal_matrix(x["a"], x["b"], x["mask"]),
    "reference.latte_bidirectional": lambda x: R.latte_bidirectional(x["a"], x["b"], x["v"], x["mask"]),
    "reference.sliding_window_attention": lambda x: R.sliding_window_attention(
        x["q"], x["k"], x["v"], W, mask=x["mask"], num_sinks=2, sink_q=x["q"]
    ),
    "reference.macchiato": lambda x: R.macchiato(x["a"], x["b"], x["v"], x["q"], x["k"], W, mask=x["mask"]),
    "reference.linear_recurrence": lambda x: R.linear_recurrence(x["a"], x["b"]),
    "reference.linear_attention": lambda x: R.linear_attention(
        x["q"], x["k"], x["v"], mask=x["mask"], initial_state=(_r(B, H, E, D), _r(B, H, E))
    ),
    "latte_causal": lambda x: _latte(x, chunk_size=16),
    "latte_causal, mask and state": lambda x: _latte(
        x, mask=x["mask"], initial_state=O.LatteState(_r(B, H, L, D), _r(B, H, L))
    ),
    "latte_causal_step": lambda x: O.latte_causal_step(x["a"][:, 0], x["b"][:, 0], x["v"][:, 0]),
    "latte_bidirectional": lambda x: grads_of(
        lambda a, b, v: O.latte_bidirectional(a, b, v, mask=x["mask"]), [x["a"], x["b"], x["v"]]
    ),
    "macchiato": lambda x: _macchiato(x, mask=x["mask"]),
    "macchiato, sinks and softcap": lambda x: _macchiato(x, num_sinks=2, softcap=5.0),
    "macchiato_step": lambda x: O.macchiato_step(*(x[n][:, 0] for n in "abvqk"), window_size=W, backend="torch"),
    "sliding_window_attention": lambda x: grads_of(
        lambda q, k, v: O.sliding_window_attention(q, k, v, window_size=W, mask=x["mask"])[0],
        [x["q"], x["k"], x["v"]],
    ),
    "sliding_window_step": lambda x: O.sliding_window_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], window_size=W),
    "linear_attention": lambda x: grads_of(
        lambda q, k, v: O.linear_attention(q, k, v, mask=x["mask"])[0], [x["q"], x["k"], x["v"]]
    ),
    "linear_attention, bidirectional": lambda x: grads_of(
        lambda q, k, v: O.linear_attention(q, k, v, causal=False, mask=x["mask"])[0], [x["q"], x["k"], x["v"]]
    ),
    "linear_attention_step": lambda x: O.linear_attention_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0]),
    "linear_recurrence": lambda x: grads_of(lambda u, la: O.linear_recurrence(u, la)[0], [x["a"], x["b"]]),
    "linear_cross_entropy": lambda x: grads_of(
        lambda h, w: O.linear_cross_entropy(h, w, torch.zeros(7, dtype=torch.long, device=META)), [_r(7, 5), _r(11, 5)]
    ),
    "bench check: exact reference": lambda x: cuda_check._reference(x["a"], x["b"], x["v"], x["v"], True),
    "bench check: torch float64 reference": lambda x: cuda_check._reference(x["a"], x["b"], x["v"], x["v"], False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_runs_on_meta(name, x):
    out = CASES[name](x)
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    assert leaves and all(t.device.type == META for t in leaves)


def test_cpu_tensor_in_a_meta_op_raises():
    """The premise: meta catches a device mix-up (else every test above could not fail)."""
    with pytest.raises(RuntimeError, match="device"):
        _r(3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), 0.0)


@pytest.mark.parametrize("mixer", ["latte", "macchiato", "linear", "softmax", "swa"])
def test_models_forward_backward_on_meta(mixer):
    cfg = LatteConfig(
        vocab_size=50, dim=16, num_layers=1, num_heads=2, latents_per_head=4, mixer=mixer, window_size=4,
        qk_mixer="conv_rglru", chunk_size=8,
    )  # fmt: skip
    model = LatteForCausalLM(cfg).to(META)
    model.model.validate_inputs = False  # the id range check reads values
    ids = torch.zeros(2, 19, dtype=torch.long, device=META)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert out.logits is None or out.logits.device.type == META
    assert all(p.grad.device.type == META for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("provider", ["latte", "macchiato", "sdpa"])
def test_cuda_bench_inputs_follow_its_device(provider, monkeypatch):
    """latte bench ops --device cuda builds its inputs on its DEVICE."""
    monkeypatch.setattr(cuda, "DEVICE", META)
    inputs, fn = cuda.make_inputs(provider, 24, torch.float32, 1, (2, 4, 4))
    for t in inputs:
        t.requires_grad_(True)
    fn(*inputs).sum().backward()
    assert all(t.grad.device.type == META for t in inputs)
