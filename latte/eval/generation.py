"""Token-by-token generation from the recurrent state, for streaming output.

`LatteForCausalLM.generate` returns whole sequences; its streaming form
`LatteForCausalLM.stream` yields each token as soon as it is chosen, which is
what `latte generate` prints (one chunked forward over the prompt, then one
recurrent step per token: constant time and memory per token for every mixer
but softmax).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from latte.models import LatteForCausalLM


def stream_tokens(
    model: LatteForCausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> Iterator[int]:
    """Yields up to `max_new_tokens` ids continuing `prompt_ids` (stops after
    eos): `LatteForCausalLM.stream` for one prompt. Every argument is checked
    when this is called, before the first token is asked for."""
    if not prompt_ids:
        raise ValueError("prompt_ids: empty; give at least one token (e.g. the eos id)")
    tokens = model.stream(
        torch.tensor([prompt_ids], device=device),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eos_token_id,
        generator=generator,
    )
    return (int(tok[0]) for tok in tokens)


def hf_view(model):
    """A native LatteForCausalLM seen through the transformers API that the
    decoding evaluations call (latte.models.hf.LatteHFForCausalLM: forward
    with a LatteHFCache, logits_to_keep, `config`), on the model's own
    modules: no copy of the weights, the same numbers. Any other model is
    returned as it is."""
    if not isinstance(model, LatteForCausalLM):
        return model
    from latte.models.hf import LatteHFConfig, LatteHFForCausalLM  # optional dependency: transformers

    if not model.config.causal:
        raise ValueError("a bidirectional model (causal=False) has no next-token distribution to decode with")
    with torch.device("meta"):  # the view's own modules are replaced by the model's below
        view = LatteHFForCausalLM(LatteHFConfig.from_latte_config(model.config))
    view.model, view.lm_head = model.model, model.lm_head
    return view.train(model.training)


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
        new, self.emitted = text[self.emitted :], len(text)
        return new

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids)
        new, self.emitted = text[self.emitted :], len(text)
        return new
