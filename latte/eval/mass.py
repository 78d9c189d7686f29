"""Where Macchiato's attention mass goes (docs/evaluation.md §7.2.2): the
share of each query's joint normaliser on its window, on the sinks outside
it, on the tokens the memory slots hold and on the latents (docs/math.md §4,
§4.1, §4.2), per layer.

Legend: B batch, T time, H query heads, K key/value heads, L latents per head.

The shares are computed in float64 by the reference
(latte/ops/reference.py: macchiato_memory_shares) from the very inputs each
Macchiato layer hands its op in a full-sequence forward: `recording` wraps
every MacchiatoCore's latent_mix (the native layer and the converted
attention) for the duration of the block, so nothing is recomputed from the
layer's weights by a second path. The reference builds T x T matrices
(and, for memory rule "recall", B x H x L x T x T): a diagnosis of prompts of
a few thousand tokens, not of long documents.

For every layer a prompt yields the shares averaged over heads and over
every real query (`mean`) and at its last query (`last`: the position that
predicts the answer's first token in a retrieval prompt).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from latte.layers.macchiato_attention import MacchiatoCore, memory_marks
from latte.ops import reference as ref
from latte.reporting import md_table

SHARES = ref.SHARES  # window, sinks, slots, latents
F64 = torch.float64


def call_shares(a, b, v, q, k, *, window, mix, beta, gate=None, mask=None, sink_q=None, memory_q=None, mark=None):
    """[B, H, T, 4] float64: the shares of one call of the op, given the
    inputs and the WindowSpec (`window`) the layer handed it."""
    memory = window.memory
    slots = memory.slots if memory is not None else 0
    rule = memory.rule if memory is not None else "key_norm"
    if rule == "oracle" and mark is None:  # no marks: no candidate, as in the op
        mark = torch.zeros(q.shape[:2], dtype=torch.bool, device=q.device)
    return ref.macchiato_memory_shares(
        a,
        b,
        v,
        q,
        k,
        window.size,
        slots=slots,
        rule=rule,
        seed=memory.seed if memory is not None else 0,
        mark=mark,
        memory_q=memory_q,
        rotary=memory.rotary if memory is not None else None,
        num_sinks=window.num_sinks,
        scale=window.scale,
        softcap=window.softcap,
        mask=mask,
        sink_q=sink_q,
        mix=mix,
        gate=gate,
        beta=beta,
    )


def summarise(shares: torch.Tensor, mask: torch.Tensor | None) -> dict:
    """{"mean": [4], "last": [4]} of shares [B, H, T, 4]: averaged over the
    heads and the real queries of every row, and over the heads at each
    row's last query."""
    B, H, T, _ = shares.shape
    real = torch.ones(B, T, dtype=torch.bool, device=shares.device) if mask is None else mask
    w = real[:, None, :, None].to(shares.dtype)
    mean = (shares * w).sum((0, 1, 2)) / (w.sum() * H)
    return {"mean": mean.tolist(), "last": shares[:, :, -1].mean((0, 1)).tolist()}


@contextlib.contextmanager
def recording(model: nn.Module):
    """Inside the block, every Macchiato layer of `model` (MacchiatoCore) adds
    to the returned dict, at its index among them, the summary (summarise)
    of the shares of its last full-sequence call; restored after, also on
    an error. A call with a decoding state or packed documents is refused
    (the shares need the whole sequence)."""
    layers = [m for m in model.modules() if isinstance(m, MacchiatoCore)]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no Macchiato layer (the shares need mixer macchiato)")
    found: dict[int, dict] = {}
    for i, layer in enumerate(layers):
        layer.latent_mix = _recorder(layer, i, found)
    try:
        yield found
    finally:
        for layer in layers:
            layer.__dict__.pop("latent_mix", None)


def _recorder(layer: MacchiatoCore, index: int, found: dict):
    """The layer's latent_mix, recording the shares of each call into found[index]."""

    def latent_mix(x, q, k, v, **kw):
        out = type(layer).latent_mix(layer, x, q, k, v, **kw)
        if kw.get("state") is not None or kw.get("cu_seqlens") is not None or layer.latent_only:
            raise ValueError("attention mass shares: a full-sequence forward without a decoding state or packing")
        mask, window = kw.get("mask"), kw["window"]
        with torch.no_grad():
            a, b, gate, _, _ = layer.latents(x, mask=mask)
            shares = call_shares(
                a,
                b,
                v,
                q,
                k,
                window=window,
                mix=layer.mix,
                beta=layer.beta,
                gate=gate,
                mask=mask,
                sink_q=kw.get("sink_q"),
                memory_q=kw.get("memory_q"),
                mark=layer._oracle_mark(window, a.shape[:2]),
            )
        found[index] = summarise(shares, mask)
        return out

    return latent_mix


@torch.no_grad()
def prompt_shares(model: nn.Module, ids: torch.Tensor, marks: torch.Tensor | None = None) -> list[dict]:
    """Per Macchiato layer, in order: the summary of its shares over one
    prompt ids [T] read in one forward (marks [T]: the tokens memory rule
    "oracle" keeps)."""
    with recording(model) as found, memory_marks(model, None if marks is None else marks[None]):
        model(ids[None])
    return [found[i] for i in sorted(found)]


def mass_summary(groups) -> tuple[list[dict], str]:
    """(records, markdown) of `latte eval`'s mass cells (field "layers": per
    layer prompt_shares' summaries). `groups`: per model, (the fields naming
    it in records, its label, its cells). One record per (model, task,
    context, layer) with the shares averaged over the cell's prompts; the
    table gives them averaged over the layers too, per (model, task,
    context)."""
    records, rows = [], []
    for fields, name, cells in groups:
        for task, context in dict.fromkeys((c["task"], c["context"]) for c in cells):
            cs = [c for c in cells if (c["task"], c["context"]) == (task, context)]
            per_layer = _mean(
                [torch.tensor([[lay["mean"], lay["last"]] for lay in c["layers"]], dtype=F64) for c in cs]
            )
            for i, layer in enumerate(per_layer.tolist()):
                r = {**fields, "task": task, "context": context, "prompts": len(cs), "layer": i}
                records.append({**r, **_named(layer[0], "mean"), **_named(layer[1], "last")})
            avg = per_layer.mean(0).tolist()
            rows.append([name, task, f"{context:,}", str(len(cs)), _cells(avg[0]), _cells(avg[1])])
    head = ["model", "task", "context", "prompts", "mean over queries: " + " / ".join(SHARES), "last query"]
    note = (
        "Shares of the joint normaliser (docs/math.md §4.2), float64 from each layer's own inputs, averaged over "
        "heads, layers and prompts: over every query (mean) and at the prompt's last query (last), "
        f"as {' / '.join(SHARES)} in %."
    )
    return records, note + "\n\n" + md_table(head, rows)


def _mean(xs: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(xs).mean(0)


def _named(shares: list[float], where: str) -> dict:
    return {f"{where}_{part}": share for part, share in zip(SHARES, shares)}


def _cells(shares: list[float]) -> str:
    return " / ".join(f"{100 * s:.1f}" for s in shares)
