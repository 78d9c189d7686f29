"""Bad input raises ValueError naming the argument; no causal path is O(T^2) in memory."""

import json
import subprocess
import sys

import pytest
import torch

from latte.ops import (
    LatteState,
    WindowState,
    latte_bidirectional,
    latte_causal,
    latte_causal_step,
    linear_recurrence,
    macchiato,
    sliding_window_attention,
)

a = torch.randn(1, 8, 2, 4)
v = torch.randn(1, 8, 2, 3)
q = torch.randn(1, 8, 2, 5)
k = torch.randn(1, 8, 1, 5)
vk = torch.randn(1, 8, 1, 3)

BAD = {
    "rank": (lambda: latte_causal(a[0], a[0], v[0]), "a: expected a 4-d tensor"),
    "lh_mismatch": (lambda: latte_causal(a, a[..., :3], v), "a, b: shapes must match"),
    "time_mismatch": (lambda: latte_causal(a, a, v[:, :5]), "sequence lengths must match"),
    "heads_mismatch": (lambda: latte_bidirectional(a, a, v[:, :, :1]), "head counts must match"),
    "int_dtype": (lambda: latte_causal(a.long(), a, v), "expected a floating-point tensor, got dtype torch.int64"),
    "chunk_size": (lambda: latte_causal(a, a, v, chunk_size=0), "chunk_size: expected an integer >= 1, got 0"),
    "window_size": (lambda: sliding_window_attention(q, k, vk, window_size=0), "window_size: expected an integer >= 1"),
    "cu_start": (lambda: latte_causal(a, a, v, cu_seqlens=torch.tensor([1, 8])), "cu_seqlens: must start at 0"),
    "cu_order": (lambda: latte_causal(a, a, v, cu_seqlens=torch.tensor([0, 5, 5, 8])), "strictly increasing"),
    "cu_end": (lambda: latte_causal(a, a, v, cu_seqlens=torch.tensor([0, 5, 7])), "must end at T=8, got 7"),
    "cu_batch": (
        lambda: latte_causal(
            a.expand(2, -1, -1, -1), a.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), cu_seqlens=torch.tensor([0, 8])
        ),
        "batch size 1",
    ),
    "state_shape": (
        lambda: latte_causal(a, a, v, initial_state=LatteState(torch.zeros(1, 2, 4, 9), torch.zeros(1, 2, 4))),
        "initial_state.S: expected shape (1, 2, 4, 3)",
    ),
    "state_type": (lambda: latte_causal_step(a[:, 0], a[:, 0], v[:, 0], state=(1, 2)), "state: expected a LatteState"),
    "window_state": (
        lambda: sliding_window_attention(
            q,
            k,
            vk,
            window_size=4,
            initial_state=WindowState(
                torch.zeros(1, 2, 1, 5), torch.zeros(1, 3, 1, 3), torch.zeros(1, 3, dtype=torch.bool)
            ),
        ),
        "initial_state.k",
    ),
    "gqa": (
        lambda: sliding_window_attention(
            torch.randn(1, 8, 3, 5), torch.randn(1, 8, 2, 5), torch.randn(1, 8, 2, 3), window_size=2
        ),
        "must be a multiple of key/value heads",
    ),
    "mask_dtype": (lambda: latte_causal(a, a, v, mask=torch.ones(1, 8)), "mask: expected a bool tensor"),
    "mix": (lambda: macchiato(a, a, vk, q, k, window_size=4, mix="sum"), "mix: expected one of"),
    "gate_missing": (lambda: macchiato(a, a, vk, q, k, window_size=4, mix="gate"), 'gate: mix="gate" needs'),
    "beta_shape": (lambda: macchiato(a, a, vk, q, k, window_size=4, beta=torch.zeros(3)), "beta: expected shape (2,)"),
    "recurrence": (lambda: linear_recurrence(torch.randn(2, 5, 3), torch.randn(2, 5, 4)), "log_a: expected shape"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_problem(case):
    fn, message = BAD[case]
    with pytest.raises(ValueError, match=None) as err:
        fn()
    assert message in str(err.value), str(err.value)


MEMORY_PROBE = r"""
import json, resource, sys, torch
from latte.ops import latte_causal, macchiato
torch.manual_seed(0)
T, which = int(sys.argv[1]), sys.argv[2]
x = lambda *s: torch.randn(*s, requires_grad=True)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if which == "latte":
    y, _ = latte_causal(x(1, T, 2, 4), x(1, T, 2, 4), x(1, T, 2, 8))
else:
    y, _ = macchiato(x(1, T, 2, 4), x(1, T, 2, 4), x(1, T, 1, 8), x(1, T, 2, 8), x(1, T, 1, 8), window_size=64)
y.square().sum().backward()
print(json.dumps({"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("which", ["latte", "macchiato"])
def test_no_quadratic_memory_at_32k(which):
    # A float32 T x T matrix at T = 32768 alone is 4 GiB; the linear paths need
    # a few tens of MB here. The bound leaves room for allocator noise.
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, "32768", which], capture_output=True, text=True, check=True
    )
    peak_mb = json.loads(out.stdout)["peak_kb"] / 1024
    assert peak_mb < 512, f"{which}: forward+backward at T=32768 grew RSS by {peak_mb:.0f} MB"
