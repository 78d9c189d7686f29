"""Stages `calibrate` and `retrieval` of `python -m experiments.convert`:
RULER-style retrieval in held-out essays (latte.eval.retrieval;
docs/evaluation.md §7.2.1).

  calibrate  the ORIGINAL model alone, single pass key, every format of
             --retrieval-formats x context x depth x trial -> results/
             NAME-calibration: pass rate per (format, context); a format is
             usable when the original passes >= CALIBRATED of the keys
             beyond the window at every context up to 4K. Needs no converted
             model: the base of --config is converted untrained.
  retrieval  the compared models (--models) on the tasks of
             --retrieval-tasks in one format (--retrieval-format, the
             calibration's choice), the same prompts for every model ->
             results/NAME-retrieval, with each task's prompt lengths and
             needle distances beside its scores.

Trial i reads the essays in order i; the planted numbers come from
(context, depth, trial), so every model and format sees the same facts.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from pathlib import Path

import torch

from experiments.common.results import Sweep
from latte.eval import (
    FORMATS,
    MODELS,
    TRAINED,
    Reader,
    SharedPrefix,
    Subject,
    answer_prompt,
    as_model,
    label,
    length_summary,
    sinks_cell,
)
from latte.eval import RETRIEVAL_TASKS as TASKS

from .stages import checks

CAL_FORMATS = ("plain-qfirst", "chat-qfirst", "plain-qfirst-colon", "plain", "bare", "chat")  # as published
CAL_CONTEXTS = (1024, 2048, 4096)
CAL_TRIALS = 2
CALIBRATED = 0.8  # the bar: the original finds >= 80% beyond the window at 1K-4K
RETRIEVAL_CONTEXTS = (1024, 2048, 4096, 8192, 16384)
RETRIEVAL_DEPTHS = (0.1, 0.5, 0.8)
RETRIEVAL_TRIALS = 3


def base_subject(a) -> Subject:
    """The base model of --config converted untrained (its window and sinks
    from the config), with the base's own transformers tokenizer: what the
    calibration reads when no converted model is given."""
    from transformers import AutoTokenizer  # optional dependency (extra "hf")

    from latte.convert import convert_pretrained, resolve_base
    from latte.data import load_tokenizer
    from latte.models import transformers_tokenizer
    from latte.train import load_run_config

    cfg = load_run_config(a.config, [f"--{s}" for s in a.set])
    folder, gguf = resolve_base(cfg.base.path, cfg.base.gguf_file)
    model = convert_pretrained(cfg.base.path, cfg.conversion, gguf_file=cfg.base.gguf_file)
    if cfg.data.tokenizer == "base":
        hf = AutoTokenizer.from_pretrained(str(folder), **({"gguf_file": gguf} if gguf else {}))
    else:
        hf = transformers_tokenizer(load_tokenizer(cfg.data.tokenizer))
    return Subject(model, None, Path(folder), hf=hf)


def check_formats(names: list[str], reader: Reader, option: str) -> None:
    bad = [f for f in names if f not in FORMATS]
    if bad:
        raise ValueError(f"{option} {','.join(names)!r}: unknown {bad}; expected some of {','.join(FORMATS)}")
    if reader.frame is None and any(FORMATS[f].chat for f in names):
        raise ValueError(f"{option}: chat formats need a tokenizer with a chat template; this one has none")


def _run(a, subject: Subject, reader: Reader, cells: list[dict], sinks: int, name: str) -> list[dict]:
    """The cells answered in the order of their shared prefixes (one state
    fed once per model, format, task and trial)."""
    prompts = {id(c): reader.prompt(c) for c in cells}
    order = {f: i for i, f in enumerate(dict.fromkeys(c["format"] for c in cells))}  # as asked
    # trial by trial (every format's first trial first), each prefix fed once
    cells = sorted(
        cells,
        key=lambda c: (
            MODELS.index(c["model"]),
            c["trial"],
            order[c["format"]],
            c["task"],
            prompts[id(c)].shared,
            c["context"],
        ),
    )
    window = subject.model.converted[0].window_size
    shared: dict[str, SharedPrefix] = {}  # one state at a time: the model of the cell

    def cell_fn(cell):
        load0 = os.getloadavg()[0]
        prompt = reader.prompt(cell)
        with as_model(subject, cell["model"], sinks) as model:
            if cell["model"] not in shared:
                shared.clear()
                shared[cell["model"]] = SharedPrefix(model)
            shared[cell["model"]].model = model  # the same weights, entered again
            rec = answer_prompt(model, reader.decode, cell["task"], prompt, shared[cell["model"]])
        threads = torch.get_num_threads()
        return {**rec, "tokens": len(prompt.ids), "window": window, "load": round(load0, 2), "threads": threads}

    sweep = Sweep(
        Path(a.runs) / f"cells-{name}", cells, **checks(_inputs_used(a, cells), ("correct", "answer", "load"))
    )
    return sweep.run(cell_fn, desc=name)


def _inputs_used(a, cells: list[dict]):
    """`a` for the cells' protocol: the up-trained checkpoint counts as an input
    only when a cell scores a trained model (the original and the window
    models are the base's, whatever run was opened beside them)."""
    if any(c["model"] in TRAINED for c in cells):
        return a
    inputs = {k: v for k, v in getattr(a, "inputs", {}).items() if k != "converted"}
    return argparse.Namespace(**{**vars(a), "inputs": inputs})


def calibrate_stage(a, subject: Subject | None) -> list[dict]:
    subject = subject or base_subject(a)
    reader = Reader(subject)
    check_formats(a.retrieval_formats, reader, "--retrieval-formats")
    cells = [
        {"model": "original", "task": "passkey", "format": f, "context": c, "depth": d, "trial": i}
        for f in a.retrieval_formats
        for c in a.calibrate_contexts
        for d in a.retrieval_depths
        for i in range(a.calibrate_trials)
    ]
    return _run(a, subject, reader, cells, 0, "calibrate")


def retrieval_stage(a, subject: Subject, sinks: int) -> list[dict]:
    reader = Reader(subject)
    check_formats([a.retrieval_format], reader, "--retrieval-format")
    cells = [
        {
            "model": m,
            "task": t,
            "format": a.retrieval_format,
            "context": c,
            "depth": d,
            "trial": i,
            **sinks_cell(m, sinks),
        }
        for m in a.models
        for t in a.retrieval_tasks
        for c in a.retrieval_contexts
        for d in a.retrieval_depths
        for i in range(a.retrieval_trials)
    ]
    return _run(a, subject, reader, cells, sinks, "retrieval")


# --------------------------------------------------------------------------- reports


def _rate(cs: list[dict]) -> str:
    k, n = sum(c["correct"] for c in cs), len(cs)
    return f"{k}/{n} ({100 * k / n:.0f}%)" if n else "-"


def _beyond(cs: list[dict]) -> list[dict]:
    return [c for c in cs if c["distance"] > c["window"]]


def calibration_records(cells: list[dict]) -> list[dict]:
    """One record per (format, context): keys found beyond the window."""
    out = []
    for f in dict.fromkeys(c["format"] for c in cells):
        for ctx in sorted({c["context"] for c in cells if c["format"] == f}):
            cs = [c for c in cells if c["format"] == f and c["context"] == ctx]
            far = _beyond(cs)
            k = sum(c["correct"] for c in far)
            out.append(
                {
                    "format": f,
                    "context": ctx,
                    "trials": len(cs),
                    "beyond_window": len(far),
                    "found_beyond": k,
                    "pass_rate": k / len(far) if far else float("nan"),
                    "found_all": sum(c["correct"] for c in cs),
                    "min_distance": min(c["distance"] for c in cs),
                    "wall_s": round(sum(c["wall_s"] for c in cs), 1),
                    "max_load": max(c["load"] for c in cs),
                }
            )
    return out


def calibrated_formats(records: list[dict], up_to: int = 4096) -> list[str]:
    """The formats whose pass rate beyond the window is >= CALIBRATED at
    every calibrated context up to `up_to` tokens."""
    ok = []
    for f in dict.fromkeys(r["format"] for r in records):
        rs = [r for r in records if r["format"] == f and r["context"] <= up_to]
        if rs and all(r["beyond_window"] and r["pass_rate"] >= CALIBRATED for r in rs):
            ok.append(f)
    return ok


def calibration_tables(records: list[dict], cells: list[dict]) -> str:
    contexts = sorted({r["context"] for r in records})
    by = {(r["format"], r["context"]): r for r in records}
    lines = [
        "The original model, single pass key beyond the window (found / needles more than the window from "
        "the end of the prompt), by format and context:",
        "",
        "| format | chat template | question first | instruction | " + " | ".join(f"{c:,}" for c in contexts) + " |",
        "|---|---|---|---|" + "---|" * len(contexts),
    ]
    for f in dict.fromkeys(r["format"] for r in records):
        fmt = FORMATS[f]
        row = [
            f"{by[(f, c)]['found_beyond']}/{by[(f, c)]['beyond_window']} ({100 * by[(f, c)]['pass_rate']:.0f}%)"
            if (f, c) in by and by[(f, c)]["beyond_window"]
            else "-"
            for c in contexts
        ]
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| {f} | {yes[fmt.chat]} | {yes[fmt.question_first]} | {yes[fmt.instruction]} | " + " | ".join(row) + " |"
        )
    ok = calibrated_formats(records)
    lines += ["", length_table(cells), ""]
    lines.append(
        f"**Calibrated formats** (>= {100 * CALIBRATED:.0f}% at every context up to 4K): "
        + (", ".join(f"`{f}`" for f in ok) if ok else "**none**: no format tried here is one the original passes")
    )
    return "\n".join(lines)


def length_table(cells: list[dict]) -> str:
    """Prompt lengths and needle distances per task (and format)."""
    lines = [
        "Prompt lengths (tokens beyond the window) and needle distances (tokens from the nearest needle to "
        "the end), per task and format:",
        "",
        "| task | format | prompts | tokens (min-max) | beyond the window (median, max) | longer than the window | "
        "needle distance (min, median) |",
        "|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["task"], c["format"]), []).append(c)
    for (t, f), cs in groups.items():
        s = length_summary([c["tokens"] for c in cs if c["model"] == cs[0]["model"]], cs[0]["window"])
        d = sorted(c["distance"] for c in cs)
        lines.append(
            f"| {t} | {f} | {s['prompts']} | {s['tokens_min']:,}-{s['tokens_max']:,} | "
            f"{s['beyond_window_median']:,.0f}, {s['beyond_window_max']:,} | {100 * s['longer_than_window']:.0f}% | "
            f"{d[0]:,}, {d[len(d) // 2]:,} |"
        )
    return "\n".join(lines)


def _likelihood(far: list[dict]) -> dict:
    """Over the prompts beyond the window, when every one of them recorded
    them (cells written before, and multivalue, have none): the asked
    value's and the decoy's mean NLL (nats per token, teacher-forced), their
    mean difference (decoy - answer: what the state holds about the asked
    value beyond a prior over numbers) and the prompts where the asked
    value is the likelier."""
    if not far or any("decoy_nll" not in c for c in far):
        return {}
    return {
        "answer_nll": round(statistics.fmean(c["answer_nll"] for c in far), 4),
        "decoy_nll": round(statistics.fmean(c["decoy_nll"] for c in far), 4),
        "nll_gap": round(statistics.fmean(c["decoy_nll"] - c["answer_nll"] for c in far), 4),
        "answer_likelier": sum(c["answer_nll"] < c["decoy_nll"] for c in far),
    }


def retrieval_records(cells: list[dict]) -> list[dict]:
    """One record per (task, model, context): found, recall, beyond the window."""
    out = []
    keys = sorted(
        {(c["task"], c["model"], c["context"]) for c in cells},
        key=lambda k: (TASKS.index(k[0]), MODELS.index(k[1]), k[2]),
    )
    for t, m, ctx in keys:
        cs = [c for c in cells if (c["task"], c["model"], c["context"]) == (t, m, ctx)]
        far = _beyond(cs)
        k = sum(c["correct"] for c in far)
        out.append(
            {
                "task": t,
                "model": m,
                "context": ctx,
                "format": cs[0]["format"],
                "trials": len(cs),
                "beyond_window": len(far),
                "found_beyond": k,
                "accuracy": k / len(far) if far else float("nan"),
                "accuracy_stderr": math.sqrt(k / len(far) * (1 - k / len(far)) / len(far)) if far else float("nan"),
                "recall": sum(c["recall"] for c in far) / len(far) if far else float("nan"),
                **_likelihood(far),
                "wall_s": round(sum(c["wall_s"] for c in cs), 1),
                "max_load": max(c["load"] for c in cs),
                **({"sinks": cs[0]["sinks"]} if "sinks" in cs[0] else {}),
            }
        )
    return out


def retrieval_tables(records: list[dict], cells: list[dict], sinks: int | None) -> str:
    lines = []
    for t in dict.fromkeys(r["task"] for r in records):
        rs = [r for r in records if r["task"] == t]
        models = [m for m in MODELS if any(r["model"] == m for r in rs)]
        by = {(r["model"], r["context"]): r for r in rs}
        lines += [
            f"**{t}**: found / prompts whose nearest needle lies beyond the window"
            + (" (every value named; mean recall in brackets)" if t == "multivalue" else "")
            + ":",
            "",
            "| context | " + " | ".join(label(m, sinks) for m in models) + " |",
            "|---|" + "---|" * len(models),
        ]
        for ctx in sorted({r["context"] for r in rs}):
            row = []
            for m in models:
                r = by.get((m, ctx))
                txt = f"{r['found_beyond']}/{r['beyond_window']}" if r and r["beyond_window"] else "-"
                if r and t == "multivalue" and r["beyond_window"]:
                    txt += f" ({r['recall']:.2f})"
                row.append(txt)
            lines.append(f"| {ctx:,} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines) + "\n" + length_table(cells)


# --------------------------------------------------------------------------- options

DEFAULT_FORMAT = "plain-qfirst-colon"  # the one calibrated format (results/convert-calibration)
RETRIEVAL_FULL = {  # defaults --quick changes (convert.FULL, convert.QUICK)
    "retrieval_formats": ",".join(CAL_FORMATS),
    "calibrate_contexts": ",".join(map(str, CAL_CONTEXTS)),
    "retrieval_contexts": ",".join(map(str, RETRIEVAL_CONTEXTS)),
    "retrieval_depths": ",".join(map(str, RETRIEVAL_DEPTHS)),
    "retrieval_format": DEFAULT_FORMAT,
    "calibrate_trials": CAL_TRIALS,
    "retrieval_trials": RETRIEVAL_TRIALS,
}
RETRIEVAL_QUICK = {
    "retrieval_formats": "bare,plain,plain-qfirst",
    "calibrate_contexts": "192,256",
    "retrieval_contexts": "400,512",
    "retrieval_depths": "0.1,0.5",
    "retrieval_format": "plain",
    "calibrate_trials": 1,
    "retrieval_trials": 1,
}


def add_retrieval_args(p) -> None:
    from latte.arguments import checked, float_list, int_at_least, int_list, name_list

    g = p.add_argument_group("calibrate and retrieval stages (experiments/convert/retrieval.py)")
    g.add_argument(
        "--retrieval-formats",
        default=None,
        type=checked(name_list(FORMATS)),
        help=f"formats the calibrate stage tries ({RETRIEVAL_FULL['retrieval_formats']})",
    )
    g.add_argument(
        "--retrieval-format",
        default=None,
        choices=list(FORMATS),
        help=f"the format of the retrieval stage ({DEFAULT_FORMAT}: the calibration's choice)",
    )
    g.add_argument("--retrieval-tasks", default=",".join(TASKS), type=checked(name_list(TASKS)), help="retrieval tasks")
    g.add_argument("--calibrate-contexts", default=None, type=checked(int_list(64)), help="calibration contexts")
    g.add_argument("--calibrate-trials", default=None, type=int_at_least(1), help=f"haystack orders ({CAL_TRIALS})")
    g.add_argument("--retrieval-contexts", default=None, type=checked(int_list(64)), help="retrieval contexts")
    g.add_argument(
        "--retrieval-depths",
        default=None,
        type=checked(float_list("a fraction in [0, 1]", lambda x: 0 <= x <= 1)),
        help="depths of the asked needle (both stages)",
    )
    g.add_argument(
        "--retrieval-trials", default=None, type=int_at_least(1), help=f"haystack orders ({RETRIEVAL_TRIALS})"
    )


def parse_retrieval_args(a) -> None:
    """The list options as lists (after the --quick/full defaults are set)."""
    a.retrieval_formats = a.retrieval_formats.split(",")
    a.retrieval_tasks = a.retrieval_tasks.split(",")
    a.calibrate_contexts = sorted({int(x) for x in a.calibrate_contexts.split(",")})
    a.retrieval_contexts = sorted({int(x) for x in a.retrieval_contexts.split(",")})
    a.retrieval_depths = sorted({float(x) for x in a.retrieval_depths.split(",")})


def retrieval_report(a, argv, started, calibration: list[dict] | None, retrieval: list[dict] | None, sinks) -> None:
    from experiments.common.results import provenance, write_results

    out = Path(a.out)
    run = provenance("convert", argv, started, threads=a.threads)

    def spent(cells: list[dict]) -> str:
        wall, cpu = sum(c["wall_s"] for c in cells), sum(c["cpu_s"] for c in cells)
        loads = [c["load"] for c in cells]
        return (
            f"The {len(cells)} prompts took {wall:,.0f} s of wall time ({cpu:,.0f} s of CPU) in all, on "
            f"{a.threads} thread(s) beside other jobs (1-min load average {min(loads):.1f} to {max(loads):.1f} "
            "at their starts); a rerun reuses finished prompts, so the wall time above is this invocation's. "
        )

    if calibration:
        records = calibration_records(calibration)
        md = (
            f"Retrieval formats calibrated on the original model: the single pass key (latte.eval.retrieval) at "
            f"depths {', '.join(f'{100 * d:.0f}%' for d in a.retrieval_depths)}, {a.calibrate_trials} trial(s) "
            "each (trial i reads the held-out essays in order i); greedy decoding; found = the first number "
            "decoded is the key. " + spent(calibration) + "\n\n" + calibration_tables(records, calibration)
        )
        write_results(out / f"{a.name}-calibration", f"{a.name}-calibration", records, md, run)
    if retrieval:
        records = retrieval_records(retrieval)
        md = (
            f"RULER-style retrieval in held-out essays, format `{a.retrieval_format}`, asked needle at depths "
            f"{', '.join(f'{100 * d:.0f}%' for d in a.retrieval_depths)}, {a.retrieval_trials} trial(s) per cell; "
            "only prompts whose nearest needle lies more than the window from the end are counted. "
            + spent(retrieval)
            + "\n\n"
            + retrieval_tables(records, retrieval, sinks)
        )
        write_results(out / f"{a.name}-retrieval", f"{a.name}-retrieval", records, md, run)
