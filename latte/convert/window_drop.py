"""Window drop: a recipe knob of conversion up-training (docs/conversion.md
§12). With probability `prob` a training micro-batch is computed with every
converted attention's window shrunk to its last `to` tokens (the sinks
kept), so that the latent state must carry what the window no longer sees:
the window cannot absorb the loss on those batches (issue 43: a
window + latents conversion otherwise learns to lean on the window).

The draw is a function of the batch's tokens (not of a global random
state), so a resumed run draws what the uninterrupted one drew.
Validation (eval mode) and generation never shrink the window.
"""

from __future__ import annotations

import contextlib
import random

import torch

from latte.convert.attention import ConvertedAttention
from latte.convert.distill import Distiller


@contextlib.contextmanager
def shrunk_window(model: torch.nn.Module, size: int):
    """Inside the block, every ConvertedAttention of model sees at most the
    last `size` tokens (itself included) and its sinks; restored after."""
    if size < 1:
        raise ValueError(f"window size {size}: expected >= 1")
    layers = [m for m in model.modules() if isinstance(m, ConvertedAttention)]
    saved = [m.window_size for m in layers]
    try:
        for m in layers:
            m.window_size = min(m.window_size, size)
        yield model
    finally:
        for m, w in zip(layers, saved):
            m.window_size = w


def dropped(input_ids: torch.Tensor, prob: float) -> bool:
    """Whether this batch shrinks the window: a seeded draw from its tokens."""
    if prob <= 0:
        return False
    seed = int(input_ids.long().sum()) * 1_000_003 + input_ids.numel()
    return random.Random(seed).random() < prob


class WindowDropDistiller(Distiller):
    """A Distiller whose training micro-batches shrink the window to `to`
    tokens with probability `prob` (the teacher, the original model, is
    unchanged)."""

    def __init__(self, *args, prob: float, to: int, **kwargs):
        super().__init__(*args, **kwargs)
        if not 0 <= prob <= 1 or to < 1:
            raise ValueError(f"window drop: expected 0 <= prob <= 1 and to >= 1, got prob={prob}, to={to}")
        self.drop_prob, self.drop_to = prob, to

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        if labels is None or not self.training or not dropped(input_ids, self.drop_prob):
            return super().forward(input_ids, labels)
        with shrunk_window(self.model, self.drop_to):
            return super().forward(input_ids, labels)
