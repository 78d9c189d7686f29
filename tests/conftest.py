"""Most tests use tiny tensors, where intra-op threads only cost time (and
thrash on a busy 2-core machine): run each test single-threaded, restoring
the setting afterwards. Tests that need threads set them themselves.

The test process keeps glibc's default allocator (latte.allocator.tune is
what the CLI and the benchmarks apply); tests/test_allocator.py checks it in
subprocesses."""

import os

import pytest
import torch

os.environ.setdefault("LATTE_MALLOC", "default")


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
