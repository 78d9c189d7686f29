"""MacchiatoCache: the constant-size decoding state of a converted model,
behind the transformers `Cache` API so `model.generate` uses it.

Per layer: the latent state (S, z), a buffer of the last min(window_size - 1,
positions) keys/values (keys already rotated) and the qk-mixer state. Its
size stops growing at the window; a KV cache grows by 2 x layers x kv_heads x
head_dim numbers per token.

Unlike `latte.models.LatteCache` (a value), this cache is updated in place by
each forward, as transformers caches are. The model increments
`seen_tokens` after each forward; RoPE positions come from it (or from the
position_ids generate derives from the attention mask).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from ..layers import state_nbytes
from ..models.modeling import map_state


class MacchiatoCache(Cache):
    is_compileable = False

    def __init__(self, num_layers: int):
        super().__init__(layers=[])
        self.states: list = [None] * num_layers
        self.seen_tokens = 0

    def __len__(self) -> int:
        return len(self.states)

    def __repr__(self) -> str:
        return f"MacchiatoCache(layers={len(self.states)}, seen_tokens={self.seen_tokens}, nbytes={self.nbytes()})"

    def nbytes(self) -> int:
        """Bytes held by every layer's state (constant once the context reaches the window)."""
        return sum(state_nbytes(s) for s in self.states)

    @property
    def batch_size(self) -> int:
        for s in self.states:
            if s is not None:
                return int(s.attn.window.mask.shape[0])
        return -1

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0  # only used to size masks we never build

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no maximum: the state stops growing at the window

    def reset(self) -> None:
        self.states = [None] * len(self.states)
        self.seen_tokens = 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise NotImplementedError("MacchiatoCache: a recurrent state cannot drop tokens")

    def _map(self, fn) -> None:
        self.states = [map_state(fn, s) for s in self.states]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))
