"""fla-core's real Triton kernels (the gate, chunk_gla forward and backward,
fused_recurrent_gla) through the "fused" construction, on CPU tensors under
Triton's interpreter: a capped float32 subset of tests/ops/test_gla_fused.py
(left padding then spikes, packed documents with masks and initial states, a
fully padded row, decoding steps, expanded gradients), in a child process, since the interpreter
must be chosen before fla's kernels are first imported. The whole matrix:
`python tests/gpu/interpret_fla.py` (minutes). Skips where Triton is not
installed (the torch CPU wheel does not bring it; .ci/run installs it where
the disk allows).
"""

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBSET = [
    "test_left_padding_then_spikes[80.0]",
    "test_packed_documents_with_initial_states_and_mask",
    "test_fully_padded_row_ends_in_the_empty_state",
    "test_decode_steps[40.0]",
    "test_gradients_of_sums_reach_the_kernels_contiguous",
]
CAP_S = 60


def interpret(tests, timeout):
    env = dict(os.environ, LATTE_FLA_INTERPRET="1", TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    ids = [f"tests/ops/test_gla_fused.py::{t}" for t in tests]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (pip install triton)")
@pytest.mark.skipif(
    importlib.util.find_spec("fla") is None, reason="fla-core is not installed (pip install 'latte[cuda]')"
)
def test_fla_kernels_under_the_interpreter_match_the_reference():
    t0 = time.perf_counter()
    res = interpret(SUBSET, CAP_S)
    tail = (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0, tail
    assert re.search(rf"\b{len(SUBSET)} passed\b", res.stdout) and "skipped" not in res.stdout, tail
    assert time.perf_counter() - t0 < CAP_S
