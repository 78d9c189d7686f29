"""The name of the decoding cache in transformers' model API.

transformers 5.24 renamed the cache argument of every forward, and the output
field that returns it, from `past_key_values` to `cache` (the old name stays,
deprecated, until 5.40; `generate` and the decoder layers now pass `cache=`).
latte's Hugging Face classes accept both names and speak the installed
version's name to transformers, so one code path serves 5.0 to 5.x.
"""

from __future__ import annotations

import dataclasses

from transformers.modeling_outputs import CausalLMOutputWithPast

# "cache" from transformers 5.24 on, "past_key_values" before.
CACHE_NAME = (
    "cache" if any(f.name == "cache" for f in dataclasses.fields(CausalLMOutputWithPast)) else "past_key_values"
)


def one_cache(where: str, **aliases):
    """The cache given under any of `aliases` (None when none is): a
    ValueError naming them when two different objects are given."""
    given = {name: value for name, value in aliases.items() if value is not None}
    if len({id(value) for value in given.values()}) > 1:
        raise ValueError(f"{where}: {', '.join(given)} name the same cache; give one of them")
    return next(iter(given.values()), None)


def cache_kwargs(cache) -> dict:
    """{installed name: cache}, to pass to a transformers forward or output."""
    return {CACHE_NAME: cache}


def output_cache(output):
    """The cache a transformers output holds, read under the installed name
    (no deprecation warning)."""
    return getattr(output, CACHE_NAME)
