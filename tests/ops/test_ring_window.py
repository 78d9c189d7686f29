"""The ring window buffer of a static decoding state (RingWindowState,
sliding_window.py; ring_memory.py): in float64, every step's output and
log-normaliser equal the value step's over the shifted WindowState, for the
window alone, with sinks and with every memory rule, through several wraps
of the ring; the ring is written in place at its index."""

import pytest
import torch

from latte.models.static_decode import _static_layer
from latte.ops import macchiato, macchiato_step, sliding_window_attention, sliding_window_step
from latte.ops.window.memory import Memory
from latte.ops.window.sliding_window import RingWindowState, ring_window_state

B, H, K, L, E = 2, 4, 2, 3, 5


def _inputs(T, seed):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return r(B, T, H, L), r(B, T, H, L), r(B, T, K, E), r(B, T, H, E), r(B, T, K, E)


@pytest.mark.parametrize("W, T, N", [(5, 7, 12), (5, 2, 9), (1, 4, 3), (2, 3, 6), (9, 3, 4)])
def test_sliding_window_steps_on_the_ring_equal_the_value_steps(W, T, N):
    *_, v, q, k = _inputs(T + N, 0)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :2] = False  # left padding: masked slots in the ring
    _, state = sliding_window_attention(q[:, :T], k[:, :T], v[:, :T], window_size=W, mask=mask, output_final_state=True)
    R = min(W, T + N) - 1
    ring = ring_window_state(state, R, T)
    k_ptr = ring.k.data_ptr()
    for t in range(T, T + N - 1):
        y, state = sliding_window_step(q[:, t], k[:, t], v[:, t], state, window_size=W)
        y_ring, out = sliding_window_step(q[:, t], k[:, t], v[:, t], ring, window_size=W)
        assert out is ring and ring.k.data_ptr() == k_ptr
        torch.testing.assert_close(y_ring, y, rtol=1e-12, atol=1e-12)
        if R:
            assert int(ring.index) == (t + 1) % R


MEMORY = [None, ("key_norm", 0), ("attention", 2), ("random", 1), ("recall", 0), ("key_norm", 3)]


@pytest.mark.parametrize("memory", MEMORY, ids=str)
@pytest.mark.parametrize("W, T, N", [(4, 6, 14), (4, 2, 10), (12, 4, 5)])
def test_macchiato_steps_on_the_ring_equal_the_value_steps(memory, W, T, N):
    a, b, v, q, k = _inputs(T + N, 1)
    kw = dict(window_size=W, num_sinks=1 if memory is None else memory[1])
    if memory is not None:
        kw["memory"] = Memory(3, memory[0], seed=5)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :3] = False
    _, state = macchiato(
        a[:, :T], b[:, :T], v[:, :T], q[:, :T], k[:, :T], mask=mask, output_final_state=True, chunk_size=4, **kw
    )
    static = _static_layer(state, W, T + N, T)
    assert isinstance(static.window, RingWindowState) and static.window.mask.shape[1] == min(W, T + N) - 1
    for t in range(T, T + N - 1):
        args = (a[:, t], b[:, t], v[:, t], q[:, t], k[:, t])
        y, state = macchiato_step(*args, state, **kw)
        y_ring, static = macchiato_step(*args, static, **kw)
        torch.testing.assert_close(y_ring, y, rtol=1e-12, atol=1e-12)
        if memory is not None:  # the slots hold the same tokens
            for f in ("k", "v", "score", "pos", "mask"):
                torch.testing.assert_close(getattr(static.memory, f), getattr(state.memory, f), rtol=1e-12, atol=0)
