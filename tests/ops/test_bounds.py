"""Bounds that match the work (issue 59, cases 4, 5, 8 and 9): a window far
beyond the sequence costs the sequence; an empty batch gets the same clear
error as an empty sequence; every float argument is finite and in range,
checked on the Python scalar at the op boundary; value checks skip meta
tensors."""

from __future__ import annotations

import math
import time

import pytest
import torch

from latte._checks import values_readable
from latte.ops import (
    latte_bidirectional,
    latte_causal,
    latte_causal_step,
    linear_attention,
    linear_attention_step,
    macchiato,
    macchiato_step,
    reference,
    sliding_window_attention,
    sliding_window_step,
)
from latte.ops._checks import check_cu_seqlens
from latte.ops.window.sliding_window import full_window_state
from tests.helpers import rel_err

f64 = torch.float64


def _mac(B=2, T=6, H=2, L=3, E=4, D=3, dtype=f64):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(B, T, H, L, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, D, generator=g, dtype=dtype)
    q, k = (torch.randn(B, T, H, E, generator=g, dtype=dtype) for _ in range(2))
    return a, b, v, q, k


# ---- case 5: batch size 0 ------------------------------------------------------------

EMPTY = _mac(B=0)
EMPTY_BATCH = {
    "latte_causal": lambda: latte_causal(*EMPTY[:3]),
    "latte_causal_step": lambda: latte_causal_step(*(x[:, 0] for x in EMPTY[:3])),
    "latte_bidirectional": lambda: latte_bidirectional(*EMPTY[:3]),
    "linear_attention": lambda: linear_attention(EMPTY[3], EMPTY[4], EMPTY[2]),
    "linear_attention_step": lambda: linear_attention_step(EMPTY[3][:, 0], EMPTY[4][:, 0], EMPTY[2][:, 0]),
    "sliding_window_attention": lambda: sliding_window_attention(EMPTY[3], EMPTY[4], EMPTY[2], window_size=3),
    "sliding_window_step": lambda: sliding_window_step(EMPTY[3][:, 0], EMPTY[4][:, 0], EMPTY[2][:, 0], window_size=3),
    "macchiato": lambda: macchiato(*EMPTY, window_size=3),
    "macchiato_step": lambda: macchiato_step(*(x[:, 0] for x in EMPTY), window_size=3),
}


@pytest.mark.parametrize("op", list(EMPTY_BATCH))
def test_a_batch_of_zero_rows_is_refused_like_an_empty_sequence(op):
    """latte_causal divided by zero in chunked.py, the layers failed a reshape."""
    with pytest.raises(ValueError, match=r"batch size B must be >= 1, got 0 \(shape \(0, "):
        EMPTY_BATCH[op]()


def test_an_empty_sequence_says_the_same_as_before():
    a, b, v, q, k = _mac(T=0)
    with pytest.raises(ValueError, match="a: sequence length T must be >= 1, got 0"):
        latte_causal(a, b, v)
    with pytest.raises(ValueError, match="q: sequence length T must be >= 1, got 0"):
        sliding_window_attention(q, k, v, window_size=3)


# ---- case 9: float arguments -----------------------------------------------------------

BAD_FLOATS = [math.nan, 0.0, -1.0, math.inf, -math.inf, torch.tensor(0.5), True, "0.5"]


@pytest.mark.parametrize("value", BAD_FLOATS, ids=repr)
@pytest.mark.parametrize("op", ["macchiato", "macchiato_step", "sliding_window_attention", "sliding_window_step"])
def test_scale_must_be_a_finite_positive_number(op, value):
    """scale nan gave an all-NaN output; 0 a uniform window; -1 the least similar key."""
    a, b, v, q, k = _mac()
    calls = {
        "macchiato": lambda: macchiato(a, b, v, q, k, window_size=3, scale=value),
        "macchiato_step": lambda: macchiato_step(*(x[:, 0] for x in (a, b, v, q, k)), window_size=3, scale=value),
        "sliding_window_attention": lambda: sliding_window_attention(q, k, v, window_size=3, scale=value),
        "sliding_window_step": lambda: sliding_window_step(q[:, 0], k[:, 0], v[:, 0], window_size=3, scale=value),
    }
    with pytest.raises(ValueError, match=r"scale: expected None or a finite number > 0, got "):
        calls[op]()


@pytest.mark.parametrize("value", [math.inf, math.nan, 0.0, -2.0])
def test_softcap_must_be_finite_too(value):
    """softcap = inf passed the old check and turned every score into inf * 0 = NaN."""
    a, b, v, q, k = _mac()
    with pytest.raises(ValueError, match=r"softcap: expected None or a finite number > 0"):
        macchiato(a, b, v, q, k, window_size=3, softcap=value)


def test_good_floats_pass_including_numpy_scalars():
    np = pytest.importorskip("numpy")
    a, b, v, q, k = _mac()
    y, _ = sliding_window_attention(q, k, v, window_size=3, scale=np.float32(0.25), softcap=np.float64(30.0))
    want, _ = reference.sliding_window_attention(q, k, v, 3, scale=0.25, softcap=30.0)
    assert rel_err(y, want) < 1e-10


# ---- case 4: a window far beyond the sequence ------------------------------------------


def test_a_window_of_a_million_costs_the_sequence_not_the_window():
    """Window 1e6 at T = 32 used 5 GB and more than 100 s: the buffers were
    window-sized. Now it is the same work as a window of T, exactly."""
    a, b, v, q, k = _mac(B=2, T=32, dtype=torch.float32)
    t0 = time.perf_counter()
    y_big, st_big = macchiato(a, b, v, q, k, window_size=10**6, output_final_state=True)
    seconds = time.perf_counter() - t0
    y_T, _ = macchiato(a, b, v, q, k, window_size=32)
    assert torch.equal(y_big, y_T)
    assert st_big.window.k.shape[1] == 32  # the positions seen, not W - 1 = 999,999
    assert seconds < 5.0, seconds  # was > 100 s (a loose bound: only the order of magnitude matters)


def test_prefill_then_steps_with_a_window_beyond_the_context_equal_one_pass():
    """The state grows with the positions up to W - 1, then stays: a prefill
    of 5 tokens and 6 steps equal the whole sequence, for W above, equal to
    and below the context."""
    a, b, v, q, k = _mac(T=11)
    for W in (10**6, 11, 4):
        want = reference.macchiato(a, b, v, q, k, W)  # the float64 O(T^2) ground truth
        y, st = macchiato(*(x[:, :5] for x in (a, b, v, q, k)), window_size=W, output_final_state=True)
        assert st.window.k.shape[1] == min(W - 1, 5)
        ys = [y]
        for t in range(5, 11):
            y_t, st = macchiato_step(*(x[:, t] for x in (a, b, v, q, k)), st, window_size=W)
            ys.append(y_t[:, None])
            assert st.window.k.shape[1] == min(W - 1, t + 1)
        assert rel_err(torch.cat(ys, 1), want) < 1e-12, W


def test_a_full_size_state_of_before_is_still_accepted():
    """A W - 1 slot state (the old, fixed size) continues exactly as the short one."""
    a, b, v, q, k = _mac(T=9)
    _, st = macchiato(*(x[:, :3] for x in (a, b, v, q, k)), window_size=6, output_final_state=True)
    assert st.window.k.shape[1] == 3
    full = st._replace(window=full_window_state(st.window, 6))
    assert full.window.k.shape[1] == 5
    rest = tuple(x[:, 3:] for x in (a, b, v, q, k))
    y_short, _ = macchiato(*rest, window_size=6, initial_state=st)
    y_full, _ = macchiato(*rest, window_size=6, initial_state=full)
    assert rel_err(y_short, y_full) < 1e-14
    with pytest.raises(ValueError, match=r"initial_state.window.mask: holds 5 slots, more than window_size - 1 = 3"):
        macchiato(*rest, window_size=4, initial_state=full)


# ---- case 8: value checks skip meta tensors ------------------------------------------


def test_value_checks_skip_meta_tensors():
    assert values_readable(torch.zeros(2)) and not values_readable(torch.zeros(2), torch.zeros(2, device="meta"))
    check_cu_seqlens(torch.tensor([0, 3, 8], device="meta"), 1, 8)  # its values are unreadable: not read
    with pytest.raises(ValueError, match="must end at T=8"):
        check_cu_seqlens(torch.tensor([0, 3, 7]), 1, 8)
    a, b, v, q, k = (x.to("meta") for x in _mac(B=1, T=8))
    y, _ = macchiato(a, b, v, q, k, window_size=3)  # shapes only: nothing is read
    assert y.shape == v.shape and y.device.type == "meta"


@pytest.mark.parametrize("W", [40, 10**6])
def test_the_flex_window_takes_a_short_state_like_the_tiles(W):
    """The flex_attention window (the CUDA path, eager on CPU here) sizes its
    band by the same positions as the tiles kernel, with a state shorter than
    W - 1, padding and per-row lengths."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from latte.ops.window.flex_window import flex_window
    from latte.ops.window.sliding_window import WindowState, window_blocked

    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 50, 2, 6, generator=g, dtype=f64) for _ in range(2))
    v = torch.randn(2, 50, 2, 5, generator=g, dtype=f64)
    mask = torch.ones(2, 50, dtype=torch.bool)
    mask[1, 30:] = False
    state = WindowState(torch.randn(2, 7, 2, 6, dtype=f64), torch.randn(2, 7, 2, 5, dtype=f64), torch.rand(2, 7) < 0.7)
    for lengths in (None, torch.tensor([50, 30])):
        got = flex_window(q, k, v, W, 0.3, mask, state, lengths)
        want = window_blocked(q, k, v, W, 0.3, mask, state, lengths)
        full = window_blocked(q, k, v, W, 0.3, mask, full_window_state(state, W) if W < 100 else state, lengths)
        assert rel_err(got[0][mask], want[0][mask]) < 1e-12 and rel_err(got[1][mask], want[1][mask]) < 1e-12
        assert rel_err(full[0][mask], want[0][mask]) < 1e-12
        assert all(torch.equal(x, x_t) for x, x_t in zip(got[2], want[2]))
        assert want[2].k.shape[1] == min(W - 1, 7 + 50)
