"""The report of `python -m benchmarks.train` (train.py): markdown table, ratios from
the same run (each variant over softmax, eager over compiled), plot."""

from __future__ import annotations

from latte import bench as common
from latte import reporting

from . import step_profile

_COMPILED = " compiled"


def step_ratios(res: dict) -> dict:
    """Per sequence, each variant's step time over softmax's and over linear
    attention's (same size, eager over eager and compiled over compiled),
    its attention layer's fwd+bwd time over theirs, and, with --compile,
    eager over compiled."""
    rows = [r for r in res["results"] if not r.get("skipped")]

    def key(r, mixer):
        return mixer, r["seq"], r.get("size", ""), bool(r.get("compiled"))

    base = {key(r, r["mixer"]): r for r in rows if r["mixer"] in ("softmax", "linear")}
    out = {"over_softmax": {}, "over_linear": {}, "layer_over_softmax": {}, "layer_over_linear": {}}
    out["eager_over_compiled"] = {}
    for r in rows:
        seq = str(r["seq"])
        for name in ("softmax", "linear"):
            b = base.get(key(r, name))
            if b is None:
                continue
            out[f"over_{name}"].setdefault(seq, {})[r["label"]] = r["median_ms"] / b["median_ms"]
            if r.get("attention_layer_ms") and b.get("attention_layer_ms"):
                ratio = r["attention_layer_ms"] / b["attention_layer_ms"]
                out[f"layer_over_{name}"].setdefault(seq, {})[r["label"]] = ratio
    cell = {(r["label"], r["seq"]): r["median_ms"] for r in rows}
    for (label, seq), ms in cell.items():
        eager = label[: -len(_COMPILED)]
        if label.endswith(_COMPILED) and (eager, seq) in cell:
            out["eager_over_compiled"].setdefault(str(seq), {})[eager] = cell[(eager, seq)] / ms
    return out


def _ratio_table(ratios: dict, seqs: list, labels: list) -> list[str]:
    if not ratios["over_softmax"]:
        return []
    cols = [("over_softmax", "step / softmax's"), ("over_linear", "step / linear's")]
    cols += [("eager_over_compiled", "eager / compiled")]
    cols = [(k, t) for k, t in cols if ratios.get(k)]
    hdr = ["mixer"] + [f"seq {s}: {t}" for _, t in cols for s in seqs]
    rows = [[m] + [ratios[k].get(str(s), {}).get(m, "-") for k, _ in cols for s in seqs] for m in labels]
    return [
        "",
        "Ratios from the same run (step time over softmax's and over linear attention's in the same "
        "size, eager with eager and compiled with compiled; eager over compiled step time per mixer):",
        "",
        reporting.md_table(hdr, [[c if isinstance(c, str) else f"{c:.2f}" for c in r] for r in rows]),
    ]


def _layer_table(res: dict, ratios: dict, seqs: list, labels: list) -> list[str]:
    """One attention layer alone (the first), forward+backward, at the step's
    batch and sequence: ms, and over linear attention's and softmax's layer."""
    cell = {(r["label"], r["seq"]): r for r in res["results"] if not r.get("skipped")}
    if not any("attention_layer_ms" in r for r in cell.values()):
        return []
    hdr = ["mixer"] + [f"seq {s}: ms / over linear's / over softmax's" for s in seqs]
    rows = []
    for m in labels:
        row = [m]
        for s in seqs:
            r = cell.get((m, s))
            if r is None:
                row.append("-")
                continue
            over = [ratios.get(f"layer_over_{b}", {}).get(str(s), {}).get(m) for b in ("linear", "softmax")]
            row.append(f"{r['attention_layer_ms']:.1f} / " + " / ".join("-" if x is None else f"{x:.2f}" for x in over))
        rows.append(row)
    return [
        "",
        "One attention layer alone (the model's first), forward+backward on a random input of the "
        "step's batch and sequence length, interleaved like the steps: median ms, and over linear "
        "attention's and softmax's layer in the same size and run:",
        "",
        reporting.md_table(hdr, rows),
    ]


def _mixer_notes(res: dict, seqs: list) -> list[str]:
    """The RG-LRU qk mixers' layer over the conv mixer's (same mixer, size, run)."""
    first = res["config"]["dists"][0]
    cell = {
        (r["mixer"], r.get("size", ""), r["seq"]): r
        for r in res["results"]
        if not r.get("skipped") and not r.get("compiled") and r.get("dist") == first and r.get("backend") == "torch"
    }
    notes = []
    for (mixer, size, seq), r in sorted(cell.items()):
        fam, _, qk = mixer.partition(":")
        conv = cell.get((f"{fam}:conv", size, seq))
        if conv is None or (qk or "conv_rglru") not in ("rglru", "conv_rglru") or fam not in ("latte", "macchiato"):
            continue
        notes.append(
            f"- seq {seq}{f' @{size}' if size not in ('', 'v8192') else ''}: {mixer} "
            f"(qk mixer {qk or 'conv_rglru'}) layer / {fam}:conv layer = "
            f"{r['attention_layer_ms'] / conv['attention_layer_ms']:.2f}x"
        )
    return notes


def _ratio_notes(cell: dict, seqs: list, mixer: str = "macchiato", base: str = "softmax") -> list[str]:
    """mixer / base throughput per sequence, and the most it could be if the
    mixer's attention layers cost nothing (everything else unchanged)."""
    notes = []
    for s in seqs:
        a, b = cell.get((mixer, s)), cell.get((base, s))
        if not a or not b or a.get("skipped") or b.get("skipped"):
            continue
        rest = max(a["median_ms"] - a["attention_ms"], 1e-9)
        notes.append(
            f"- seq {s}: {mixer} / {base} tokens/s = {b['median_ms'] / a['median_ms']:.2f}x. "
            f"Attention layers are {a['attention_share']:.0%} of the {mixer} step and "
            f"{b['attention_share']:.0%} of the {base} step; with zero-cost attention layers "
            f"{mixer} could reach at most {b['median_ms'] / rest:.2f}x."
        )
    return notes


def where(machine: dict) -> str:
    return machine.get("gpu") or f"{machine['cpu_model']}, {machine['threads']} threads"


def output_name(cfg: dict) -> str:
    """train, train-sweep (--preset sweep), then -compiled (--compile), -cuda
    (on a GPU), -TAG (--tag): the names of the files and of the README section."""
    return (
        "train"
        + ("-sweep" if cfg.get("preset") == "sweep" else "")
        + ("-compiled" if cfg.get("compile") else "")
        + ("" if cfg.get("device", "cpu") == "cpu" else f"-{cfg['device']}")
        + (f"-{cfg['tag']}" if cfg.get("tag") else "")
    )


def _size(cfg: dict) -> str:
    if cfg["quick"]:
        return "quick, tiny model"
    if cfg.get("preset") != "sweep":
        return "Table 6 preset"
    sizes = cfg.get("sizes") or {"v8192": {"vocab_size": 8192}}
    return "research-sweep size; " + ", ".join(
        f"{'@' + z + ': ' if z != 'v8192' else ''}" + ", ".join(f"{k} {v:g}" for k, v in fields.items())
        for z, fields in sizes.items()
    )


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["label"], r["seq"]): r for r in res["results"]}
    hdr = ["mixer", "params (M)"] + [f"seq {s}: batch / s per step / tok/s / attention share" for s in cfg["seqs"]]
    rows = []
    for mx in cfg["variants"]:
        ok = [cell[(mx, s)] for s in cfg["seqs"] if not cell.get((mx, s), {"skipped": True}).get("skipped")]
        row = [mx, f"{ok[0]['params'] / 1e6:.3f}" if ok else "-"]
        for s in cfg["seqs"]:
            r = cell.get((mx, s))
            row.append(
                "skip"
                if r is None or r.get("skipped")
                else f"{r['batch']} / {r['median_ms'] / 1e3:.3f} / {r['tokens_per_s']:,.0f} / "
                f"{r.get('attention_share', float('nan')):.0%}"
            )
        rows.append(row)
    load = m.get("loadavg_start")
    out = [
        f"# latte bench train ({_size(cfg)})",
        "",
        f"{where(m)}, torch {m['torch']}, {cfg.get('dtype', 'float32')}; one AdamW step (fused LM "
        f"head + loss), median of {cfg['repeats']} steps, mixers interleaved round by round. Attention "
        f'share = forward+backward of one mixer layer alone x layers / step time. "(b stdN)": the latent '
        f"layers' key projections scaled so their key logits have std N, as in a trained model."
        + (f" Load average {load[0]:.1f} at the start." if load else ""),
        "",
        reporting.md_table(hdr, rows),
    ]
    if res.get("merged"):
        pm = res["merged"]["machine"]
        out += [
            "",
            f"Sequence length(s) {res['merged']['seqs']} from an earlier run ({pm['time_utc']}, load avg "
            f"{pm['loadavg_start'][0]:.1f} at its start); the rest from this one ({m['time_utc']}).",
        ]
    ratios = res.get("ratios") or step_ratios(res)
    out += _ratio_table(ratios, cfg["seqs"], cfg["variants"])
    out += _layer_table(res, ratios, cfg["seqs"], cfg["variants"])
    notes = _ratio_notes(cell, cfg["seqs"]) + _mixer_notes(res, cfg["seqs"])
    for seq in cfg["seqs"]:
        out += step_profile.markdown(
            {r["label"]: r["profile"] for r in res["results"] if r["seq"] == seq and r.get("profile")}, seq
        )
    skips = [f"- {r['label']} @ {r['seq']}: {r['reason']}" for r in res["results"] if r.get("skipped")]
    return "\n".join(out + ([""] + notes if notes else []) + ([""] + skips if skips else [])) + "\n"


def plot(res: dict, path) -> bool:
    series = {}
    for mx in res["config"]["variants"]:
        pts = [(r["seq"], r["tokens_per_s"]) for r in res["results"] if r["label"] == mx and not r.get("skipped")]
        series[mx] = ([s for s, _ in pts], [v for _, v in pts])
    m = res["machine"]
    return common.plot_loglog(
        path,
        {"training throughput": series},
        xlabel="sequence length",
        ylabel="tokens / s",
        title=f"latte bench train: {where(m)}",
    )
