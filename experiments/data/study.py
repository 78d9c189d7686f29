"""`python -m experiments.data`: which up-training text makes a converted
SmolLM2 best on text nobody trained on (docs/conversion.md §9), and what more
budget buys. Two stages, each a resumable sweep:

  pilots   one `latte convert` run per data mix (--mixes) with the frozen
           pilot config (latte/configs/convert/pilot-smollm2.yaml), every
           one with the same token budget (--pilot-steps x its batch), then
           the held-out perplexity of each, next to the untrained models
           ("original": the pretrained attention; "swa": the converted model
           before up-training, as_sliding_window()) -> results/convert-data
  curve    the held-out perplexity of every kept checkpoint of one long run
           (--curve-run) against the training tokens it had seen; with
           --curve-tasks-runs also the zero-shot task average of the
           untrained model, the last checkpoint and --curve-tasks-steps
           (`latte eval --suite tasks`, its cells in that folder)

Held-out text (never in any training source; tests/data/test_heldout.py):
latte.data.heldout's eval_essays() and eval_plays(), read as windows
of --eval-len tokens from the start of each document (--eval-windows per
document), scored by one forward each.

    python -m experiments.data --quick                        # tiny stand-in model (the test)
    python -m experiments.data --readme results/README.md     # the pilots
    python -m experiments.data --stages curve --curve-run runs/convert-smollm2 --curve-every 5
    python -m experiments.data --stages curve --curve-run runs/convert-smollm2 --curve-every 10 \
        --curve-tasks-runs runs/convert-eval --curve-tasks-steps 100,390
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from experiments.common.cells import INPUTS, digest_or_missing
from experiments.common.results import Sweep, claim_results, claim_work, convert_run, provenance, write_results
from experiments.convert.stages import TASK_EXAMPLES, checks
from experiments.convert.study import experiment_base, quick_setup
from latte.arguments import int_at_least
from latte.data import eval_essays, eval_plays, load_documents, split_documents
from latte.eval import Request, evaluate, open_subject
from latte.train import run_wall_time, step_dirs

from .report import report

MIXES = ("shakespeare", "shakespeare+essays+bible-web", "shakespeare+essays+bible-web+retrieval")
CORPORA = ("essays", "plays")
SCORES = tuple(f"{c}_ppl" for c in CORPORA)  # what a finished cell holds


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.data", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--stages", default="pilots", help="comma-separated: pilots, curve")
    p.add_argument("--mixes", default=",".join(MIXES), help="data.source of each pilot, comma-separated")
    p.add_argument("--config", default="convert/pilot-smollm2", help="latte convert config of every pilot")
    p.add_argument("--set", action="append", default=[], help="extra override for every pilot (section.field=value)")
    p.add_argument("--pilot-steps", type=int_at_least(1), default=24, help="optimizer steps of every pilot")
    p.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the untrained models' cells (for parallel workers: one --mixes each, then a last run with all)",
    )
    p.add_argument("--curve-run", default=None, help="run folder whose checkpoints the curve stage scores")
    p.add_argument(
        "--curve-every", type=int_at_least(1), default=1, help="score every Nth kept checkpoint (and always the last)"
    )
    p.add_argument(
        "--curve-tasks-runs",
        default=None,
        help="also score the zero-shot tasks of the curve's checkpoints (latte eval --suite tasks), each one's "
        "results and cells in FOLDER/tasks-STEP (done cells are reused)",
    )
    p.add_argument(
        "--curve-tasks-steps",
        default="",
        help="comma-separated steps of the checkpoints the curve scores whose tasks are scored too, besides "
        "the untrained model and the last checkpoint (always)",
    )
    p.add_argument("--eval-len", type=int_at_least(1), default=1024)
    p.add_argument("--eval-windows", type=int_at_least(1), default=1, help="windows per held-out document")
    p.add_argument("--runs", default="runs/convert-data")
    p.add_argument("--out", default="results/convert-data")
    p.add_argument("--threads", type=int_at_least(1), default=1)
    p.add_argument("--readme", default=None)
    p.add_argument("--quick", action="store_true", help="a tiny stand-in model and corpus, seconds")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    started = time.time()
    stages = [s for s in a.stages.split(",") if s]
    if not stages or set(stages) - {"pilots", "curve"}:
        raise ValueError(f"--stages {a.stages!r}: expected a comma-separated subset of pilots, curve")
    if "curve" in stages and not a.curve_run:
        raise ValueError("--stages curve needs --curve-run RUN_DIR (the long up-training run)")
    claim_work(a.runs, "convert-data", "--runs", create=True)  # before any work: the one write rule, as --out
    torch.set_num_threads(a.threads)
    if a.quick:
        quick = argparse.Namespace(runs=a.runs, set=list(a.set))
        quick_setup(quick)
        a.set = [s for s in quick.set if not s.startswith("data.source=")]
        a.mixes, a.eval_len, a.pilot_steps = "pydoc", 48, 2
    claim_results(a.out, "convert-data", create=False)  # before any work: the one write rule (latte/guard.py)
    a.inputs = {"base": experiment_base(a)}  # every pilot cell records the base's sha256 (cells.py)
    pilots = pilots_stage(a) if "pilots" in stages else []
    curve = curve_stage(a) if "curve" in stages else []
    claim_results(a.out, "convert-data")
    tables, images = report(a, pilots, curve)
    run = provenance("convert-data", argv, started, threads=a.threads)
    run["machine"]["threads"] = a.threads
    write_results(a.out, "convert-data", pilots + curve, tables, run, readme=a.readme, images=images)
    print(tables)
    return 0


# --------------------------------------------------------------------------- held-out text


def held_out_documents(
    tokenizer, eval_len: int, windows: int, *, quick: bool = False, bos: Sequence[int] = ()
) -> dict[str, list]:
    """corpus -> [(document name, ids[windows * (eval_len + 1)])]: the
    beginnings of the held-out essays and plays (quick: pydoc stand-ins),
    each after `bos` (the model's beginning-of-sequence token, Subject.bos,
    where its tokenizer adds one: counted in the windows' length)."""
    if quick:
        _, val = split_documents(load_documents("pydoc"), val_fraction=0.1, seed=0)
        sets = {"essays": val[: len(val) // 2], "plays": val[len(val) // 2 :]}
    else:
        sets = {"essays": eval_essays(), "plays": eval_plays()}
    need = windows * (eval_len + 1)
    out = {}
    for corpus, docs in sets.items():
        items = [(d.name, torch.tensor((list(bos) + tokenizer.encode(d.text[: need * 8]))[:need])) for d in docs]
        out[corpus] = [(n, ids) for n, ids in items if len(ids) > eval_len // 2]
    return out


@torch.no_grad()
def held_out_ppl(model, docs: dict[str, list], eval_len: int) -> dict:
    """Perplexity per corpus over the windows of `docs` (one forward per
    window, no cache), with the token counts and the wall time."""
    rec, t0 = {}, time.perf_counter()
    for corpus, items in docs.items():
        total, count = 0.0, 0
        for _, ids in items:
            for w in range(0, len(ids) - 1, eval_len + 1):
                chunk = ids[w : w + eval_len + 1]
                if len(chunk) < 2:
                    continue
                logits = model(chunk[None, :-1], use_cache=False).logits[0].float()
                nll = torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum")
                total, count = total + float(nll), count + len(chunk) - 1
        rec[f"{corpus}_ppl"] = round(float(torch.exp(torch.tensor(total / max(count, 1)))), 3)
        rec[f"{corpus}_tokens"] = count
    rec["eval_wall_s"] = round(time.perf_counter() - t0, 1)
    return rec


def _score(run: Path, a, which: str = "converted") -> dict:
    subject = open_subject(run)
    trained, model = subject.run, subject.model  # the run, the converted model
    docs = held_out_documents(subject.tokenizer, a.eval_len, a.eval_windows, quick=a.quick, bos=subject.bos)
    state = json.loads((trained.checkpoint / "trainer_state.json").read_text())
    if which == "original":
        with model.as_original() as original:
            rec = held_out_ppl(original, docs, a.eval_len)
    elif which == "swa":
        with model.as_sliding_window():
            rec = held_out_ppl(model, docs, a.eval_len)
    else:
        rec = held_out_ppl(model, docs, a.eval_len)
    trained_tokens = 0 if which != "converted" else int(state.get("tokens_seen", 0))
    return {**rec, "step": trained.step if which == "converted" else 0, "train_tokens": trained_tokens}


# --------------------------------------------------------------------------- stages


def pilots_stage(a) -> list[dict]:
    mixes = [m for m in a.mixes.split(",") if m]
    if not mixes:
        raise ValueError("--mixes: expected at least one data source")
    cells = [{"stage": "pilot", "mix": m, "steps": a.pilot_steps} for m in mixes]
    if not a.no_baselines:
        cells += [{"stage": "pilot", "mix": f"none ({w})", "steps": 0} for w in ("original", "swa")]

    def extra(c: dict) -> dict:  # a baseline scores the first mix's run: its checkpoint is an input
        run = {INPUTS: {"run": digest_or_missing(_run_dir(a, mixes[0]))}} if c["mix"].startswith("none") else {}
        return {**_scored_on(a), **run}

    sweep = Sweep(Path(a.runs) / "cells-pilots", cells, **checks(a, SCORES, extra=extra))
    return sweep.run(lambda c: _pilot_cell(c, a, mixes[0]), desc="pilots")


def _scored_on(a) -> dict:
    """What a cell's scores depend on besides the cell: the held-out windows
    (pilots add the config and --set overrides they trained with, through
    experiments/convert/stages.py: checks; cells.py's one rule)."""
    return {"eval_len": a.eval_len, "eval_windows": a.eval_windows, "quick": a.quick}


def _pilot_cell(cell: dict, a, first_mix: str) -> dict:
    load0, t0 = os.getloadavg()[0], time.time()
    if cell["mix"].startswith("none"):
        which = cell["mix"][len("none (") : -1]
        return {**_score(_run_dir(a, first_mix), a, which), "load_start": round(load0, 2)}
    run = _run_dir(a, cell["mix"])
    sets = [f"data.source={cell['mix']}", f"train.steps={cell['steps']}", "train.time_budget_minutes=null", *a.set]
    s = convert_run(a.config, run, sets, a.threads)
    return {
        **_score(run, a),
        "val_ppl": s["val_ppl"],
        "train_wall_s": round(run_wall_time(run), 3),
        "threads": a.threads,
        "load_start": round(load0, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "cell_wall_s": round(time.time() - t0, 1),
    }


def _run_dir(a, mix: str) -> Path:
    return Path(a.runs) / "pilots" / mix.replace("+", "_").replace("/", "_")


def curve_stage(a) -> list[dict]:
    run = Path(a.curve_run)
    steps = [p for _, p in sorted(step_dirs(run))]
    if not steps:
        raise ValueError(f"--curve-run {run}: no step folders")
    steps = [p for i, p in enumerate(steps) if (i + 1) % a.curve_every == 0 or i == len(steps) - 1]
    cells = [{"stage": "curve", "run": run.name, "checkpoint": "none (swa)"}]
    cells += [{"stage": "curve", "run": run.name, "checkpoint": p.name} for p in steps]
    by_name = {p.name: p for p in steps}

    def cell_fn(cell):
        load0 = os.getloadavg()[0]
        if cell["checkpoint"].startswith("none"):
            return {**_score(steps[0], a, "swa"), "load_start": round(load0, 2)}
        return {**_score(by_name[cell["checkpoint"]], a), "load_start": round(load0, 2)}

    def protocol(cell: dict) -> dict:  # the checkpoint scored is an input (its manifest's sha256)
        point = steps[0] if cell["checkpoint"].startswith("none") else by_name[cell["checkpoint"]]
        return {**_scored_on(a), INPUTS: {"checkpoint": digest_or_missing(point)}}

    sweep = Sweep(Path(a.runs) / "cells-curve", cells, protocol=protocol, fields=SCORES, folder_flag="--runs")
    rows = sweep.run(cell_fn, desc="curve")
    if a.curve_tasks_runs:
        chosen = {f"step-{s:08d}" for s in _steps(a.curve_tasks_steps)}
        missing = sorted(chosen - set(by_name))
        if missing:
            raise ValueError(
                f"--curve-tasks-steps {a.curve_tasks_steps}: {', '.join(missing)} not among the checkpoints "
                f"the curve scores ({', '.join(by_name)}; see --curve-every)"
            )
        for i, row in enumerate(rows):
            if i in (0, len(rows) - 1) or row["checkpoint"] in chosen:
                row["task_avg"] = curve_task_average(a, steps[0] if i == 0 else by_name[row["checkpoint"]], i == 0)
    return rows


def _steps(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--curve-tasks-steps {text!r}: expected comma-separated step numbers") from None


def curve_task_average(a, step: Path, untrained: bool) -> float:
    """The zero-shot task average (latte eval --suite tasks: every task's
    score, 100 examples each, 4 with --quick) of the converted model at
    checkpoint `step`, or, `untrained`, of the training-free window + sinks
    model (`--against window`: the run's own sinks, else 4), into
    --curve-tasks-runs/tasks-STEP, whose finished cells are reused."""
    request = Request(
        model=str(step),
        suites=("tasks",),
        against=("window",) if untrained else (),
        examples=4 if a.quick else TASK_EXAMPLES,
        out=str(Path(a.curve_tasks_runs) / f"tasks-{step.name}"),  # not step-N: that names a run's checkpoint
        command=f"python -m experiments.data --curve-tasks-runs {a.curve_tasks_runs} (curve of {step.parent})",
    )
    records = json.loads((evaluate(request) / "results.json").read_text())["records"]
    scores = [r["score"] for r in records if r["model"] == ("window" if untrained else "converted")]
    return sum(scores) / len(scores)
