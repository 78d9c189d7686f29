"""fla's kernels as torch.library custom ops (latte/ops/latte/gla_ops.py):
what backend "fla" launches around chunk_gla, counted on `meta` tensors
(latte/bench/op_count.py), and torch.compile(fullgraph=True) through the
fla path on the CPU, where the ops' pure-torch stand-ins run under the same
names (backend "aot_eager": dynamo and AOTAutograd, no inductor compile).
"""

import pytest
import torch

from latte.bench import op_count
from latte.layers.latte_attention import LatteAttention
from latte.ops import backend as BK
from latte.ops import latte_causal, latte_causal_step
from latte.ops.latte import gla_ops
from tests.helpers import rel_err
from tests.ops.test_gla_backend import inputs


def test_fused_construction_fits_its_budget_on_meta():
    """Issue 56's shape (B 16, T 4096, H 16, L 128, bf16, no mask, no initial
    state): the fused construction adds at most 3 ops each way to chunk_gla's
    (views left out), at most 2.5 GiB of reads and writes forward and 3 GiB
    backward; the eager construction, counted the same way, is far above."""
    fused = op_count.fla_construction_count(construction="fused")
    print({k: {x: y for x, y in v.items() if x != "by_op"} for k, v in fused.items()})
    assert fused["forward"]["by_op"]["latte.chunk_gla"] == 1 and fused["backward"]["by_op"]["latte.chunk_gla_bwd"] == 1
    assert fused["forward"]["construction_ops"] <= 3 and fused["backward"]["construction_ops"] <= 3
    assert fused["forward"]["construction_gib"] <= 2.5 and fused["backward"]["construction_gib"] <= 3.0
    eager = op_count.fla_construction_count(construction="eager")
    assert eager["forward"]["construction_ops"] > 10 and eager["backward"]["construction_gib"] > 10 * 3.0
    assert eager["forward"]["kernel_gib"] == fused["forward"]["kernel_gib"]  # the same kernel, counted alike
    masked = op_count.fla_construction_count(construction="fused", masked=True)
    assert masked["forward"]["construction_gib"] > fused["forward"]["construction_gib"]  # reported in docs/gpu.md §2.3


@pytest.fixture
def fla_on_cpu(monkeypatch):
    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(gla_ops, "CPU_IMPL", "reference")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("construction", ["fused", "eager"])
@pytest.mark.parametrize("masked", [False, True])
def test_fla_path_compiles_without_graph_break(fla_on_cpu, monkeypatch, construction, masked):
    monkeypatch.setattr(BK, "_construction", construction)
    a, b, v = (x.float().requires_grad_() for x in inputs(20, scale=5.0))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :4] = False
    mask = mask if masked else None

    def step(a, b, v):
        y, st = latte_causal(a, b, v, mask=mask, backend="fla", output_final_state=True)
        y_t, st2 = latte_causal_step(a[:, -1], b[:, -1], v[:, -1], st, backend="fla")
        return (y.sum() + y_t.sum() + st2.S.sum()) if mask is None else (y[mask].sum() + st2.S.sum())

    grads = torch.autograd.grad(step(a, b, v), (a, b, v))
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    grads_c = torch.autograd.grad(compiled(a, b, v), (a, b, v))
    for g, gc in zip(grads, grads_c):
        assert rel_err(gc, g) < 1e-5


def test_latte_layer_on_fla_compiles_without_graph_break(fla_on_cpu, monkeypatch):
    monkeypatch.setattr(BK, "_construction", "fused")
    torch.manual_seed(0)
    layer = LatteAttention(16, 2, 4, backend="fla")
    x = torch.randn(2, 12, 16)
    y = layer(x)[0]
    y_c = torch.compile(lambda x: layer(x)[0], backend="aot_eager", fullgraph=True)(x)
    assert rel_err(y_c, y) < 1e-5
