"""Which tokens the memory slots of a converted model hold (docs/math.md
§4.2, docs/conversion.md §13): a diagnostic of the selection rules that needs
no generation.

One prefill of a retrieval prompt, in one chunk, with the model's memory
rule; then, per layer and key/value head, the share of the needle's tokens
that have left the window and that the slots hold when the next token (the
answer's first) is read, the same share of the needle's digit tokens (the
value asked for), and each needle token's rank among every token that has
left the window under the rule's score (0: the best; held when below the
slot count). The held tokens are read from the decoding state; the ranks
from the scores the layer ranks by (`latte.ops.window.memory.score_tap`),
so the two agree by construction of the rule (docs/math.md §4.2: the slots
hold the M best candidates).
"""

from __future__ import annotations

import statistics

import torch

from latte.layers.macchiato_attention import memory_marks
from latte.ops.window.memory import score_tap
from latte.reporting import md_table

from .needle import new_cache


def digit_marks(ids: torch.Tensor, marks: torch.Tensor, decode) -> torch.Tensor:
    """[T] bool: the marked tokens whose text holds a digit (a needle's
    value); decode(list of ids) -> text."""
    return torch.tensor([bool(m) and any(ch.isdigit() for ch in decode([int(i)])) for i, m in zip(ids, marks)])


def _ranks(r: torch.Tensor) -> torch.Tensor:
    """rank [N, K] of each token per head among the candidates (r > -inf):
    the number ranked before it (higher score, ties to the older position);
    a non-candidate ranks after every candidate. r [N, K], in position order."""
    order = torch.argsort(-r, dim=0, stable=True)  # stable: equal scores keep position order
    rank = torch.empty_like(order)
    rank.scatter_(0, order, torch.arange(r.shape[0]).view(-1, 1).expand_as(order))
    return rank


@torch.no_grad()
def slot_coverage(model, ids: torch.Tensor, marks: torch.Tensor, digits: torch.Tensor | None = None) -> list[dict]:
    """One record per memory layer and key/value head of a converted model
    whose layers keep memory slots (`use_memory`), after a prefill of ids
    [T] in one chunk (marks [T] bool: the needle's tokens, which rule
    "oracle" is handed; digits [T] bool: the value's tokens, default none):
    {layer, head, slots, candidates (tokens that left the window with a
    finite score), needle (marked tokens that left the window), held_needle,
    digits, held_digits, ranks (each such needle token's rank, None where it
    is no candidate), agrees (the held set read from the state is the top
    `slots` of the ranks)}."""
    layers = [a for a in model.converted if a.memory is not None]
    if not layers:
        raise ValueError("slot_coverage: the model keeps no memory slots (memory_slots = 0 in every layer)")
    digits = torch.zeros_like(marks) if digits is None else digits
    taps, cache, T = [], new_cache(model), ids.shape[0]
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    with score_tap(lambda r, pos: taps.append(r[0])), memory_marks(model, marks[None]):
        model(input_ids=ids[None], **cache_kwargs(cache), use_cache=True, logits_to_keep=1)
    if len(taps) != len(layers):
        raise RuntimeError(f"slot_coverage: {len(taps)} scored sequences for {len(layers)} memory layers")
    out = []
    for a, r in zip(layers, taps):
        P = r.shape[0] - T  # the window buffer's tokens come first; token s is extended P + s
        left = r[P:T]  # tokens s < T - P = T - w + 1: those that have left the window before query T
        state = cache.states[a.layer_idx].attn.memory
        out += [_head_record(a, k, left[:, k], marks, digits, state) for k in range(left.shape[1])]
    return out


def _head_record(layer, k: int, r: torch.Tensor, marks, digits, state) -> dict:
    """slot_coverage's record of one layer and key/value head: r [N] the
    scores of the N tokens that have left the window."""
    n, M = r.shape[0], layer.memory.slots
    cand = r > float("-inf")
    rank = _ranks(r[:, None])[:, 0]
    held = set(state.pos[0, :, k][state.mask[0, :, k]].tolist())
    top = {s for s in range(n) if cand[s] and rank[s] < M}
    needle = [s for s in range(n) if marks[s]]
    value = [s for s in range(n) if digits[s]]
    return {
        "layer": layer.layer_idx,
        "head": k,
        "slots": M,
        "candidates": int(cand.sum()),
        "needle": len(needle),
        "held_needle": sum(s in held for s in needle),
        "digits": len(value),
        "held_digits": sum(s in held for s in value),
        "ranks": [int(rank[s]) if cand[s] else None for s in needle],
        "agrees": held == top,
    }


def coverage_summary(records: list[dict]) -> dict:
    """Over layers and heads: the mean share of the needle and of its digits
    held, the share of (layer, head) pairs that hold every digit, and the
    median over pairs of the best and median rank of a needle token, as a
    fraction of the candidates (0: the top; None where no needle token is a
    candidate), and the median over pairs of the share of the candidates
    the slots would need to hold every needle token (the worst needle
    token's rank + 1, as a fraction of the candidates; 1 where a needle
    token is no candidate)."""

    def share(held, total):
        pairs = [r for r in records if r[total]]
        return statistics.mean(r[held] / r[total] for r in pairs) if pairs else None

    best, mid, whole = [], [], []
    for r in records:
        ranks = [x / r["candidates"] for x in r["ranks"] if x is not None]
        if ranks:
            best.append(min(ranks))
            mid.append(statistics.median(ranks))
        if r["ranks"]:
            whole.append(1.0 if None in r["ranks"] else (max(r["ranks"]) + 1) / r["candidates"])
    every = [r["held_digits"] == r["digits"] for r in records if r["digits"]]
    return {
        "needle_held": share("held_needle", "needle"),
        "digits_held": share("held_digits", "digits"),
        "heads_with_every_digit": statistics.mean(every) if every else None,
        "best_rank": statistics.median(best) if best else None,
        "median_rank": statistics.median(mid) if mid else None,
        "whole_needle": statistics.median(whole) if whole else None,
        "agrees": all(r["agrees"] for r in records),
    }


def prompt_coverage(model, prompt, decode) -> dict:
    """A cell of `latte eval --suite slots`: slot_coverage of one retrieval
    prompt (its marks: every needle; digits: the needles' digit tokens),
    its summary (coverage_summary) and, per layer, the share of the digits
    held over its key/value heads."""
    digits = digit_marks(prompt.ids, prompt.marks, decode)
    records = slot_coverage(model, prompt.ids, prompt.marks, digits)
    layers = sorted({r["layer"] for r in records})
    per_layer = []
    for i in layers:
        rs = [r for r in records if r["layer"] == i]
        total = sum(r["digits"] for r in rs)
        per_layer.append(sum(r["held_digits"] for r in rs) / total if total else None)
    return {"summary": coverage_summary(records), "digits_held_per_layer": per_layer, "heads": records}


SUMMARY_FIELDS = ("needle_held", "digits_held", "heads_with_every_digit", "best_rank", "median_rank", "whole_needle")


def slots_summary(groups) -> tuple[list[dict], str]:
    """(records, markdown) of `latte eval`'s slots cells. `groups`: per
    model, (the fields naming it in records, its label, its cells). One
    record per (model, task, context): the prompt summaries (coverage_summary
    of each cell's heads) averaged (None where no prompt has the value),
    whether the held sets agreed with the ranks in every prompt, and the
    share of the digits held per layer (`digits_held_by_layer`, averaged
    over the prompts; the table: its means over each half of the layers)."""
    records, rows = [], []
    for fields, name, cells in groups:
        for task, context in dict.fromkeys((c["task"], c["context"]) for c in cells):
            cs = [coverage_summary(c["heads"]) for c in cells if (c["task"], c["context"]) == (task, context)]
            r = {**fields, "task": task, "context": context, "prompts": len(cs)}
            for f in SUMMARY_FIELDS:
                xs = [s[f] for s in cs if s[f] is not None]
                r[f] = statistics.mean(xs) if xs else None
            r["agrees"] = all(s["agrees"] for s in cs)
            r["digits_held_by_layer"] = _by_layer([c for c in cells if (c["task"], c["context"]) == (task, context)])
            records.append(r)
            half = _halves(r["digits_held_by_layer"])
            rows.append([name, task, f"{context:,}", str(len(cs))] + [_pct(r[f]) for f in SUMMARY_FIELDS] + half)
    head = ["model", "task", "context", "prompts", "needle held %", "digits held %", "heads with every digit %"]
    head += ["best needle rank %", "median needle rank %", "slots for the whole needle %"]
    head += ["digits held %, first half of the layers", "second half"]
    note = (
        "Memory slots after one prefill of each prompt (docs/math.md §4.2): the share of the needle's tokens beyond "
        "the window, and of its digit tokens, that the slots hold when the answer's first token is read, averaged "
        "over layers, key/value heads and prompts; a needle token's rank under the rule's score among every token "
        "beyond the window, as a % of them (0: the first; median over heads of the best and the median needle "
        "token), and the share of those tokens the slots would need to hold the whole needle (median over heads); "
        "the digits held in the first and the second half of the layers (per layer in results.json)."
    )
    return records, note + "\n\n" + md_table(head, rows)


def _by_layer(cells: list[dict]) -> list:
    """The share of the digits held per layer, averaged over the cells
    (None for a layer where no cell has one beyond the window)."""
    out = []
    for shares in zip(*(c["digits_held_per_layer"] for c in cells)):
        xs = [x for x in shares if x is not None]
        out.append(statistics.mean(xs) if xs else None)
    return out


def _halves(by_layer: list) -> list[str]:
    """by_layer's mean over the first and the second half of the layers, as %."""
    n = len(by_layer) // 2
    parts = [[x for x in by_layer[:n] if x is not None], [x for x in by_layer[n:] if x is not None]]
    return [_pct(statistics.mean(p)) if p else "-" for p in parts]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"
