"""Inputs are checked once, at the boundary (docs/design.md §10): a public op
of latte.ops validates its arguments and then runs unchecked cores, so the
composition inside it (macchiato -> window, sinks, latents; each decoding
step) never validates anything again.

The spy is a profiler hook: it sees every call into latte/ops/_checks.py
however the check was imported, and every entry into a public op."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import latte.ops as O
from latte.layers import MacchiatoAttention

CHECKS = str(Path(O.__file__).parent / "_checks.py")
SETTINGS = {"get_backend", "set_backend"}  # the process default, read by the ops: not ops themselves
PUBLIC = {getattr(O, n).__code__: n for n in O.__all__ if inspect.isfunction(getattr(O, n)) and n not in SETTINGS}
NOT_A_CHECK = {"state_dtype"}  # the dtype rule lives in _checks.py too, but checks nothing


def spy(fn) -> list[tuple[str, list[tuple]]]:
    """Runs fn(); returns, for each public op entered (outermost first), its
    name and the checks made in it: (check, argument name, what was checked)
    for every check called from outside _checks.py. Raises if a check runs anywhere but in a
    validator (a function named check_* or _check*) below the public op."""
    calls: list[tuple[str, list[tuple]]] = []
    misplaced: list[str] = []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in PUBLIC:
            calls.append((PUBLIC[code], []))
        elif code.co_filename == CHECKS and code.co_name not in NOT_A_CHECK:
            caller = frame.f_back
            if caller.f_code.co_filename == CHECKS:
                return  # a check's own helper (check_rank -> check_float)
            chain = []
            while caller is not None and caller.f_code not in PUBLIC:
                chain.append(caller.f_code.co_name)
                caller = caller.f_back
            if not all(c.lstrip("_") == "check" or c.lstrip("_").startswith("check_") for c in chain):
                misplaced.append(f"{code.co_name} called via {' <- '.join(chain)}")
            if not calls:
                calls.append(("(no public op)", []))
            args = frame.f_locals
            calls[-1][1].append(
                (code.co_name, args.get("name", args.get("names")), args.get("what", args.get("layout")))
            )

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    assert not misplaced, "checks run inside cores:\n" + "\n".join(misplaced)
    return calls


def twice(checks: list[tuple]) -> list[tuple]:
    return [n for n, c in Counter(checks).items() if c > 1]


def names(checks: list[tuple]) -> set[str]:
    return {name for _, name, _ in checks}


def inputs(B=2, T=21, H=4, K=2, L=3, E=8):
    torch.manual_seed(0)
    a, b = torch.randn(B, T, H, L), torch.randn(B, T, H, L)
    v, q, k = torch.randn(B, T, K, E), torch.randn(B, T, H, E), torch.randn(B, T, K, E)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :3] = False
    return a, b, v, q, k, mask


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_one_macchiato_forward_validates_each_argument_once(mix):
    a, b, v, q, k, mask = inputs()
    kw = dict(window_size=5, num_sinks=2, mix=mix, output_final_state=True)
    gate = torch.randn(a.shape[:3]) if mix == "gate" else None
    _, state = O.macchiato(a, b, v, q, k, mask=mask, gate=gate, **kw)
    calls = spy(lambda: O.macchiato(a, b, v, q, k, mask=mask, gate=gate, initial_state=state, sink_q=q, **kw))
    assert [c[0] for c in calls] == ["macchiato"]  # no public op inside it
    checks = calls[0][1]
    assert not twice(checks), f"validated more than once: {twice(checks)}"
    wanted = {"a", "b", "q", "k", "v", "mask", "sink_q", "initial_state.latte.S", "initial_state.window.k"}
    assert wanted | {"initial_state.sinks.k"} | ({"gate"} if gate is not None else set()) <= names(checks)


def test_one_decoding_step_validates_each_argument_once():
    a, b, v, q, k, mask = inputs()
    _, state = O.macchiato(a, b, v, q, k, mask=mask, window_size=5, num_sinks=2, output_final_state=True)
    t = 0
    calls = spy(
        lambda: O.macchiato_step(
            a[:, t], b[:, t], v[:, t], q[:, t], k[:, t], state, window_size=5, num_sinks=2, mask_t=mask[:, t]
        )
    )
    assert [c[0] for c in calls] == ["macchiato_step"]  # not latte_causal_step or sliding_window_step again
    checks = calls[0][1]
    assert not twice(checks), f"validated more than once: {twice(checks)}"
    wanted = {"a_t", "b_t", "q_t", "k_t", "v_t", "mask_t", "state.latte.S", "state.window.k", "state.sinks.k"}
    assert wanted <= names(checks)


@pytest.mark.parametrize("op", ["sliding_window_attention", "sliding_window_attention_lse", "sliding_window_step"])
def test_window_ops_validate_once(op):
    _, _, v, q, k, _ = inputs()
    args = (q[:, 0], k[:, 0], v[:, 0]) if op.endswith("step") else (q, k, v)
    calls = spy(lambda: getattr(O, op)(*args, window_size=5))
    assert [c[0] for c in calls] == [op]
    assert calls[0][1] and not twice(calls[0][1])


def test_a_layer_forward_and_step_enter_macchiato_once_each():
    layer = MacchiatoAttention(dim=16, num_heads=2, latents_per_head=2, window_size=4, num_sinks=1).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        _, state = layer(x)
        prefill = spy(lambda: layer(x))
        step = spy(lambda: layer(x[:, :1], state=state))
    for calls, op in ((prefill, "macchiato"), (step, "macchiato_step")):
        assert [c[0] for c in calls].count(op) == 1
        assert all(not twice(checks) for _, checks in calls)


def test_the_spy_sees_a_second_validation(monkeypatch):
    """The spy itself can fail: a composition that calls a public op twice
    validates the same arguments twice, and a check inside a core is named."""
    a, b, v, _, _, _ = inputs()
    step = (a[:, 0], b[:, 0], v[:, 0].repeat(1, 2, 1))
    calls = spy(lambda: [O.latte_causal_step(*step) for _ in range(2)])
    assert [c[0] for c in calls] == ["latte_causal_step"] * 2
    assert ("check_rank", "a_t", "[B, H, Lh]") in twice(calls[0][1] + calls[1][1])

    causal = importlib.import_module("latte.ops.latte.causal")
    core = causal.causal_step

    def core_that_checks(a_t, *rest):  # a core that validates again
        causal.check_rank("a_t", a_t, 3, "[B, H, Lh]")
        return core(a_t, *rest)

    monkeypatch.setattr(causal, "causal_step", core_that_checks)
    with pytest.raises(AssertionError, match="check_rank called via core_that_checks"):
        spy(lambda: O.latte_causal_step(*step))
