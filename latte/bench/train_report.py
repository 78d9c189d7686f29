"""The report of `latte bench train` (train.py): markdown table, ratios from
the same run (each variant over softmax, eager over compiled), plot."""

from __future__ import annotations

from latte import reporting

from . import common, step_profile

_COMPILED = " compiled"


def step_ratios(res: dict) -> dict:
    """Per sequence, each variant's step time over softmax's (eager over
    eager, compiled over compiled) and, with --compile, eager over compiled."""
    cell = {(r["label"], r["seq"]): r["median_ms"] for r in res["results"] if not r.get("skipped")}
    out = {"over_softmax": {}, "eager_over_compiled": {}}
    for (label, seq), ms in cell.items():
        compiled = label.endswith(_COMPILED)
        base = cell.get(("softmax" + (_COMPILED if compiled else ""), seq))
        if base:
            out["over_softmax"].setdefault(str(seq), {})[label] = ms / base
        eager = label[: -len(_COMPILED)]
        if compiled and (eager, seq) in cell:
            out["eager_over_compiled"].setdefault(str(seq), {})[eager] = cell[(eager, seq)] / ms
    return out


def _ratio_table(ratios: dict, seqs: list, labels: list) -> list[str]:
    if not ratios["over_softmax"]:
        return []
    hdr = ["mixer"] + [f"seq {s}: step / softmax's" for s in seqs]
    if ratios["eager_over_compiled"]:
        hdr += [f"seq {s}: eager / compiled" for s in seqs]
    rows = []
    for m in labels:
        row = [m] + [ratios["over_softmax"].get(str(s), {}).get(m, "-") for s in seqs]
        if ratios["eager_over_compiled"]:
            row += [
                "" if m.endswith(_COMPILED) else ratios["eager_over_compiled"].get(str(s), {}).get(m, "-") for s in seqs
            ]
        rows.append(row)
    return [
        "",
        "Ratios from the same run (step time over softmax's, eager with eager and compiled with "
        "compiled; eager over compiled step time per mixer):",
        "",
        reporting.md_table(hdr, [[c if isinstance(c, str) else f"{c:.2f}" for c in r] for r in rows]),
    ]


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
    (on a GPU): the names of the files and of the README section."""
    return (
        "train"
        + ("-sweep" if cfg.get("preset") == "sweep" else "")
        + ("-compiled" if cfg.get("compile") else "")
        + ("" if cfg.get("device", "cpu") == "cpu" else f"-{cfg['device']}")
    )


def _size(cfg: dict) -> str:
    if cfg["quick"]:
        return "quick, tiny model"
    return "research-sweep size" if cfg.get("preset") == "sweep" else "Table 6 preset"


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
    out += _ratio_table(res.get("ratios") or step_ratios(res), cfg["seqs"], cfg["variants"])
    notes = _ratio_notes(cell, cfg["seqs"])
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
