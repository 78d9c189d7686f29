"""Perplexity tables, statements and plot of the `eval` stage of `latte
experiment convert` (results/convert): the four models of
latte.eval's MODELS on held-out plays and essays, by context and by
position bucket, with decode cost, written from the sweep cells."""

from __future__ import annotations

import statistics
from pathlib import Path

from latte.eval import MODELS, label, perplexities
from latte.reporting import pyplot, save_figure

from .stages import SHORT, nll_of

CORPUS_TEXT = {
    "plays": "held-out Shakespeare plays",
    "essays": "held-out Paul Graham essays (joined in seeded orders)",
}


def eval_records(cells: list[dict], contexts) -> list[dict]:
    """One record per (corpus, model, context): perplexity over the first
    `context` tokens and over the position bucket, tokens, documents, wall
    time, decode ms/token and state bytes at that context."""
    decode = {c["context"]: c for c in cells if c["model"] == "original-decode"}
    out = []
    for corpus in dict.fromkeys(c.get("corpus", "plays") for c in cells if c["model"] != "original-decode"):
        mine_corpus = [c for c in cells if c.get("corpus", "plays") == corpus and c["model"] != "original-decode"]
        originals = [c for c in mine_corpus if c["model"] == "original"]
        for model in MODELS:
            mine = [c for c in mine_corpus if c["model"] == model]
            if not mine:
                continue
            wall, load = sum(c["wall_s"] for c in mine), max(c["load"] for c in mine)
            for row in perplexities([nll_of(c) for c in mine], contexts):
                ctx = row["context"]
                if model != "original":
                    row.update(_on_original_documents(mine, originals, ctx, contexts))
                    ms_all = [c[f"ms_per_token_{ctx}"] for c in mine if f"ms_per_token_{ctx}" in c]
                    ms = statistics.median(ms_all) if ms_all else None
                    nbytes = next((c[f"state_bytes_{ctx}"] for c in mine if f"state_bytes_{ctx}" in c), None)
                else:
                    ms, nbytes = decode.get(ctx, {}).get("ms_per_token"), decode.get(ctx, {}).get("state_bytes")
                out.append(
                    {
                        "corpus": corpus,
                        "model": model,
                        **({"sinks": mine[0]["sinks"]} if "sinks" in mine[0] else {}),
                        **row,
                        "wall_s": round(wall, 1),
                        "max_load": load,
                        "decode_ms_per_token": None if ms is None else round(ms, 2),
                        "state_bytes": None if nbytes is None else int(nbytes),
                    }
                )
    return out


def _on_original_documents(mine: list[dict], originals: list[dict], ctx: int, contexts) -> dict:
    """The model's perplexities at ctx over only the documents the original
    read that far (it reads most of them to 8K only): like for like past 8K."""
    names = {o["document"] for o in originals if nll_of(o).shape[0] >= ctx}
    rows = perplexities([nll_of(c) for c in mine if c["document"] in names], contexts)
    row = next((r for r in rows if r["context"] == ctx), None)
    if row is None:
        return {}
    return {
        "ppl_original_documents": row["ppl"],
        "bucket_ppl_original_documents": row["bucket_ppl"],
        "original_documents": row["documents"],
    }


def _get(records, model, ctx, key, corpus=None):
    for r in records:
        if r["model"] == model and r["context"] == ctx and (corpus is None or r.get("corpus", "plays") == corpus):
            return r.get(key)
    return None


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _sinks(records) -> int | None:
    return next((r["sinks"] for r in records if "sinks" in r), None)


def corpus_tables(records: list[dict], corpus: str, contexts, original_context: int | None = None) -> str:
    mine = [r for r in records if r.get("corpus", "plays") == corpus]
    models = [m for m in MODELS if any(r["model"] == m for r in mine)]
    k = _sinks(mine)
    head = " | ".join(label(m, k) for m in models)
    lines = [
        f"Perplexity over the first C tokens of {CORPUS_TEXT.get(corpus, corpus)} (all positions < C):",
        "",
        f"| context C | {head} | documents (original / others) |",
        "|---|" + "---|" * (len(models) + 1),
    ]
    for c in contexts:
        if all(_get(mine, m, c, "ppl") is None for m in models):
            continue
        other = next((m for m in models if m != "original"), "original")
        cols = " | ".join(_fmt(_get(mine, m, c, "ppl")) for m in models)
        docs = f"{_get(mine, 'original', c, 'documents') or 0} / {_get(mine, other, c, 'documents') or 0}"
        lines.append(f"| {c:,} | {cols} | {docs} |")
    lines += ["", "By position bucket (tokens at positions in the bucket only):", ""]
    lines += [f"| positions | {head} |", "|---|" + "---|" * len(models)]
    for c in contexts:
        b = next((_get(mine, m, c, "bucket") for m in models if _get(mine, m, c, "bucket")), None)
        if b is not None:
            lines.append(f"| {b} | " + " | ".join(_fmt(_get(mine, m, c, "bucket_ppl")) for m in models) + " |")
    return "\n".join(lines) + "\n\n" + statements(mine, contexts, original_context)


def decode_table(records: list[dict], contexts) -> str:
    lines = [
        "Decoding one token after C tokens of context (batch 1): the converted model's constant-size state "
        "against the original's KV cache (float32):",
        "",
        "| context C | original ms/token | original KV cache MB | converted ms/token | converted state MB |",
        "|---|---|---|---|---|",
    ]
    for c in contexts:
        ob, cb = _get(records, "original", c, "state_bytes"), _get(records, "converted", c, "state_bytes")
        lines.append(
            f"| {c:,} | {_fmt(_get(records, 'original', c, 'decode_ms_per_token'), '.1f')} | "
            f"{_fmt(None if ob is None else ob / 2**20, '.1f')} | "
            f"{_fmt(_get(records, 'converted', c, 'decode_ms_per_token'), '.1f')} | "
            f"{_fmt(None if cb is None else cb / 2**20, '.2f')} |"
        )
    return "\n".join(lines)


def statements(records: list[dict], contexts, original_context: int | None = None) -> str:
    """Plain sentences from the numbers of one corpus: past 8K, within 8K,
    and the issue's targets there (within 5% of the original, below window + sinks).
    `original_context` (the base model's max_position_embeddings) says
    whether past 8K is still inside the original's own context (Gemma 3's
    32K) or past it (SmolLM2's 8K): beating the original means less there."""
    past = [c for c in contexts if c > SHORT and None not in _pair(records, c, "bucket_ppl")]
    within = [c for c in contexts if c <= SHORT and None not in _pair(records, c, "ppl")]
    out = []
    if not past and contexts and max(contexts) <= SHORT:
        out.append(
            f"**Past 8K tokens: not measured here** (the contexts stop at {max(contexts):,}), so this run "
            "does not say whether the converted model beats the original there."
        )
    if past:  # on the documents the original read that far, not on the converted model's larger set
        same = {c: _get(records, "converted", c, "bucket_ppl_original_documents") for c in past}
        wins = [c for c in past if same[c] < _get(records, "original", c, "bucket_ppl")]
        detail = "; ".join(
            f"positions {_get(records, 'converted', c, 'bucket')}: {same[c]:.2f} vs "
            f"{_get(records, 'original', c, 'bucket_ppl'):.2f} on {_get(records, 'original', c, 'documents')} "
            "document(s)"
            for c in past
        )
        verdict = (
            "beats the original"
            if len(wins) == len(past)
            else "does not beat the original"
            if not wins
            else "beats the original in some buckets only"
        )
        inside = (
            f", inside the original's own {original_context:,}-token context,"
            if original_context and original_context > SHORT
            else ""
        )
        out.append(
            f"**Past 8K tokens{inside} the converted model {verdict}** (converted vs original perplexity on the "
            f"same documents, the ones the original read that far: {detail})."
        )
    if within:
        ratios = {c: _get(records, "converted", c, "ppl") / _get(records, "original", c, "ppl") for c in within}
        text = (
            f"**Within 8K tokens** the converted model's perplexity is {min(ratios.values()):.3f}x to "
            f"{max(ratios.values()):.3f}x the original's"
        )
        ref = {c: _get(records, "window+sinks", c, "ppl") for c in within}
        if all(v is not None for v in ref.values()):
            below = [c for c in within if _get(records, "converted", c, "ppl") < ref[c]]
            ok = all(r <= 1.05 for r in ratios.values()) and len(below) == len(within)
            text += (
                f"; below window + {_sinks(records)} sinks at {len(below)} of {len(within)} lengths. "
                f"Target (within 5% of the original and below window + sinks at every length): "
                f"**{'met' if ok else 'missed'}**"
            )
        out.append(text + ".")
    return "\n\n".join(out)


def _pair(records, c, key):
    return _get(records, "original", c, key), _get(records, "converted", c, key)


def plot(records: list[dict], path: Path) -> None:
    """Perplexity by position bucket per corpus, and decode latency."""
    plt = pyplot()
    if plt is None:  # the plot extra is optional
        return
    corpora = list(dict.fromkeys(r.get("corpus", "plays") for r in records))
    fig, axes = plt.subplots(1, len(corpora) + 1, figsize=(5.5 * (len(corpora) + 1), 4))
    k = _sinks(records)
    for ax, corpus in zip(axes, corpora):
        for i, model in enumerate(MODELS):
            pts = sorted(
                (r["context"], r["bucket_ppl"])
                for r in records
                if r["model"] == model and r.get("corpus", "plays") == corpus
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label(model, k), color=f"C{i}")
        ax.set(xscale="log", yscale="log", xlabel="position bucket end (tokens)", ylabel="perplexity in bucket")
        ax.set_title(CORPUS_TEXT.get(corpus, corpus), fontsize=9)
        ax.axvline(SHORT, color="grey", ls=":", lw=1)
    ax = axes[-1]
    for model in ("original", "converted"):
        dec = sorted(
            (r["context"], r["decode_ms_per_token"])
            for r in records
            if r["model"] == model and r["decode_ms_per_token"] is not None and r.get("corpus", "plays") == corpora[0]
        )
        if dec:
            ax.plot(*zip(*dec), marker="o", label=f"{model} ms/token", color=f"C{MODELS.index(model)}")
    ax.set(xscale="log", xlabel="context (tokens)", ylabel="ms per decoded token", title="Decode latency")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    save_figure(plt, fig, path)
