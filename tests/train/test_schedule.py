"""lr_at: warm-up, each decay, constant tail, and argument validation."""

from __future__ import annotations

import math

import pytest

from latte.train.schedule import lr_at

KW = dict(base_lr=1.0, warmup_steps=4, total_steps=12)


def test_warmup_is_linear_from_base_over_warmup():
    assert [lr_at(s, **KW) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_decay_reaches_min_at_total_then_stays(decay):
    kw = dict(KW, decay=decay, min_lr_ratio=0.1)
    lrs = [lr_at(s, **kw) for s in range(4, 20)]
    assert lrs[0] == 1.0
    assert all(a > b for a, b in zip(lrs[:8], lrs[1:9]))  # strictly decreasing until total_steps
    assert all(lr == pytest.approx(0.1) for lr in lrs[8:])  # min_lr_ratio * base_lr from then on


def test_decay_shapes_at_midpoint():
    # Half-way through the decay (step 8 of 4..12): linear and cosine both give the mean.
    assert lr_at(8, **KW, decay="linear") == pytest.approx(0.5)
    assert lr_at(8, **KW, decay="cosine") == pytest.approx(0.5)
    assert lr_at(6, **KW, decay="cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(6, **KW, decay="linear") == pytest.approx(0.75)


def test_constant_and_no_warmup():
    assert [lr_at(s, **KW, decay="constant") for s in (3, 4, 12, 1000)] == [1.0] * 4
    assert lr_at(0, base_lr=3e-4, warmup_steps=0, total_steps=10) == 3e-4
    assert lr_at(10, base_lr=3e-4, warmup_steps=10, total_steps=10, min_lr_ratio=0.5) == 1.5e-4


def test_pure_function_of_step():
    # Resuming at any step gives the same value as an uninterrupted run.
    straight = [lr_at(s, **KW, decay="cosine") for s in range(20)]
    assert [lr_at(s, **KW, decay="cosine") for s in reversed(range(20))][::-1] == straight


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(KW, step=-1), "step: got -1"),
        (dict(KW, step=1.0), "step: got 1.0"),
        (dict(KW, base_lr=-1.0), "base_lr: got -1.0"),
        (dict(KW, base_lr=float("nan")), "base_lr: got nan"),
        (dict(KW, warmup_steps=13), r"warmup_steps: got 13, expected <= total_steps \(12\)"),
        (dict(KW, total_steps=0), "total_steps: got 0"),
        (dict(KW, decay="step"), "decay: got 'step', expected one of 'linear', 'cosine', 'constant'"),
        (dict(KW, min_lr_ratio=1.5), r"min_lr_ratio: got 1.5, expected a number in \[0, 1\]"),
    ],
)
def test_bad_arguments(kw, match):
    kw = dict(kw)
    step = kw.pop("step", 0)
    with pytest.raises(ValueError, match=match):
        lr_at(step, **kw)
