"""The cost of the memory slots (latte/ops/window/memory.py), counted in
operations and tensor sizes, never in time: a decoding step reads its M
slots in O(M) also at fixed rotary positions, its op count stays bounded,
and the attention rule's prefill scores do not loop over the window's
offsets. Their values are tested against the float64 reference in
test_memory_slots.py; here, that every path also runs on `meta`."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from latte.ops.macchiato import macchiato, macchiato_step
from latte.ops.window import memory as mem
from latte.ops.window.memory import Memory, MemoryArgs
from latte.ops.window.sinks import merge

B, H, K, E, L = 2, 4, 2, 8, 3


class _Count(TorchDispatchMode):
    """The aten ops run inside it and the largest tensor any of them returned."""

    def __init__(self):
        super().__init__()
        self.ops, self.largest = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def rotary(pos):
    inv = 1.0 / 10000 ** (torch.arange(0, E, 2, dtype=torch.float32, device=pos.device) / E)
    ang = pos.float()[:, None] * inv
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


def _inputs(T, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(B, T, H, L, generator=g), torch.randn(B, T, H, L, generator=g)
    v, q, k = (torch.randn(B, T, n, E, generator=g) for n in (K, H, K))
    return [x.to(device) for x in (a, b, v, q, k)]


def _step_cost(M, rule="key_norm", rot=None, W=6, S=1):
    """(ops, largest tensor) of one memory_step with every slot held."""
    T = M + W + S + 4
    a, b, v, q, k = _inputs(T + 1)
    memory = Memory(M, rule, 0, rot)
    kw = dict(window_size=W, num_sinks=S, memory=memory)
    _, st = macchiato(a[:, :T], b[:, :T], v[:, :T], q[:, :T], k[:, :T], output_final_state=True, **kw)
    assert bool(st.memory.mask.all())
    cfg = MemoryArgs(memory, W, S, E**-0.5, None, 64)
    recall = q[:, T] if rule == "recall" else None  # any [B, H, D]: only its cost counts
    args = (q[:, T], k[:, T], v[:, T], q[:, T], torch.zeros(B, H), recall, None, None, st.window, st.memory, cfg)
    with _Count() as c:
        mem.memory_step(*args)
    return c.ops, c.largest


def test_step_reads_fixed_position_slots_in_linear_size():
    """Slots at fixed rotary positions: doubling M doubles the largest tensor
    of a step (the old read rotated every slot to every position: M^2 E,
    8,192 and 32,768 elements here)."""
    small, large = _step_cost(16, rot=rotary)[1], _step_cost(32, rot=rotary)[1]
    assert large <= 2 * small


@pytest.mark.parametrize("rule, bound", [("key_norm", 92), ("recall", 97), ("random", 122)])
def test_step_op_count_is_bounded(rule, bound):
    """A step is a fixed number of tensor ops whatever M; the bound (the
    first step took 139, 144 and 180 here, the second 108, 113 and 137)
    catches a loop over the slots, a table rebuilt per slot, a hash
    recomputed on tensors or a selection that is not one gather."""
    ops16, ops32 = _step_cost(16, rule)[0], _step_cost(32, rule)[0]
    assert ops16 == ops32
    assert ops16 <= bound


def test_step_joins_the_window_and_sinks_in_fewer_ops():
    """memory_step given the local branch's (y, lse) returns the merged pair:
    the same values as its own read merged by sinks.merge, in fewer ops
    (one softmax over the local branch and the slots)."""
    M, W, S = 16, 6, 1
    T = M + W + S + 4
    a, b, v, q, k = (x.double() for x in _inputs(T + 1))
    memory = Memory(M, "key_norm")
    _, st = macchiato(
        *(x[:, :T] for x in (a, b, v, q, k)), output_final_state=True, window_size=W, num_sinks=S, memory=memory
    )
    cfg = MemoryArgs(memory, W, S, E**-0.5, None, 64)
    args = (q[:, T], k[:, T], v[:, T], q[:, T], torch.zeros(B, H), None, None, None, st.window, st.memory, cfg)
    local = (torch.randn(B, H, E, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64))
    with _Count() as apart:
        y_m, lse_m, st_a = mem.memory_step(*args)
        want = merge(*local, y_m, lse_m)
    with _Count() as joined:
        y, lse, st_j = mem.memory_step(*args, local)
    torch.testing.assert_close((y, lse), want, atol=1e-12, rtol=1e-12)
    assert all(torch.equal(x, z) for x, z in zip(st_a, st_j))
    assert joined.ops < apart.ops


def _prefill_ops(W, T=64):
    a, b, v, q, k = _inputs(T)
    with _Count() as c:
        macchiato(a, b, v, q, k, window_size=W, num_sinks=1, memory=Memory(4, "attention"), chunk_size=64)
    return c.ops


def test_attention_rule_prefill_does_not_loop_over_the_window():
    """Rule "attention" scores each token by the window attention it
    received: a few ops per block of keys, not ten per window offset (the
    old loop: 1,342 more ops at w = 64 than at w = 8)."""
    assert _prefill_ops(64) - _prefill_ops(8) < 100


@pytest.mark.parametrize("rule", ["key_norm", "attention", "recall", "random"])
@pytest.mark.parametrize("rot", [None, rotary])
def test_memory_runs_on_meta(rule, rot):
    """Every tensor of the slot branch takes its device from its inputs:
    prefill and a step run on meta (a CPU tensor mixed in would raise)."""
    a, b, v, q, k = _inputs(20, "meta")
    kw = dict(window_size=5, num_sinks=1, memory=Memory(3, rule, 2, rot))
    y, st = macchiato(a, b, v, q, k, output_final_state=True, chunk_size=8, **kw)
    y_t, st = macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st, **kw)
    leaves = [y, y_t, *st.memory]
    assert all(t.device.type == "meta" for t in leaves)
