"""Most tests use tiny tensors, where intra-op threads only cost time (and
thrash on a busy 2-core machine): run each test single-threaded, restoring
the setting afterwards. Tests that need threads set them themselves."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
