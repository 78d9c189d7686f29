"""Token-by-token generation from the recurrent state, for streaming output.

`LatteForCausalLM.generate` returns whole sequences; here each token is
yielded as soon as it is sampled, which is what `latte generate` prints.
Same recipe: one chunked forward over the prompt, then one recurrent step
per token (constant time and memory per token for every mixer but softmax).
"""

from __future__ import annotations

from typing import Iterator

import torch

from latte.models import LatteForCausalLM
from latte.models.causal_lm import sample


@torch.no_grad()
def stream_tokens(model: LatteForCausalLM, prompt_ids: list[int], max_new_tokens: int, *,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                  eos_token_id: int | None = None, generator: torch.Generator | None = None,
                  device: str | torch.device = "cpu") -> Iterator[int]:
    """Yields up to `max_new_tokens` ids continuing `prompt_ids` (stops after eos)."""
    if not prompt_ids:
        raise ValueError("prompt_ids: empty; give at least one token (e.g. the eos id)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
    was_training = model.training
    model.eval()
    try:
        out = model(torch.tensor([prompt_ids], device=device), use_cache=True)
        for i in range(max_new_tokens):
            logits = out.logits[:, -1].float()  # [1, V]
            if temperature == 0:
                tok = logits.argmax(-1)
            else:
                tok = sample(logits, temperature, top_k, top_p, generator)
            yield int(tok)
            if int(tok) == eos_token_id or i + 1 == max_new_tokens:
                break
            out = model(tok[:, None], state=out.state, use_cache=True)  # one recurrent step
    finally:
        model.train(was_training)


class IncrementalDecoder:
    """Decodes a growing id list and returns only the new text; holds back a
    trailing incomplete UTF-8 sequence (byte-level BPE splits characters)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):  # wait for the rest of the character
            return ""
        new, self.emitted = text[self.emitted:], len(text)
        return new

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids)
        new, self.emitted = text[self.emitted:], len(text)
        return new
