"""Choosing the next token: greedy or sampled (temperature, then top-k, then
nucleus top-p), and the one validation of these arguments that
`LatteForCausalLM.generate` and its streaming form `stream` share."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator

import torch


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_sampling_args(max_new_tokens, temperature, top_k, top_p, do_sample=None) -> bool:
    """Validates the generation arguments; returns True for greedy decoding
    (temperature 0 or do_sample=False). Each bad value is a ValueError that
    names the argument, the value and what is allowed."""
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an integer >= 0, got {max_new_tokens!r}")
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise ValueError(f"top_k: expected None or an integer >= 0 (0 = off), got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):  # NaN fails the comparison
        raise ValueError(f"top_p: expected None or a number in (0, 1] (1 = off), got {top_p!r}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"do_sample: expected None, True or False, got {do_sample!r}")
    if do_sample and temperature == 0:
        raise ValueError("do_sample=True needs temperature > 0 (temperature 0 means greedy)")
    return temperature == 0 or do_sample is False


def check_eos(eos_token_id, vocab_size: int, device) -> torch.Tensor | None:
    """None, an id or a list of ids in [0, vocab_size) -> tensor of ids or None."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if _is_int(eos_token_id) else eos_token_id
    if not isinstance(ids, (list, tuple)) or not ids or not all(_is_int(i) and 0 <= i < vocab_size for i in ids):
        raise ValueError(
            f"eos_token_id: expected None, an id or a list of ids in [0, {vocab_size - 1}], got {eos_token_id!r}"
        )
    return torch.tensor([int(i) for i in ids], device=device)


def sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row of logits [B, V]: temperature, top-k, nucleus (top-p)."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:  # None or 0: off
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def next_token(
    logits: torch.Tensor,
    greedy: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B]."""
    return logits.argmax(-1) if greedy else sample(logits, temperature, top_k, top_p, generator)


def token_stream(
    logits: torch.Tensor,
    step: Callable[[torch.Tensor], torch.Tensor],
    max_new_tokens: int,
    eos: torch.Tensor | None,
    pick: dict,
) -> Iterator[torch.Tensor]:
    """The decoding loop shared by the models' `stream`: from the last
    prompt position's logits [B, V], yields one token per row [B] per step;
    `step(tok)` feeds the tokens and returns the next logits. A row stops at
    eos (then repeats it); the loop ends after max_new_tokens or when every
    row has stopped. `pick`: next_token's arguments."""
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    for i in range(max_new_tokens):
        tok = next_token(logits.float(), **pick)  # [B]
        if eos is not None:
            tok = torch.where(done, eos[0], tok)
            done = done | torch.isin(tok, eos)
        yield tok
        if i + 1 == max_new_tokens or bool(done.all()):
            break
        logits = step(tok)
