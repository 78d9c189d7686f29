"""Tables and plots of `python -m experiments.lm_variants`: the per-variant table,
context extrapolation and latent utilisation. Each builder returns
(flat records, markdown, PNG names written in `out`)."""

from __future__ import annotations

import shutil
import statistics
from collections import defaultdict
from pathlib import Path

from latte.eval import per_head
from latte.reporting import pyplot, save_figure

from .plans import PLANS

ORDER = (
    "softmax",
    "macchiato",
    "latte-conv_rglru",
    "latte-conv_rglru-L256",
    "latte-conv",
    "latte-none",
    "swa",
    "linear",
)


def _by_variant(records: list[dict]) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for r in records:
        groups[r["variant"]].append(r)
    return dict(sorted(groups.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)))


def spread(values: list[float]) -> str:
    """mean ± sample std (min-max) over seeds; the mean alone for one value."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _recipe(records: list[dict], sets: list[str]) -> str:
    r = records[0]
    steps, tokens = r["steps"], r["tokens_seen"]
    extra = f"; overrides {' '.join(sets)}" if sets else ""
    if r.get("train_tokens"):  # the LM summary records the training split's size since issue 27
        epochs = f", {tokens / r['train_tokens']:.1f} epochs of the {r['train_tokens']:,}-token training split"
    else:
        epochs = ""
    return (
        f"Every run is a real `latte train` of a shipped config `latte/configs/mixers/*.yaml`: the same "
        f"tokens, width, depth, optimizer and {steps} steps ({tokens:,} training tokens{epochs}) for every "
        f"variant, which differ only in the token mixer{extra}. Validation perplexity on the whole "
        f"validation split ({r['val_tokens']:,} tokens of documents never seen in training); tokens/s of "
        "the training steps alone; wall time of the whole job (tokenizer, packing, validation "
        "included). Each run used 1 thread of a 2-core machine (load average "
        f"{min(x['loadavg_start'] for x in records):.1f}-{max(x['loadavg_start'] for x in records):.1f} at "
        "the runs' starts; about 2 is two 1-thread jobs, such as two sweep workers, and more means "
        "the cores were oversubscribed), so tokens/s and times compare only roughly."
    )


def variants_report(records: list[dict], out: Path, **kw) -> tuple[list[dict], str, list[str]]:
    groups = _by_variant(records)
    lines = [
        "| variant | mixer | qk_mixer | val ppl, mean ± std (min-max) | seeds | train tokens/s | "
        "wall time per run (s) | parameters |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, rs in groups.items():
        lines.append(
            f"| {v} | {rs[0]['mixer']} | {rs[0]['qk_mixer'] or '-'} | {spread([r['val_ppl'] for r in rs])} | "
            f"{len(rs)} | {statistics.mean(r['tokens_per_s'] for r in rs):,.0f} | "
            f"{statistics.mean(r['wall_s'] for r in rs):,.0f} | {rs[0]['parameters']:,} |"
        )
    mean = {v: statistics.mean(r["val_ppl"] for r in rs) for v, rs in groups.items()}
    ranking = " < ".join(f"{v} ({p:.2f})" for v, p in sorted(mean.items(), key=lambda kv: kv[1]))
    unigram = records[0]["unigram_ppl"]
    parts = [
        _recipe(records, kw.get("sets", [])),
        "\n".join(lines),
        f"Ranking by mean validation perplexity (lower is better): {ranking}. "
        f"The unigram baseline of the same tokenizer is {unigram:.1f}.",
        f"Total training wall time: {sum(r['wall_s'] for r in records) / 3600:.2f} h over {len(records)} runs.",
    ]
    seeds = min(len(rs) for rs in groups.values())
    plan = kw.get("plan", "table1")
    asked = len(PLANS[plan].seeds.split(","))
    if seeds < asked:
        parts.insert(
            1,
            f"**Seeds: {seeds} per variant where the protocol asks for {asked} (a reduced CPU budget), so the "
            "table shows no spread and differences of a few percent are within seed noise.** The full "
            f"run is `python -m experiments.lm_variants --plan {plan}` (seeds {PLANS[plan].seeds.replace(',', ', ')}).",
        )
    elif asked == 1:
        parts.insert(
            1,
            "**One seed per variant**: differences within the spread over seeds of the same recipe at "
            "300 steps (the std column of results/lm_variants) are not evidence of an ordering.",
        )
    images = ["val_ppl.png"] if _plot_variants(groups, Path(out) / "val_ppl.png") else []
    return records, "\n\n".join(parts), images


def eval_cost(records: list[dict]) -> str:
    """The wall time of a stage's `latte eval` runs and the load they ran under."""
    loads = [r["loadavg_start"] for r in records]
    return (
        f"Evaluation wall time: {sum(r['seconds'] for r in records):,.0f} s over {len(records)} runs, 1 thread "
        f"each, load average {min(loads):.1f}-{max(loads):.1f} at their starts (2 cores)."
    )


def _figure(size: tuple):
    """(pyplot, figure, axes), or (None, None, None) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None, None, None
    fig, ax = plt.subplots(figsize=size)
    return plt, fig, ax


def _plot_variants(groups: dict, path: Path) -> bool:
    plt, fig, ax = _figure((7, 3.8))
    if plt is None:
        return False
    for i, rs in enumerate(groups.values()):
        ys = [r["val_ppl"] for r in rs]
        ax.bar(i, statistics.mean(ys), color=f"C{i}", alpha=0.6)
        ax.plot([i] * len(ys), ys, "k.", ms=5)
    ax.set_xticks(range(len(groups)), list(groups), rotation=20, fontsize=8)
    ax.set_ylabel("validation perplexity (bars: mean, dots: seeds)")
    lo = min(r["val_ppl"] for rs in groups.values() for r in rs)
    ax.set_ylim(lo * 0.9, None)
    save_figure(plt, fig, path, dpi=110)
    return True


# --------------------------------------------------------------------------- extrapolation


def _flatten_eval(records: list[dict]) -> list[dict]:
    flat = []
    for r in records:
        base = {
            "variant": r["variant"],
            "seed": r["seed"],
            "mixer": r["mixer"],
            "qk_mixer": r["qk_mixer"],
            "train_seq_len": r["report"]["train_seq_len"],
        }
        for res in r["report"]["results"]:
            head = {**base, "multiple": res["multiple"], "seq_len": res["seq_len"]}
            if "error" in res:
                flat.append({**head, "bucket": "all", "error": res["error"]})
                continue
            flat.append(
                {
                    **head,
                    "bucket": "all",
                    "positions": f"1-{res['seq_len']}",
                    "ppl": res["ppl"],
                    "loss": res["loss"],
                    "tokens": res["tokens"],
                }
            )
            for b in res["buckets"]:
                flat.append(
                    {
                        **head,
                        "bucket": b["bucket"],
                        "positions": b["positions"],
                        "ppl": b["ppl"],
                        "loss": b["loss"],
                        "tokens": b["tokens"],
                    }
                )
    return flat


def extrapolation_report(records: list[dict], out: Path, **kw) -> tuple[list[dict], str, list[str]]:
    flat = _flatten_eval(records)
    whole = [f for f in flat if f["bucket"] == "all"]
    multiples = sorted({f["multiple"] for f in whole})
    groups = _by_variant(whole)
    T = whole[0]["train_seq_len"]
    lines = [
        "| variant | " + " | ".join(f"{m}x ({m * T})" for m in multiples) + " | ppl at max / ppl at 1x |",
        "|---|" + "---|" * (len(multiples) + 1),
    ]
    means = {}
    for v, rs in groups.items():
        means[v] = {m: [f["ppl"] for f in rs if f["multiple"] == m and "ppl" in f] for m in multiples}
        cells = [spread(means[v][m]) if means[v][m] else "n/a" for m in multiples]
        ratio = (
            statistics.mean(means[v][multiples[-1]]) / statistics.mean(means[v][multiples[0]])
            if means[v][multiples[-1]] and means[v][multiples[0]]
            else float("nan")
        )
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    top = multiples[-1]
    at_top = [f for f in flat if f["multiple"] == top and f["bucket"] != "all" and "ppl" in f]
    buckets = list(dict.fromkeys(f["positions"] for f in at_top))
    by = ["| variant | " + " | ".join(f"positions {b}" for b in buckets) + " |", "|---|" + "---|" * len(buckets)]
    for v, rs in _by_variant(at_top).items():
        by.append(
            f"| {v} | " + " | ".join(spread([f["ppl"] for f in rs if f["positions"] == b]) for b in buckets) + " |"
        )
    parts = [
        f"`latte eval --lengths {','.join(map(str, multiples))}` on every run: validation perplexity of "
        f"windows of 1x..{top}x the training length ({T} tokens), all on the same "
        f"{min(f['tokens'] for f in whole):,} validation tokens "
        "(mean ± std (min-max) over seeds). Softmax and SWA use RoPE; no variant has absolute "
        "position embeddings, so every length runs.",
        "\n".join(lines),
        f"By position inside the {top}x windows ({top * T} tokens):",
        "\n".join(by),
    ]
    images = ["extrapolation.png"] if _plot_extrapolation(means, multiples, T, Path(out) / "extrapolation.png") else []
    parts.append(eval_cost(records))
    return flat, "\n\n".join(parts), images


def _plot_extrapolation(means: dict, multiples: list[int], T: int, path: Path) -> bool:
    plt, fig, ax = _figure((6.5, 4))
    if plt is None:
        return False
    for i, (v, by_m) in enumerate(means.items()):
        ms = [m for m in multiples if by_m[m]]
        ax.plot([m * T for m in ms], [statistics.mean(by_m[m]) for m in ms], marker="o", color=f"C{i}", label=v)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"evaluation window (tokens; trained at {T})")
    ax.set_ylabel("validation perplexity (mean over seeds)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(plt, fig, path, dpi=110)
    return True


# --------------------------------------------------------------------------- latents

POSITION_BUCKETS = ((1, 16), (17, 64), (65, 256), (257, 1024))


def _flatten_latents(records: list[dict]) -> list[dict]:
    flat = []
    for r in records:
        for layer in r["report"]["layers"]:
            for h in layer["heads"]:
                row = {
                    "variant": r["variant"],
                    "seed": r["seed"],
                    "mixer": r["mixer"],
                    "qk_mixer": r["qk_mixer"],
                    "layer": layer["layer"],
                    "head": h["head"],
                    "tokens": r["report"]["tokens"],
                    "latents_per_head": per_head(h),  # cells written before the name: num_latents
                    **{
                        k: h[k]
                        for k in (
                            "entropy",
                            "max_entropy",
                            "effective_latents",
                            "used_fraction",
                            "top_latent_mass",
                        )
                    },
                }
                if "p_window_mean" in h:
                    row.update({k: h[k] for k in ("p_window_mean", "p_window_p10", "p_window_median", "p_window_p90")})
                    pos = h["p_window_by_position"]
                    for lo, hi in POSITION_BUCKETS:
                        if lo <= len(pos):
                            seg = pos[lo - 1 : min(hi, len(pos))]
                            row[f"p_window_pos_{lo}_{min(hi, len(pos))}"] = sum(seg) / len(seg)
                flat.append(row)
    return flat


def _latents_by_layer(flat: list[dict]) -> str:
    """Effective latents per layer (mean and min over heads and seeds), and
    Macchiato's window share per layer: where a collapse sits."""
    layers = sorted({r["layer"] for r in flat})
    lines = [
        "Effective latents by layer, mean (min) over heads and seeds; for Macchiato also the mean p(window):",
        "",
        "| variant | " + " | ".join(f"layer {i}" for i in layers) + " |",
        "|---|" + "---|" * len(layers),
    ]
    for v, rs in _by_variant(flat).items():
        cells = []
        for i in layers:
            eff = [r["effective_latents"] for r in rs if r["layer"] == i]
            pw = [r["p_window_mean"] for r in rs if r["layer"] == i and "p_window_mean" in r]
            cells.append(f"{statistics.mean(eff):.1f} ({min(eff):.1f})" if eff else "-")
            if pw:
                cells[-1] += f"; p(window) {statistics.mean(pw):.2f}"
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latents_report(records: list[dict], out: Path, *, runs: Path, **kw) -> tuple[list[dict], str, list[str]]:
    flat = _flatten_latents(records)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| variant | heads (layers x heads x seeds) | latents per head | effective latents: mean (min) | "
        "used fraction: mean (min) | top latent mass: max | p(window) mean | p(window) by position |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, rs in _by_variant(flat).items():
        eff = [r["effective_latents"] for r in rs]
        used = [r["used_fraction"] for r in rs]
        pw = [r["p_window_mean"] for r in rs if "p_window_mean" in r]
        pos_keys = [k for k in rs[0] if k.startswith("p_window_pos_")]
        by_pos = ", ".join(
            f"{k[len('p_window_pos_') :].replace('_', '-')}: {statistics.mean(r[k] for r in rs):.2f}" for k in pos_keys
        )
        lines.append(
            f"| {v} | {len(rs)} | {rs[0]['latents_per_head']} | {statistics.mean(eff):.1f} ({min(eff):.1f}) | "
            f"{statistics.mean(used):.2f} ({min(used):.2f}) | {max(r['top_latent_mass'] for r in rs):.3f} | "
            + (f"{statistics.mean(pw):.3f} | {by_pos} |" if pw else "- | - |")
        )
    images = []
    for r in records:  # the heat maps of the first seed of each variant
        png = Path(runs) / r["variant"] / f"seed-{r['seed']}" / "latents.png"
        if r["seed"] == min(x["seed"] for x in records if x["variant"] == r["variant"]) and png.is_file():
            shutil.copyfile(png, out / f"{r['variant']}.png")
            images.append(f"{r['variant']}.png")
    parts = [
        "`latte eval --latents` on every Latte and Macchiato run: per layer and head, the average over "
        f"{flat[0]['tokens']:,} validation tokens of p(l|t) = softmax(a_t), its entropy, the effective "
        "number of latents exp(entropy), the fraction of latents whose average mass exceeds 1/(10 L), "
        "and for Macchiato the window's share p(window|t) of each token's attention (by position in the "
        "window). A collapsed layer would show effective latents near 1 and a small used fraction.",
        "\n".join(lines),
        _latents_by_layer(flat),
        "Per head, in results.json; heat maps of the first seed below.",
    ]
    parts.append(eval_cost(records))
    return flat, "\n\n".join(parts), images
