"""Most tests use tiny tensors, where intra-op threads only cost time (and
thrash on a busy 2-core machine): run each test single-threaded, restoring
the setting afterwards. Tests that need threads set them themselves.

The test process keeps glibc's default allocator (latte.allocator.tune is
what the CLI and the benchmarks apply); tests/test_allocator.py checks it in
subprocesses.

Parametrised cases get readable ids: a dict of arguments reads
`num_layers=0,dim=8` and a tuple `2,16,4` where pytest would number them
(`kwargs0`, `shape1`)."""

import os

import pytest
import torch

os.environ.setdefault("LATTE_MALLOC", "default")


def _short(value, width: int = 24) -> str:
    text = value.__name__ if isinstance(value, type) else str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def pytest_make_parametrize_id(config, val, argname):
    if isinstance(val, dict):
        return ",".join(f"{k}={_short(v)}" for k, v in val.items()) or "no-kwargs"
    if isinstance(val, (tuple, list)):
        return ",".join(_short(v) for v in val) or "empty"
    if isinstance(val, torch.Tensor):
        return "tensor:" + _short(",".join(f"{x:g}" for x in val.flatten().tolist()))
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    return None  # pytest's own id (strings, numbers, ... as they are)


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
