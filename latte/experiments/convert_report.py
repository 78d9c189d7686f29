"""Tables, plot and statements of `latte experiment convert`, written from
the sweep records by `latte.experiments.results.write_results`."""

from __future__ import annotations

import statistics
from pathlib import Path

from latte.eval.long_context import perplexities

from ..reporting import pyplot, save_figure, update_readme
from .convert_stages import CONTEXTS, DEFAULT_RECIPE, SHORT, nll_of
from .results import provenance, readme_body, write_results

MODELS = ("original", "swa", "converted")


def eval_records(cells: list[dict], contexts) -> list[dict]:
    """One record per (model, context): perplexity over the first `context`
    tokens and over the position bucket, tokens, documents, wall time,
    decode ms/token and state bytes at that context."""

    decode = {c["context"]: c for c in cells if c["model"] == "original-decode"}
    originals = [c for c in cells if c["model"] == "original"]
    out = []
    for model in MODELS:
        mine = [c for c in cells if c["model"] == model]
        if not mine:
            continue
        wall, load = sum(c["wall_s"] for c in mine), max(c["load"] for c in mine)
        for row in perplexities([nll_of(c) for c in mine], contexts):
            ctx = row["context"]
            if model != "original":
                row.update(_on_original_documents(mine, originals, ctx, contexts))
            if model == "original":
                d = decode.get(ctx, {})
                ms, nbytes = d.get("ms_per_token"), d.get("state_bytes")
            else:
                ms_all = [c[f"ms_per_token_{ctx}"] for c in mine if f"ms_per_token_{ctx}" in c]
                ms = statistics.median(ms_all) if ms_all else None
                nbytes = next((c[f"state_bytes_{ctx}"] for c in mine if f"state_bytes_{ctx}" in c), None)
            out.append(
                {
                    "model": model,
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
    read that far (it reads most of them to 8K only): a like-for-like
    comparison past 8K."""

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


def _get(records, model, ctx, key):
    for r in records:
        if r["model"] == model and r["context"] == ctx:
            return r.get(key)
    return None


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def eval_tables(records: list[dict], contexts) -> str:
    lines = [
        "Perplexity over the first C tokens of held-out plays (all positions < C), by model:",
        "",
        "| context C | original | swa (before up-training) | converted | documents (orig / others) "
        "| tokens (converted) |",
        "|---|---|---|---|---|---|",
    ]
    for c in contexts:
        if _get(records, "converted", c, "ppl") is None and _get(records, "original", c, "ppl") is None:
            continue
        lines.append(
            f"| {c:,} | {_fmt(_get(records, 'original', c, 'ppl'))} | {_fmt(_get(records, 'swa', c, 'ppl'))} "
            f"| {_fmt(_get(records, 'converted', c, 'ppl'))} | {_get(records, 'original', c, 'documents') or 0} / "
            f"{_get(records, 'converted', c, 'documents') or 0} | {_get(records, 'converted', c, 'tokens') or 0:,} |"
        )
    lines += [
        "",
        "Perplexity by position bucket (tokens at positions in the bucket only):",
        "",
        "| positions | original | swa | converted |",
        "|---|---|---|---|",
    ]
    for c in contexts:
        b = _get(records, "converted", c, "bucket") or _get(records, "original", c, "bucket")
        if b is None:
            continue
        lines.append(
            f"| {b} | {_fmt(_get(records, 'original', c, 'bucket_ppl'))} | "
            f"{_fmt(_get(records, 'swa', c, 'bucket_ppl'))} | {_fmt(_get(records, 'converted', c, 'bucket_ppl'))} |"
        )
    lines += [
        "",
        "Decoding one token after C tokens of context (batch 1): the converted model's "
        "constant-size state against the original's KV cache (float32):",
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
    return "\n".join(lines) + "\n\n" + statements(records, contexts)


def statements(records: list[dict], contexts) -> str:
    """Plain sentences from the numbers: past 8K, and within 8K."""
    past = [
        c
        for c in contexts
        if c > SHORT
        and _get(records, "original", c, "bucket_ppl") is not None
        and _get(records, "converted", c, "bucket_ppl") is not None
    ]
    within = [
        c
        for c in contexts
        if c <= SHORT
        and _get(records, "original", c, "ppl") is not None
        and _get(records, "converted", c, "ppl") is not None
    ]
    out = []
    if not past and contexts and max(contexts) <= SHORT:
        out.append(
            f"**Past 8K tokens: not measured here** (the contexts stop at {max(contexts):,}), so this run "
            "does not say whether the converted model beats the original there."
        )
    if past:
        # on the documents the original read that far, not on the converted model's larger set
        same = {c: _get(records, "converted", c, "bucket_ppl_original_documents") for c in past}
        wins = [c for c in past if same[c] < _get(records, "original", c, "bucket_ppl")]
        detail = "; ".join(
            f"positions {_get(records, 'converted', c, 'bucket')}: {same[c]:.2f} vs "
            f"{_get(records, 'original', c, 'bucket_ppl'):.2f} on "
            f"{_get(records, 'original', c, 'documents')} document(s)"
            for c in past
        )
        verdict = (
            "beats the original"
            if len(wins) == len(past)
            else "does not beat the original"
            if not wins
            else "beats the original in some buckets only"
        )
        out.append(
            f"**Past 8K tokens the converted model {verdict}** (converted vs original perplexity on the "
            f"same documents, the ones the original read that far: {detail})."
        )
    if within:
        ratios = [_get(records, "converted", c, "ppl") / _get(records, "original", c, "ppl") for c in within]
        swa = [(_get(records, "swa", c, "ppl") or float("nan")) / _get(records, "original", c, "ppl") for c in within]
        out.append(
            f"**Within 8K tokens** the converted model's perplexity is {min(ratios):.2f}x to {max(ratios):.2f}x "
            f"the original's (the sliding-window model before up-training: {min(swa):.2f}x to {max(swa):.2f}x)."
        )
    return "\n\n".join(out)


def sink_records(cells: list[dict], contexts) -> list[dict]:
    """One record per (sinks, context) of the sinks stage: perplexity of the
    original under the window mask with the first `sinks` tokens visible."""

    out = []
    for k in sorted({c["sinks"] for c in cells}):
        mine = [c for c in cells if c["sinks"] == k]
        wall, load = sum(c["wall_s"] for c in mine), max(c["load"] for c in mine)
        for row in perplexities([nll_of(c) for c in mine], contexts):
            out.append(
                {
                    "model": f"swa-mask-sinks{k}",
                    "sinks": k,
                    "window": mine[0]["window"],
                    **row,
                    "wall_s": round(wall, 1),
                    "max_load": load,
                }
            )
    return out


def sink_table(records: list[dict], sinks: list[dict], contexts) -> str:
    """The window's loss with and without the first tokens, next to the
    original, the cached sliding-window model and the converted model."""
    ks = sorted({r["sinks"] for r in sinks})
    if not ks:
        return ""
    window = sinks[0]["window"]
    shown = [c for c in contexts if any(r["context"] == c for r in sinks)]
    head = " | ".join(f"window + {k} first token{'s' if k != 1 else ''}" if k else "window (mask)" for k in ks)
    lines = [
        f"Where the sliding window loses: the original's weights with every token seeing only the last "
        f"{window} tokens, and the document's first k tokens kept visible as attention sinks (an explicit "
        f'mask, `latte.eval.long_context.original_window_nll`; "window (mask)" is the swa model computed '
        "another way). Perplexity over the first C tokens of the same held-out plays:",
        "",
        f"| context C | original | {head} | swa (cache) | converted |",
        "|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    for c in shown:
        cols = [_fmt(_get(sinks, f"swa-mask-sinks{k}", c, "ppl")) for k in ks]
        lines.append(
            f"| {c:,} | {_fmt(_get(records, 'original', c, 'ppl'))} | {' | '.join(cols)} | "
            f"{_fmt(_get(records, 'swa', c, 'ppl'))} | {_fmt(_get(records, 'converted', c, 'ppl'))} |"
        )
    c0, orig = shown[0], _get(records, "original", shown[0], "ppl")
    if orig and 0 in ks and max(ks) > 0:
        ratio = {k: _get(sinks, f"swa-mask-sinks{k}", c0, "ppl") / orig for k in ks}
        kept = ", ".join(
            f"{ratio[k]:.2f}x with the first {k} token{'s' if k != 1 else ''} kept visible" for k in ks if k
        )
        lines += ["", f"At {c0:,} tokens the window alone is {ratio[0]:.2f}x the original's perplexity; {kept}."]
    return "\n".join(lines)


def recipe_table(rows: list[dict]) -> str:
    lines = [
        "| recipe | overrides | validation ppl | training tokens | steps | training wall s | load at start |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | `{r['overrides'] or '-'}` | {r['val_ppl']:.2f} | {r['train_tokens']:,} | "
            f"{r['steps']} | {r['train_wall_s']:,.0f} | {_fmt(r.get('load_start'), '.1f')} |"
        )
    return "\n".join(lines) + "\n\n" + recipe_statement(rows)


def recipe_statement(rows: list[dict]) -> str:
    """Which recipe came out best, and whether the comparison is at equal
    training tokens (a time budget can stop runs at different steps)."""

    trained = [r for r in rows if not r["recipe"].startswith("none")]
    if not trained:
        return ""
    best = min(trained, key=lambda r: r["val_ppl"])
    tokens = {r["train_tokens"] for r in trained}
    same = (
        f"Every recipe saw the same {tokens.pop():,} training tokens."
        if len(tokens) == 1
        else "**The recipes saw different numbers of training tokens** (the time budget stopped some runs "
        "early), so this is not a like-for-like comparison."
    )
    if len(trained) == 1:
        return f"Only {best['recipe']} ran. {same}"
    default = next((r for r in trained if r["recipe"] == DEFAULT_RECIPE), None)
    verdict = (
        f"the default, {DEFAULT_RECIPE}, is the best here ({best['val_ppl']:.2f})"
        if best is default
        else f"**{best['recipe']} is best here ({best['val_ppl']:.2f}), not the default {DEFAULT_RECIPE}"
        + (f" ({default['val_ppl']:.2f})" if default else "")
        + "**"
    )
    return f"Lowest validation perplexity: {verdict}. {same}"


def plot(records: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:  # the plot extra is optional
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for model, color in zip(MODELS, ("C0", "C1", "C2")):  # one colour per model in both panels
        pts = sorted((r["context"], r["bucket_ppl"]) for r in records if r["model"] == model)
        if pts:
            ax1.plot(*zip(*pts), marker="o", label=model, color=color)
        dec = sorted(
            (r["context"], r["decode_ms_per_token"])
            for r in records
            if r["model"] == model and r["decode_ms_per_token"] is not None
        )
        if dec and model != "swa":
            ax2.plot(*zip(*dec), marker="o", label=f"{model} ms/token", color=color)
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="position bucket end (tokens)",
        ylabel="perplexity in bucket",
        title="Held-out plays, perplexity by position",
    )
    ax1.axvline(SHORT, color="grey", ls=":", lw=1)
    ax2.set(xscale="log", xlabel="context (tokens)", ylabel="ms per decoded token", title="Decode latency")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    save_figure(plt, fig, path)


def sample_md(sample: dict) -> str:
    def quote(text: str) -> str:
        return "\n".join("> " + line for line in text.strip().splitlines()) or "> (empty)"

    return (
        f"Sample: the converted model continues `{sample['document']}` after its first "
        f"{sample['prompt_tokens']:,} tokens (temperature 0.7, top-k 50, 60 tokens, {sample['wall_s']:.0f} s). "
        f"The prompt ends with:\n\n{quote(sample['prompt_tail'])}\n\nGenerated:\n\n{quote(sample['generated'])}\n\n"
        f"The play's actual continuation:\n\n{quote(sample['reference'])}\n"
    )


FULL_COMMAND = "latte experiment convert --readme results/README.md"


def cells_wall_s(recipe_rows, cells, sample) -> float:
    """Seconds the sweep cells themselves took (training, baselines,
    evaluation, sample), whichever invocation computed them."""
    total = sum(r.get("cell_wall_s", 0.0) for r in recipe_rows or [])
    total += sum(c.get("wall_s", 0.0) for c in cells or [])
    return total + (sample or {}).get("wall_s", 0.0)


def budget_md(a, argv, trained: dict | None, cells_s: float = 0.0, wall_s: float = 0.0) -> str:
    """What this run did against the full protocol (docs/evaluation.md §7):
    contexts not evaluated, training tokens and time, the load it ran under."""

    missing = [c for c in CONTEXTS if c not in a.contexts]
    parts = []
    if cells_s > wall_s:
        parts.append(
            f"This invocation reused finished cells: the cells took {cells_s:,.0f} s in all "
            f"(the wall time above is this invocation's)."
        )
    if trained:
        parts.append(
            f"Up-training (recipe {trained['recipe']}): {trained['train_tokens']:,} tokens in "
            f"{trained['steps']} steps, {trained['train_wall_s']:,.0f} s of training wall time, load "
            f"average {trained.get('load_start', float('nan')):.1f} at its start."
        )
    if missing or a.threads < 2:
        parts.append(
            f"**Reduced CPU budget**: {a.threads} thread(s) per job (every cell records the load "
            "average at its start); "
            + (
                f"contexts {', '.join(f'{c:,}' for c in missing)} were not evaluated (the original's "
                "quadratic prefill and the converted model's pass through its cache do not fit this "
                "budget); "
                if missing
                else ""
            )
            + f"the full protocol is `{FULL_COMMAND}`."
        )
    return " ".join(parts)


def report(a, argv, started, recipe_rows, cells, sample, sinks=None) -> None:
    out = Path(a.out)
    trained = next((r for r in recipe_rows or [] if r["recipe"] == DEFAULT_RECIPE), None)
    run = provenance("convert", argv, started, threads=a.threads)
    run["cells_wall_s"] = round(cells_wall_s(recipe_rows, [*(cells or []), *(sinks or [])], sample), 1)
    run["budget"] = budget = budget_md(a, argv, trained, run["cells_wall_s"], run["wall_s"])
    if recipe_rows:
        write_results(
            out / "convert-recipes",
            "convert-recipes",
            recipe_rows,
            recipe_table(recipe_rows) + ("\n\n" + budget if budget else ""),
            run,
            readme=a.readme,
        )
    if cells:
        contexts = a.contexts
        records = eval_records(cells, contexts)
        if trained:  # every record says what the converted model cost
            records = [
                {**r, "train_tokens": trained["train_tokens"], "train_wall_s": trained["train_wall_s"]} for r in records
            ]
        md = (budget + "\n\n" if budget else "") + eval_tables(records, contexts)
        if sinks:
            extra = sink_records(sinks, contexts)
            md += "\n\n" + sink_table(records, extra, contexts)
            records = records + extra
        md += "\n\n" + sample_md(sample) if sample else ""
        md += "\n\n![perplexity and decode latency](convert.png)\n"
        write_results(out / "convert", "convert", records, md, run)
        plot(records, out / "convert" / "convert.png")
        if a.readme:  # the same text, its plot link made relative to the README
            update_readme(
                Path(a.readme),
                "convert",
                readme_body((out / "convert" / "results.md").read_text(), out / "convert", Path(a.readme)),
                kind="results",
            )
