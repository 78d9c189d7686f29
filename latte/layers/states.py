"""Decoding states of the layers as values: their size in bytes and their
batch size, for any nesting of tensors in tuples, NamedTuples, dataclasses,
lists and dicts."""

from __future__ import annotations

import dataclasses

import torch


def _leaves(state):
    """Every tensor in a nested state, in order."""
    if isinstance(state, torch.Tensor):
        yield state
    elif dataclasses.is_dataclass(state) and not isinstance(state, type):
        for f in dataclasses.fields(state):
            yield from _leaves(getattr(state, f.name))
    elif isinstance(state, (tuple, list)):
        for s in state:
            yield from _leaves(s)
    elif isinstance(state, dict):
        for s in state.values():
            yield from _leaves(s)
    elif not (state is None or isinstance(state, (int, float, bool))):
        raise ValueError(f"state: cannot size an object of type {type(state).__name__}")


def state_nbytes(state) -> int:
    """Bytes held by a decoding state (None counts 0). Constant in the context
    length for every layer except SoftmaxAttention, whose KV cache grows."""
    return sum(t.numel() * t.element_size() for t in _leaves(state))


def state_batch_size(state) -> int | None:
    """Rows of a state (dim 0 of its first tensor), None if it holds none."""
    return next((int(t.shape[0]) for t in _leaves(state) if t.dim() > 0), None)
