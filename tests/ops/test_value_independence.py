"""No op has a data-dependent slow path: checked structurally, never timed.

Every ATen call an op makes (forward and backward) is recorded with the
shapes and dtypes of its tensor arguments. For the same shapes, the record
must be identical for every input distribution (std 1 ... std 100 logits,
+80 spikes, all-padding rows): no branch on values, no fallback, no extra
work for some inputs. No call may read a value back to the host (.item(),
bool(tensor), nonzero: a sync, and a graph break for torch.compile). And no
exp may receive an argument whose result is subnormal or zero: on CPU such
lanes leave the vectorised path and cost ~10-40x more (_exp.py).
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from latte.ops import (
    LatteState,
    latte_bidirectional,
    latte_causal,
    latte_causal_step,
    linear_cross_entropy,
    linear_recurrence,
    macchiato,
    macchiato_step,
    sliding_window_attention,
    sliding_window_step,
)
from latte.ops import distributions as dists
from latte.ops.cross_entropy import LinearCrossEntropy

aten = torch.ops.aten
SYNCS = {aten._local_scalar_dense, aten.is_nonzero, aten.nonzero, aten.item, aten.equal}
# exp results below these are subnormal or zero (log of the smallest normal)
SLOW_EXP = {
    torch.float32: math.log(torch.finfo(torch.float32).tiny),
    torch.float64: math.log(torch.finfo(torch.float64).tiny),
}
LOG2E = 1 / math.log(2)  # exp2's slow arguments: the same results, in bits


def slow_lanes(op, args):
    """How many exp arguments below the slow threshold an op evaluates
    (fused ops: the exponent they form internally)."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return 0
    low = SLOW_EXP[x.dtype]
    if op in (aten.exp, aten.exp_):
        arg = x
    elif op in (aten.exp2, aten.exp2_):
        low *= LOG2E
        arg = x
    elif op in (aten._softmax, aten._log_softmax, aten.logsumexp):
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        if any(d % x.dim() != x.dim() - 1 for d in dims):
            return 0  # over a strided dim the fused kernel measured ~1.2x on std-100 inputs (vectorised: 2x)
        arg = x - x.amax(dims, keepdim=True)
    elif op in (aten.sigmoid, aten.sigmoid_):
        arg = -x.abs()
    elif op == aten.softplus:
        arg = x
    elif op == aten.logaddexp:
        arg = -(x - args[1]).abs()
    else:
        return 0
    return int((arg < low).sum())


class Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls, self.syncs, self.slow_exp_lanes = [], [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCS or func.overloadpacket in SYNCS:
            self.syncs.append(str(func))
        self.slow_exp_lanes += slow_lanes(func.overloadpacket, args)
        leaves = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.calls.append((str(func), tuple((tuple(t.shape), t.dtype) for t in leaves)))
        return func(*args, **kwargs)


def record(fn):
    with Record() as r:
        fn()
    return r


def _logits(shape, name, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dists.logits(torch.randn(*shape, generator=g), name)


def _mask(name, B, T):
    m = dists.mask(name, B, T)
    return torch.ones(B, T, dtype=torch.bool) if m is None else m  # same call structure for every distribution


def _grads(out, leaves):
    torch.autograd.grad(out, leaves, torch.ones_like(out))


def latte_call(name, B=2, T=80, H=2, L=8, D=4, state=True):
    a, b = _logits((B, T, H, L), name, 1), _logits((B, T, H, L), name, 2)
    v = _logits((B, T, H, D), "std1", 3)
    leaves = [x.requires_grad_() for x in (a, b, v)]
    st = LatteState(torch.randn(B, H, L, D), torch.randn(B, H, L)) if state else None
    m = _mask(name, B, T)

    def call():
        y, s = latte_causal(a, b, v, chunk_size=32, mask=m, initial_state=st, output_final_state=True)
        _grads(y.sum() + s.S.sum() + s.z.sum(), leaves)

    return call


def macchiato_call(name, B=2, T=80, H=2, L=8, D=4, num_sinks=0):
    a, b = _logits((B, T, H, L), name, 1), _logits((B, T, H, L), name, 2)
    q, k = _logits((B, T, H, 6), name, 4), _logits((B, T, 1, 6), name, 5)
    v = _logits((B, T, 1, D), "std1", 3)
    leaves = [x.requires_grad_() for x in (a, b, v, q, k)]
    m = _mask(name, B, T)

    def call():
        y, _ = macchiato(a, b, v, q, k, window_size=20, chunk_size=32, mask=m, num_sinks=num_sinks)
        _grads(y, leaves)

    return call


def window_call(name, B=2, T=150, H=2):
    q, k, v = _logits((B, T, H, 6), name, 1), _logits((B, T, 1, 6), name, 2), _logits((B, T, 1, 5), "std1", 3)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    m = _mask(name, B, T)

    def call():
        _grads(sliding_window_attention(q, k, v, window_size=70, mask=m)[0], leaves)

    return call


def recurrence_call(name):
    x = _logits((2, 70, 6), "std1", 1).requires_grad_()
    log_a = (-torch.nn.functional.softplus(_logits((2, 70, 6), name, 2))).detach().requires_grad_()
    return lambda: _grads(linear_recurrence(x, log_a, chunk_size=16)[0], [x, log_a])


def cross_entropy_call(name):
    h = _logits((40, 16), name, 1).requires_grad_()
    W = _logits((300, 16), "std1", 2).requires_grad_()
    m = dists.mask(name, 40, 1)
    t = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3))
    if m is not None:
        t = t.masked_fill(~m[:, 0], -100)
    # the kernel itself; the public wrapper adds one eager-only target check (below)
    return lambda: _grads(LinearCrossEntropy.apply(h, W, t, -100, 16, (True, True)), [h, W])


def bidirectional_call(name):
    a, b = _logits((2, 50, 2, 8), name, 1), _logits((2, 50, 2, 8), name, 2)
    v = _logits((2, 50, 2, 4), "std1", 3)
    leaves = [x.requires_grad_() for x in (a, b, v)]
    m = _mask(name, 2, 50)
    return lambda: _grads(latte_bidirectional(a, b, v, mask=m), leaves)


def steps_call(name, T=12, num_sinks=0):
    a, b = _logits((2, T, 2, 8), name, 1), _logits((2, T, 2, 8), name, 2)
    q, k, v = _logits((2, T, 2, 6), name, 3), _logits((2, T, 1, 6), name, 4), _logits((2, T, 1, 4), "std1", 5)
    m = _mask(name, 2, T)

    def call():
        s1 = s2 = s3 = None
        for t in range(T):
            _, s1 = latte_causal_step(a[:, t], b[:, t], v[:, t].expand(-1, 2, -1), s1, mask_t=m[:, t])
            _, s2 = macchiato_step(
                a[:, t], b[:, t], v[:, t], q[:, t], k[:, t], s2, window_size=5, mask_t=m[:, t], num_sinks=num_sinks
            )
            _, s3 = sliding_window_step(q[:, t], k[:, t], v[:, t], s3, window_size=5, mask_t=m[:, t])

    return call


OPS = {
    "latte_causal": latte_call,
    "latte_causal_no_state": lambda name: latte_call(name, state=False),
    "macchiato": macchiato_call,
    "macchiato_sinks": lambda name: macchiato_call(name, num_sinks=4),
    "sliding_window": window_call,
    "linear_recurrence": recurrence_call,
    "linear_cross_entropy": cross_entropy_call,
    "latte_bidirectional": bidirectional_call,
    "decode_steps": steps_call,
    "decode_steps_sinks": lambda name: steps_call(name, num_sinks=2),
}


@pytest.mark.parametrize("op", list(OPS))
def test_same_work_for_every_input_distribution(op):
    base = record(OPS[op]("std1"))
    assert base.calls and not base.syncs, base.syncs
    for name in dists.DISTRIBUTIONS:
        r = record(OPS[op](name))
        assert not r.syncs, (name, r.syncs)
        assert r.slow_exp_lanes == 0, f"{op} {name}: {r.slow_exp_lanes} exp arguments on the slow path"
        assert r.calls == base.calls, f"{op} {name}: the calls differ from std1's"


def test_cross_entropy_reads_back_only_for_its_eager_target_check():
    h, W = torch.randn(40, 16, requires_grad=True), torch.randn(300, 16)
    t = torch.randint(0, 300, (40,))
    assert len(record(lambda: linear_cross_entropy(h, W, t).backward()).syncs) == 1


def test_the_recorder_sees_slow_paths():
    """The checks above can fail: a branch on values, a sync and a plain exp are caught."""

    def branchy(x):
        return x.exp() if bool((x > 50).any()) else x + 1

    small, large = record(lambda: branchy(torch.zeros(4))), record(lambda: branchy(torch.full((4,), 100.0)))
    assert small.syncs and small.calls != large.calls
    assert record(lambda: torch.exp(torch.full((3,), -100.0))).slow_exp_lanes == 3
    assert record(lambda: torch.exp2(torch.tensor([-100.0, -130.0]))).slow_exp_lanes == 1
    assert record(lambda: torch.softmax(torch.tensor([0.0, -100.0, -200.0]), 0)).slow_exp_lanes == 2
    assert record(lambda: torch.softmax(torch.tensor([[0.0], [-100.0]]), 0)).slow_exp_lanes == 0  # strided dim
