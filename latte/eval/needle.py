"""Needle retrieval: a pass key hidden in a long haystack of held-out essays,
answered greedily (docs/evaluation.md §7).

The format is fixed here, so that up-training can use a different one for
any synthetic retrieval data it mixes in:

  haystack  the held-out Paul Graham essays (latte.data.heldout.eval_essays)
            in a seeded order, separated by blank lines, tokenized and cut
  needle    NEEDLE with a random 5-digit key, inserted after the sentence end
            at or before `depth` x the haystack's length (0 = first, 1 = last)
  question  QUESTION, right after the haystack
  answer    greedy decoding of ANSWER_TOKENS tokens; correct iff the first
            run of digits in the decoded answer is the key (exact match)

The prompt is exactly `context` tokens long. Any causal LM answers through
its cache, fed `chunk` tokens at a time: a converted model's constant-size
MacchiatoCache, or a Hugging Face model's DynamicCache (the original: memory
linear in the context, time quadratic).
"""

from __future__ import annotations

import copy
import math
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from latte.layers.macchiato_attention import memory_marks
from latte.reporting import md_table

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\n\nWhat is the pass key? The pass key is"
ANSWER_TOKENS = 8
SEPARATOR = "\n\n"


def haystack_text(documents, seed: int) -> str:
    """The documents' texts in an order fixed by seed, separated by blank lines."""
    order = sorted(documents, key=lambda d: d.name)
    random.Random(seed).shuffle(order)
    return SEPARATOR.join(d.text.strip() for d in order)


def make_key(seed: int) -> int:
    return random.Random(f"needle-key-{seed}").randrange(10_000, 100_000)


@dataclass
class NeedlePrompt:
    ids: torch.Tensor  # [context] token ids
    key: int
    needle_start: int  # first token of the needle
    needle_end: int  # one past its last token

    @property
    def distance(self) -> int:
        """Tokens from the needle's end to the end of the prompt: more than
        the window means only the latent state can carry it."""
        return len(self.ids) - self.needle_end


def sentence_ends(tokenizer, ids: list[int]) -> list[bool]:
    """Per position: does the token end a sentence ('.', '!' or '?', maybe
    followed by quotes or spaces)?"""
    cache: dict[int, bool] = {}
    out = []
    for t in ids:
        if t not in cache:
            cache[t] = bool(re.search(r"[.!?][\"')\]]*\s*$", tokenizer.decode([t])))
        out.append(cache[t])
    return out


def needle_prompt(
    tokenizer, hay_ids: list[int], ends: list[bool], context: int, depth: float, key: int, *, keep: int = 0
):
    """The prompt of `context` tokens with the needle at `depth` in [0, 1]
    of the haystack, after its first `keep` tokens (a beginning-of-sequence
    token the model expects first stays first)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth}: expected a fraction in [0, 1]")
    needle = tokenizer.encode(NEEDLE.format(key=key))
    question = tokenizer.encode(QUESTION)
    n_hay = context - len(needle) - len(question)
    if n_hay < 1:
        raise ValueError(f"context={context}: too short for the needle and question ({context - n_hay} tokens)")
    if n_hay > len(hay_ids):
        raise ValueError(f"context={context}: the haystack has only {len(hay_ids):,} tokens, {n_hay:,} needed")
    if not 0 <= keep < n_hay:
        raise ValueError(f"keep={keep}: expected 0 <= keep < {n_hay} (the haystack tokens of the prompt)")
    at = keep + round(depth * (n_hay - keep))
    while at > keep and not ends[at - 1]:  # back to the end of a sentence
        at -= 1
    ids = hay_ids[:at] + needle + hay_ids[at:n_hay] + question
    return NeedlePrompt(torch.tensor(ids), key, at, at + len(needle))


def first_number(text: str) -> int | None:
    m = re.search(r"\d+", text)
    return None if m is None else int(m.group())


def new_cache(model):
    """The cache a model decodes with: a converted model's MacchiatoCache, a
    native model's LatteHFCache (seen through generation.hf_view), or
    transformers' DynamicCache for any other causal LM."""
    # optional dependency: latte.convert imports transformers (extra "hf")
    from latte.convert import ConvertedForCausalLM, MacchiatoCache
    from latte.models.hf import LatteHFCache, LatteHFForCausalLM

    if isinstance(model, ConvertedForCausalLM):
        return MacchiatoCache(model.num_layers)
    if isinstance(model, LatteHFForCausalLM):
        return LatteHFCache()
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _feed(model, cache, ids: torch.Tensor, chunk: int, marks: torch.Tensor | None = None):
    """ids [T] into the cache, `chunk` tokens at a time; the last output.
    marks [T] bool or None: the tokens memory rule "oracle" keeps, handed to
    each chunk's call (latte.layers.macchiato_attention.memory_marks; a
    model without such a layer ignores them)."""
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    out = None
    for start in range(0, ids.shape[0], chunk):
        mark = None if marks is None else marks[None, start : start + chunk]
        with memory_marks(model, mark):
            out = model(
                input_ids=ids[None, start : start + chunk], **cache_kwargs(cache), use_cache=True, logits_to_keep=1
            )
    return out


class PrefixFeeder:
    """The cache after the first p tokens of one haystack, for prompts that
    share that prefix (all depths and contexts of one trial): the haystack
    is fed once, in order, and `state_at(p)` hands out a copy of the state
    there. Asking for an earlier p starts again from the beginning. A
    converted model's state is constant-size, so a copy is cheap; a
    DynamicCache copy holds p keys and values per layer."""

    def __init__(self, model, hay_ids: list[int], chunk: int = 1024):
        self.model, self.hay, self.chunk = model, torch.tensor(hay_ids), chunk
        self.cache, self.fed = new_cache(model), 0

    @torch.no_grad()
    def state_at(self, p: int):
        if p < self.fed:
            self.cache, self.fed = new_cache(self.model), 0
        _feed(self.model, self.cache, self.hay[self.fed : p], self.chunk)
        self.fed = p
        return copy.deepcopy(self.cache)


@torch.no_grad()
def greedy_answer(
    model, ids: torch.Tensor, new_tokens: int = ANSWER_TOKENS, chunk: int = 1024, cache=None, start: int = 0
) -> list[int]:
    """Greedy continuation of ids [T]: the prompt fed `chunk` tokens at a time
    through the model's cache (or from ids[start:] into a cache that already
    holds ids[:start]), then one token per step."""
    return greedy_and_likelihood(model, ids, (), new_tokens, chunk, cache, start)[0]


@torch.no_grad()
def greedy_and_likelihood(
    model,
    ids: torch.Tensor,
    targets: Sequence[Sequence[int]],
    new_tokens: int = ANSWER_TOKENS,
    chunk: int = 1024,
    cache=None,
    start: int = 0,
    marks: torch.Tensor | None = None,
) -> tuple[list[int], list[float]]:
    """(greedy_answer's tokens, for each of `targets` (token ids) its mean
    negative log-likelihood in nats per token as the continuation of the
    whole prompt). Each target is teacher-forced on its own copy of the
    state after the prompt, so the greedy answer is the same as without.
    marks [T] bool or None: the prompt's tokens memory rule "oracle" keeps
    (_feed); the answer's tokens are never marked."""
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    cache = new_cache(model) if cache is None else cache
    out = _feed(model, cache, ids[start:], chunk, None if marks is None else marks[start:])
    first = out.logits[0, -1]
    nlls, first_logp = [], first.double().log_softmax(-1) if targets else None
    for target in targets:
        logp = [first_logp[target[0]]]
        if len(target) > 1:
            probe = copy.deepcopy(cache)
            forced = torch.tensor([list(target[:-1])], device=ids.device)
            more = model(input_ids=forced, **cache_kwargs(probe), use_cache=True, logits_to_keep=len(target) - 1)
            lp = more.logits[0].double().log_softmax(-1)
            logp += [lp[i, t] for i, t in enumerate(target[1:])]
        nlls.append(float(-torch.stack(logp).mean()))
    tokens = [int(first.argmax())]
    while len(tokens) < new_tokens:
        step = torch.tensor([[tokens[-1]]], device=ids.device)
        out = model(input_ids=step, **cache_kwargs(cache), use_cache=True, logits_to_keep=1)
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens, nlls


def run_trial(model, tokenizer, prompt: NeedlePrompt, chunk: int = 1024, feeder: PrefixFeeder | None = None) -> dict:
    """One prompt answered (from the feeder's state at the needle when
    given: the prompt's haystack prefix is the feeder's): a needle cell's record."""
    t0, c0 = time.perf_counter(), time.process_time()
    if feeder is None:
        answer = tokenizer.decode(greedy_answer(model, prompt.ids, chunk=chunk))
    else:
        cache = feeder.state_at(prompt.needle_start)
        answer = tokenizer.decode(greedy_answer(model, prompt.ids, chunk=chunk, cache=cache, start=prompt.needle_start))
    found = first_number(answer)
    return {
        "key": prompt.key,
        "answer": answer,
        "correct": int(found == prompt.key),
        "needle_position": prompt.needle_start,
        "distance": prompt.distance,
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(time.process_time() - c0, 2),
    }


def needle_summary(groups, contexts, depths) -> tuple[list[dict], str]:
    """(records, markdown table) of needle cells. `groups`: per model, (the
    fields naming it in records, its label, its cells). One record per
    (model, context, depth): trials, found, accuracy and its binomial
    standard error, the needle's mean distance from the question; the table
    counts the keys found at each context, all depths together."""
    records, rows = [], []
    for fields, name, cells in groups:
        row = [name]
        for c in contexts:
            found = tried = 0
            for d in depths:
                cs = [x for x in cells if x["context"] == c and x["depth"] == d]
                n, k = len(cs), sum(x["correct"] for x in cs)
                p = k / max(n, 1)
                r = {**fields, "context": c, "depth": d, "trials": n, "found": k, "accuracy": p}
                r["accuracy_stderr"] = math.sqrt(p * (1 - p) / max(n, 1))
                r["mean_distance"] = sum(x["distance"] for x in cs) / max(n, 1)
                records.append(r)
                found, tried = found + k, tried + n
            row.append(f"{found}/{tried}")
        rows.append(row)
    table = md_table(["model"] + [f"{c:,} tokens" for c in contexts], rows)
    return records, "Pass keys found (all depths together), by context length:\n\n" + table
