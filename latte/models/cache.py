"""`LatteCache`: the decoding state of a whole model.

One state per layer, as returned by the layer's `forward` (a tuple of tensors
of a size independent of the context for every mixer but softmax), plus the
number of positions fed so far and the number of real tokens per row (the
absolute position of the next token when padding is involved).

A cache is a value: `forward` returns a new one and never changes the one it
was given, so a prefix state can be reused for several continuations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..layers import state_nbytes


@dataclass
class LatteCache:
    layers: list[Any]  # one layer state per block (None for a layer that keeps none)
    seen_tokens: int  # positions fed so far, padding included
    pos: torch.Tensor  # [B] int64 real tokens fed so far, per row

    @property
    def batch_size(self) -> int:
        return int(self.pos.shape[0])

    def nbytes(self) -> int:
        """Bytes held by all layer states (the `pos` counter excluded)."""
        return sum(state_nbytes(s) for s in self.layers)

    def layer_nbytes(self) -> list[int]:
        return [state_nbytes(s) for s in self.layers]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LatteCache:
        """A new cache with `fn` applied to every tensor whose first dim is the batch."""
        return LatteCache([map_state(fn, s) for s in self.layers], self.seen_tokens, fn(self.pos))

    def select(self, index: torch.Tensor) -> LatteCache:
        """Rows `index` (reorder, drop or repeat rows: beam search, batch pruning)."""
        return self.map(lambda t: t.index_select(0, index.to(t.device)))

    def repeat_interleave(self, repeats: int) -> LatteCache:
        return self.map(lambda t: t.repeat_interleave(repeats, dim=0))


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: Any) -> Any:
    """Applies `fn` to every tensor in a nested state (NamedTuples, tuples,
    lists, dicts, dataclasses), keeping the structure; None stays None."""
    if state is None or isinstance(state, (int, float, bool, str)):
        return state
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # NamedTuple
        return type(state)(*(map_state(fn, s) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, s) for s in state)
    if isinstance(state, dict):
        return {k: map_state(fn, v) for k, v in state.items()}
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return dataclasses.replace(
            state, **{f.name: map_state(fn, getattr(state, f.name)) for f in dataclasses.fields(state) if f.init}
        )
    raise TypeError(f"cannot map over a state of type {type(state).__name__}")
