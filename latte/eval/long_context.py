"""Long-context evaluation of converted models (docs/evaluation.md §7):
per-token loss over long documents, perplexity by context and by position
bucket, decode latency and decoding-state size against a KV cache.

  original   the pretrained model with full attention: the document fed in
             chunks through its KV cache (masks [chunk, T], never [T, T]),
             the LM head applied in chunks
  window     the pretrained model under an explicit sliding-window mask,
             optionally keeping the first tokens visible (attention sinks)
  converted  a ConvertedForCausalLM (also "swa", before up-training): the
             document fed in chunks through its constant-size cache; at each
             context boundary a few decode steps are timed on a copy of the
             real state

Decode latency of the original at context C is timed on a KV cache of C
random keys/values (a decode step's cost does not depend on their values);
building the real one would cost a second quadratic pass.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from latte.reporting import md_table

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)


@dataclass
class DocumentEval:
    nll: torch.Tensor  # [T - 1] float64: loss of predicting token t + 1 from tokens <= t
    wall_s: float
    decode: dict[int, dict[str, float]] = field(default_factory=dict)  # context -> ms_per_token, state_bytes


def _head_nll(model, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """NLL of targets [T] from final hidden states [T, F], the LM head (and
    Gemma 2's final soft-cap) applied chunk by chunk: [T, vocab] logits of a
    long document would not fit."""
    from latte.convert.distill import head_logits  # optional dependency: transformers (extra "hf")

    out = []
    for i in range(0, hidden.shape[0], chunk):
        logits = head_logits(model, hidden[i : i + chunk])
        out.append(F.cross_entropy(logits, targets[i : i + chunk], reduction="none").double())
    return torch.cat(out)


@torch.no_grad()
def original_nll(converted, ids: torch.Tensor, *, chunk: int | None = 2048) -> DocumentEval:
    """Per-token NLL of the pretrained model (full attention) on ids [T],
    fed `chunk` tokens at a time through its KV cache: every attention mask
    is then [chunk, T]. One pass (chunk=None) is the same computation, but a
    model with local layers (Gemma 2/3, Mistral, Qwen2) builds explicit
    [T, T] masks for it: 4 GB each in float32 at 32K tokens."""
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    t0 = time.perf_counter()
    N = ids.shape[0] - 1  # tokens fed: the last one only serves as a target
    step = N if chunk is None else chunk
    with converted.as_original() as base:
        if step >= N:
            hidden = base.model(input_ids=ids[None, :N], use_cache=False).last_hidden_state[0]
            return DocumentEval(_head_nll(base, hidden, ids[1:]), time.perf_counter() - t0)
        from transformers import DynamicCache  # optional dependency (extra "hf")

        cache, out = DynamicCache(config=base.config), []
        for start in range(0, N, step):
            stop = min(start + step, N)
            kw = cache_kwargs(cache)
            hidden = base.model(input_ids=ids[None, start:stop], **kw, use_cache=True).last_hidden_state[0]
            out.append(_head_nll(base, hidden, ids[start + 1 : stop + 1]))
    return DocumentEval(torch.cat(out), time.perf_counter() - t0)


@torch.no_grad()
def original_window_nll(converted, ids: torch.Tensor, *, window: int, sinks: int = 0) -> DocumentEval:
    """Per-token NLL of the pretrained model on ids [T] when every token sees
    only the last `window` tokens (itself included) and the document's first
    `sinks` tokens: with sinks = 0 this is the converted model before
    up-training (beta = -30), computed from an explicit [T, T] mask instead
    of the window cache; sinks > 0 asks how much of the sliding window's loss
    comes from dropping the first tokens, which pretrained models use as
    attention sinks. The mask replaces the model's own masks in every layer,
    native sliding windows (Mistral, Qwen2, Gemma's local layers) included,
    as conversion does. Quadratic memory: a diagnostic for a few thousand
    tokens."""
    if window < 1 or sinks < 0:
        raise ValueError(f"original_window_nll: window must be >= 1 and sinks >= 0, got window={window}, sinks={sinks}")
    t0 = time.perf_counter()
    pos = torch.arange(ids.shape[0], device=ids.device)
    back = pos[:, None] - pos[None, :]  # query minus key position
    allowed = (back >= 0) & ((back < window) | (pos[None, :] < sinks))
    with converted.as_original() as base:
        # additive float mask: eager attention adds a 4D mask to the scores
        # (a boolean one would be added as 0/1), SDPA accepts either
        dtype = next(base.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=ids.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        hidden = base.model(input_ids=ids[None], attention_mask=mask[None, None], use_cache=False)
        nll = _head_nll(base, hidden.last_hidden_state[0][:-1], ids[1:])
    return DocumentEval(nll, time.perf_counter() - t0)


def _time_steps(step, tokens: torch.Tensor) -> float:
    """Median milliseconds of step(token) over the given tokens (first one is warm-up)."""
    times = []
    for i, tok in enumerate(tokens):
        t0 = time.perf_counter()
        step(tok.view(1, 1))
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def converted_nll(
    model, ids: torch.Tensor, *, contexts=CONTEXTS, chunk: int = 1024, decode_steps: int = 9
) -> DocumentEval:
    """Per-token NLL of a converted model on ids [T], fed `chunk` tokens at a
    time through its cache; decode timed at each context in `contexts`."""
    from latte.convert import MacchiatoCache  # optional dependency: imports transformers (extra "hf")
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    t0, spent = time.perf_counter(), 0.0
    N = ids.shape[0] - 1  # tokens fed: the last one only serves as a target
    cache, out, decode = MacchiatoCache(model.num_layers), [], {}
    stops = sorted({c for c in contexts if c <= N} | set(range(chunk, N, chunk)) | {N})
    start = 0
    for stop in stops:
        hidden = model.base.model(input_ids=ids[None, start:stop], **cache_kwargs(cache), use_cache=True)
        cache.seen_tokens += stop - start
        out.append(_head_nll(model.base, hidden.last_hidden_state[0], ids[start + 1 : stop + 1]))
        start = stop
        if stop in contexts and stop + decode_steps <= N + 1:
            t1 = time.perf_counter()
            probe = copy.deepcopy(cache)
            ms = _time_steps(
                lambda tok, probe=probe: model(tok, **cache_kwargs(probe), use_cache=True),
                ids[stop : stop + decode_steps],
            )
            decode[stop] = {"ms_per_token": ms, "state_bytes": float(cache.nbytes())}
            spent += time.perf_counter() - t1
    return DocumentEval(torch.cat(out), time.perf_counter() - t0 - spent, decode)


@torch.no_grad()
def original_decode(converted, context: int, *, steps: int = 9, seed: int = 0) -> dict[str, float]:
    """Decode ms/token and KV-cache bytes of the pretrained model at `context`
    tokens (cache of random keys/values, see the module docstring)."""
    from transformers import DynamicCache

    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    cfg = converted.base.config
    g = torch.Generator().manual_seed(seed)
    with converted.as_original() as base:
        cache = DynamicCache(config=cfg)
        E, K = converted.converted[0].spec.head_dim, cfg.num_key_value_heads
        dev = next(base.parameters()).device  # drawn on the CPU (seeded), kept where the model is

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(dev)

        for i in range(cfg.num_hidden_layers):
            cache.update(rand(1, K, context, E), rand(1, K, context, E), i)
        nbytes = sum(x.numel() * x.element_size() for layer in cache.layers for x in (layer.keys, layer.values))
        tokens = torch.randint(0, cfg.vocab_size, (steps,), generator=g).to(dev)
        ms = _time_steps(lambda tok: base(input_ids=tok, **cache_kwargs(cache), use_cache=True), tokens)
    return {"ms_per_token": ms, "state_bytes": float(nbytes)}


def perplexities(nlls: list[torch.Tensor], contexts=CONTEXTS) -> list[dict[str, float]]:
    """Per context C: perplexity over the first C positions of every document
    at least C + 1 tokens long, and over the position bucket [C/2, C) (the
    first bucket is [0, C)); with the tokens each one used."""
    rows = []
    for c in contexts:
        docs = [n for n in nlls if n.shape[0] >= c]
        if not docs:
            continue
        lo = 0 if c == contexts[0] else c // 2
        whole = torch.cat([n[:c] for n in docs])
        bucket = torch.cat([n[lo:c] for n in docs])
        rows.append(
            {
                "context": c,
                "documents": len(docs),
                "tokens": int(whole.numel()),
                "ppl": math.exp(float(whole.mean())),
                "bucket": f"{lo}-{c}",
                "bucket_ppl": math.exp(float(bucket.mean())),
                "bucket_tokens": int(bucket.numel()),
            }
        )
    return rows


def perplexity_summary(groups, contexts) -> tuple[list[dict], str]:
    """(records, markdown table) of per-document loss cells (field "nll":
    comma-separated per-token losses): `perplexities` per model. `groups`:
    per model, (the fields naming it in records, its label, its cells)."""
    records, rows = [], []
    for fields, name, cells in groups:
        nlls = [torch.tensor([float(x) for x in c["nll"].split(",")], dtype=torch.float64) for c in cells]
        for r in perplexities(nlls, contexts=contexts):
            records.append({**fields, **r, **decode_cost(cells, r["context"])})
            rows.append([name, f"{r['context']:,}", str(r["documents"]), f"{r['tokens']:,}"])
            rows[-1] += [f"{r['ppl']:.2f}", f"{r['bucket_ppl']:.2f}"]
    head = [
        "model",
        "context",
        "documents",
        "tokens",
        "ppl (first C tokens)",
        "ppl of [C/2, C) ([0, C) at the first C)",
    ]
    if any("state_bytes" in r for r in records):  # a converted model's evaluation: what decoding costs
        head += ["decode ms/token", "state MB"]
        for row, r in zip(rows, records):
            row += (
                [f"{r['decode_ms_per_token']:.1f}", f"{r['state_bytes'] / 2**20:.3g}"]
                if "state_bytes" in r
                else ["-"] * 2
            )
    return records, md_table(head, rows)


def decode_cost(cells: list[dict], context: int) -> dict:
    """decode_ms_per_token (the median over the cells) and state_bytes
    (the decoding state's size) at `context`, from the cells' fields
    ms_per_token_C and state_bytes_C; {} where no cell timed it (cells
    written before the ppl suite timed decoding are read as they are)."""
    timed = [c for c in cells if f"ms_per_token_{context}" in c]
    if not timed:
        return {}
    ms = statistics.median(c[f"ms_per_token_{context}"] for c in timed)
    return {"decode_ms_per_token": round(ms, 2), "state_bytes": int(timed[0][f"state_bytes_{context}"])}
