"""Shared fixture for the conversion tests (as tests/models/conftest.py)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a loaded
    machine the thread pool's spinning makes every op ~10x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
