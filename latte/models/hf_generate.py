"""`generate` of the Hugging Face adapters (native `hf.LatteHFForCausalLM`
and the converted `ConvertedForCausalLM`) through latte's static decoding
step (latte/models/static_decode.py).

A request that is a plain greedy or sampled decode (one beam, one sequence
per prompt, temperature / top-k / top-p at most, no other logits processor,
stopping criterion, streamer or output dict, left padding, a cache) runs
through the model's `stream`: one static state, one fixed-shape step,
captured in a CUDA graph on CUDA. Anything else goes to transformers' own
loop. Either way one log line (logger "latte.generate", level INFO) names
the path taken and, for transformers' loop, the first setting that sent it
there.

The output is transformers' for the same request: greedy decoding gives the
same tokens (tests/models/test_hf_static_generate.py), a row that has
finished is filled with the pad id (the first eos id when none is set) and
the loop stops once every row has finished or at max_new_tokens / max_length.
Sampling draws from the same distribution (temperature, then top-k, then
top-p) but from latte's sampler, so a seed gives other tokens than
transformers' loop.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import GenerationConfig

log = logging.getLogger("latte.generate")

# settings a plain decode may give (compared with nothing else)
_PLAIN = {
    "max_length",
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
}
_MODEL_KWARGS = {"attention_mask"}  # besides them, only None-valued arguments


def _baseline() -> dict:
    """The resolved settings of a request that sets none (transformers' global defaults)."""
    base = GenerationConfig()
    base.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    return base.to_dict()


def _reason(gen: GenerationConfig, model_kwargs: dict, input_ids, mask) -> str | None:
    """Why the request is not a plain decode (None when it is)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return "no [B, T] input_ids tensor"
    extra = sorted(k for k, v in model_kwargs.items() if v is not None and k not in _MODEL_KWARGS)
    if extra:
        return f"argument {extra[0]}"
    base = _baseline()
    for key, value in gen.to_dict().items():
        unset = value in (None, False) and base.get(key) in (None, False)  # False and None both say "off"
        if key not in _PLAIN and value != base.get(key) and not unset:
            return f"{key}={value!r}"
    if gen.use_cache is False:
        return "use_cache=False"
    if mask is not None and not (isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask[:, -1].all())):
        return "an attention_mask that is not left padding"
    if mask is None and gen.pad_token_id is not None and bool((input_ids == gen.pad_token_id).any()):
        return f"no attention_mask, and the pad id {gen.pad_token_id} in the prompt (transformers masks it)"
    if _new_tokens(gen, input_ids) < 1:
        return "no room for a new token within max_length"
    return None


def _new_tokens(gen: GenerationConfig, input_ids: torch.Tensor) -> int:
    """max_new_tokens, or what max_length leaves after the prompt."""
    return gen.max_new_tokens if gen.max_new_tokens is not None else gen.max_length - input_ids.shape[1]


def _eos_ids(eos) -> list[int] | None:
    if eos is None:
        return None
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def _padded(new: torch.Tensor, eos: list[int] | None, pad) -> torch.Tensor:
    """new [B, N] with every token after a row's first eos replaced by the
    pad id (the first eos id when none is set), as transformers writes it."""
    if eos is None or not new.shape[1]:
        return new
    hit = torch.isin(new, torch.tensor(eos, device=new.device)).long()
    after = (hit.cumsum(1) - hit) > 0  # an eos came before this column
    return new.masked_fill(after, eos[0] if pad is None else int(pad))


def static_generate(model, stream, super_generate, inputs=None, generation_config=None, **kwargs: Any):
    """The adapters' `generate`: `stream(input_ids, max_new_tokens, **kw)`
    (latte's, over the static state) for a plain decode, else
    `super_generate(inputs, generation_config, **kwargs)` (transformers')."""
    given = {k: v for k, v in kwargs.items() if v is not None}
    input_ids = inputs if inputs is not None else given.get("input_ids")
    gen, model_kwargs = model._prepare_generation_config(generation_config, **given)
    model_kwargs.pop("input_ids", None)
    mask = model_kwargs.get("attention_mask")
    why = _reason(gen, model_kwargs, input_ids, mask)
    name = type(model).__name__
    if why is not None:
        log.info("%s.generate: transformers' loop (%s is not a plain greedy or sampled decode)", name, why)
        return super_generate(inputs, generation_config, **kwargs)
    log.info("%s.generate: latte's static decoding step (latte/models/static_decode.py)", name)
    eos = _eos_ids(gen.eos_token_id)
    sampled = bool(gen.do_sample)
    tokens = list(
        stream(
            input_ids,
            _new_tokens(gen, input_ids),
            temperature=gen.temperature if sampled else 1.0,
            top_k=gen.top_k if sampled else None,
            top_p=gen.top_p if sampled else None,
            do_sample=sampled,
            eos_token_id=eos,
            attention_mask=mask,
        )
    )
    new = torch.stack(tokens, 1).to(input_ids.dtype)
    return torch.cat([input_ids, _padded(new, eos, gen.pad_token_id)], 1)
