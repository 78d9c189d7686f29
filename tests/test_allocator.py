"""latte.allocator.tune: applied by the CLI and the benchmarks, off with
LATTE_MALLOC=default; run in subprocesses so the test process keeps glibc's
defaults."""

import os
import subprocess
import sys

import pytest

CODE = "from latte.allocator import tune; print(tune()); print(tune())"


def _run(env_value):
    env = {k: v for k, v in os.environ.items() if k != "LATTE_MALLOC"}
    if env_value is not None:
        env["LATTE_MALLOC"] = env_value
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split("\n")[:2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc (Linux) only")
def test_tune_sets_mallopt_once_and_reports_it():
    first, second = _run(None)
    if first == "None":  # a Linux without glibc (e.g. musl): nothing to tune
        pytest.skip("no glibc mallopt in this C library")
    assert first.startswith("glibc mallopt(M_MMAP_MAX=0") and second == first


def test_latte_malloc_default_turns_it_off():
    assert _run("default") == ["None", "None"]
