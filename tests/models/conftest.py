"""Shared fixtures for the model tests: tiny models with fixed seeds."""

import pytest
import torch

from latte.models import LatteConfig, LatteForCausalLM


@pytest.fixture
def make_lm():
    """make_lm(mixer, seed=0, **config overrides) -> a tiny LatteForCausalLM in eval mode."""

    def make(mixer="latte", seed=0, **overrides):
        torch.manual_seed(seed)
        return LatteForCausalLM(LatteConfig.tiny(mixer=mixer, **overrides)).eval()

    return make


@pytest.fixture
def make_ids():
    """make_ids(B, T, seed=1, vocab=64) -> random token ids [B, T]."""

    def make(B, T, seed=1, vocab=64):
        return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))

    return make


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a loaded
    machine the thread pool's spinning makes every op ~10x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
