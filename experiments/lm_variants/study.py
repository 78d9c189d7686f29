"""`python -m experiments.lm_variants`: the paper's per-variant language-model table
(Table 1, scaled), context extrapolation and latent utilisation, from real
`latte train` / `latte eval` runs.

Seven variants, one recipe: the shipped configs `latte/configs/mixers/*.yaml`
(the tiny CPU recipe: Shakespeare, an 4096-token BPE trained on the training
plays, dim 192, 4 layers, 4 heads, 64 latents, window 64 = a quarter of the
training length 256 as the paper's 128 of 512, 300 steps of 16 x 256 tokens)
differing only in the token mixer (and Latte's qk mixer), each trained with
3 seeds. Three stages, each a resumable sweep over (variant, seed):

  train          python -m latte train --config mixers/NAME --train.seed=S --train.run_dir=RUNS/NAME/seed-S
                 -> results/lm_variants: val_ppl, tokens_per_s, wall time
  extrapolation  python -m latte eval --run RUN --lengths 1,2,4,8,16
                 -> results/lm_variants/extrapolation: ppl at 1x..16x the training length, by position bucket
  latents        python -m latte eval --run RUN --latents (latte and macchiato only)
                 -> results/lm_variants/latents: entropy, effective latents, used fraction, p(window|t)

A killed sweep continues where it stopped: finished stages are not redone,
and an interrupted `latte train` resumes from its last checkpoint. `--plan`
picks what runs (experiments/lm_variants/plans.py): `table1` (the above, the
default), `long` (ten times the tokens, one seed, whole-split validation at
steps 300, 1,000, 2,000, 3,000, plus latte with 256 latents) and
`macchiato-vs-swa` (training length 1,024 with window 64).

    python -m experiments.lm_variants --quick          # a tiny version of every stage (the end-to-end test)
    python -m experiments.lm_variants --readme results/README.md
    python -m experiments.lm_variants --plan long      # results/lm_variants_long (hours per variant)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from experiments.common.cells import (
    INPUTS,
    digest_or_missing,
    finished_summary,
    resolved_config,
    run_protocol,
    set_aside_changed_run,
)
from experiments.common.results import (
    Sweep,
    check_readme,
    claim_results,
    claim_work,
    provenance,
    run_latte,
    write_results,
)
from latte.arguments import checked, int_at_least, int_list, name_list
from latte.train import load_run_config, run_wall_time

from .curves import curve_table
from .plans import PLANS, VARIANT_SETS, VARIANTS, stage_outputs
from .report import extrapolation_report, latents_report, variants_report

STAGES = ("train", "extrapolation", "latents")
# --quick: every stage on a model of a few thousand parameters, in seconds.
QUICK_SET = [
    "data.source=pydoc",
    "data.vocab_size=320",
    "data.seq_len=32",
    "model.dim=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.latents_per_head=4",
    "model.window_size=8",
    "model.chunk_size=8",
    "train.steps=2",
    "optim.warmup_steps=1",
    "train.global_batch_size=4",
    "train.eval_batches=1",
    "train.save_every=0",
    "train.sample_tokens=0",
    "train.log_every=1",
]


def train_args(name: str, seed: int, run_dir: Path, threads: int, sets: list[str]) -> list[str]:
    config = VARIANTS[name][0]
    return [
        "train",
        "--config",
        config,
        f"--train.seed={seed}",
        f"--train.run_dir={run_dir}",
        f"--train.num_threads={threads}",
        "--train.tensorboard=false",
        *[f"--{s}" for s in (*sets, *VARIANT_SETS.get(name, ()))],
    ]


def run_sets(cell: dict, sets: list[str]) -> list[str]:
    """Every override of a training cell's run (the seed included)."""
    return [*sets, *VARIANT_SETS.get(cell["variant"], ()), f"train.seed={cell['seed']}"]


def train_cell(cell: dict, a: argparse.Namespace, sets: list[str]) -> dict:
    """Trains (or resumes) the cell's run. A run folder of another
    configuration is set aside and started over; a run that already reached
    its last step (a sweep killed before the cell was written) is read, not
    trained again (cells.py)."""
    run_dir = Path(a.runs) / cell["variant"] / f"seed-{cell['seed']}"
    config = VARIANTS[cell["variant"]][0]
    set_aside_changed_run(run_dir, config, run_sets(cell, sets))
    resumed = any(run_dir.glob("step-*"))
    load0, t0 = os.getloadavg()[0], time.time()
    args = train_args(cell["variant"], cell["seed"], run_dir, a.threads, sets)
    steps = resolved_config(config, run_sets(cell, sets))["train.steps"]
    if finished_summary(run_dir, steps) is None:
        run_latte(args, run_dir.parent / f"seed-{cell['seed']}.log", a.threads)
    s = json.loads((run_dir / "summary.json").read_text())
    _, mixer, qk = VARIANTS[cell["variant"]]
    return {
        "mixer": mixer,
        "qk_mixer": qk,
        "val_ppl": s["val_ppl"],
        "val_loss": s["val_loss"],
        "unigram_ppl": s["unigram_ppl"],
        "tokens_per_s": s["train_tokens_per_s"],
        "wall_s": run_wall_time(run_dir),
        "steps": s["step"],
        "tokens_seen": s["tokens_seen"],
        "train_tokens": s.get("train_tokens"),
        "parameters": s["parameters"],
        "val_tokens": s["val_tokens"],
        "resumed": resumed,
        "loadavg_start": round(load0, 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
        "command": "latte " + " ".join(args),
        "process_s": round(time.time() - t0, 1),
    }


def _whole_run_wall(record: dict, runs: Path) -> dict:
    """A train record's wall time over every process of its run, read again
    from the run folder when it is there: cells written before summary.json
    counted every process recorded the last process's alone."""
    wall = run_wall_time(runs / record["variant"] / f"seed-{record['seed']}")
    return record if wall is None else {**record, "wall_s": wall}


def eval_cell(cell: dict, a: argparse.Namespace, stage: str) -> dict:
    run_dir = Path(a.runs) / cell["variant"] / f"seed-{cell['seed']}"
    out = run_dir / ("eval.json" if stage == "extrapolation" else "latents.json")
    args = ["eval", "--run", str(run_dir), "--max-tokens", str(a.eval_tokens), "--out", str(out)]  # 0: all
    args += ["--lengths", a.lengths] if stage == "extrapolation" else ["--latents"]
    t0, load0 = time.time(), os.getloadavg()[0]
    run_latte(args, run_dir.parent / f"seed-{cell['seed']}.log", a.threads)
    _, mixer, qk = VARIANTS[cell["variant"]]
    report = json.loads(out.read_text())
    return {
        "mixer": mixer,
        "qk_mixer": qk,
        "report": report,
        "command": "latte " + " ".join(args),
        "seconds": round(time.time() - t0, 1),
        "loadavg_start": round(load0, 2),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.lm_variants", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--plan", default="table1", choices=list(PLANS), help="what to run (experiments/lm_variants/plans.py)"
    )
    p.add_argument("--quick", action="store_true", help="tiny models, 2 steps: the end-to-end test")
    p.add_argument(
        "--variants",
        default=None,
        type=checked(name_list(VARIANTS)),
        help=f"among {', '.join(VARIANTS)} (default: the plan's)",
    )
    p.add_argument("--seeds", default=None, type=checked(int_list(low=0)), help="default: the plan's (table1: 0,1,2)")
    p.add_argument(
        "--stages", default=",".join(STAGES), type=checked(name_list(STAGES)), help=f"among {', '.join(STAGES)}"
    )
    p.add_argument(
        "--lengths",
        default=None,
        type=checked(int_list(low=1)),
        help="extrapolation: multiples of the training length (plan's)",
    )
    p.add_argument(
        "--eval-tokens",
        type=int_at_least(0, " (0 = the whole validation split)"),
        default=None,
        help="validation tokens per evaluation, 0 = the whole split (default: the plan's, quick 512)",
    )
    p.add_argument("--runs", default=None, help="run folders (default: the plan's, e.g. runs/lm_variants)")
    p.add_argument(
        "--results",
        default=None,
        help="folder holding the plan's result folders (default results, quick results/quick)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="a config override for every training run (repeatable, after the plan's), e.g. train.steps=100",
    )
    p.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads of each run")
    p.add_argument(
        "--report-only", action="store_true", help="write the results of the finished cells of each stage, run none"
    )
    p.add_argument(
        "--readme",
        default=None,
        help="replace the sections of the plan's results (e.g. results:lm_variants, results:lm_variants-extrapolation, "
        "results:lm_variants-latents) in this markdown file (the repository's: results/README.md)",
    )
    return _with_plan_defaults(p.parse_args(argv))


def _with_plan_defaults(a: argparse.Namespace) -> argparse.Namespace:
    """Fills the options left out with the plan's (or --quick's) values (parse_args)."""
    plan = a.plan_ = PLANS[a.plan]
    a.variants = a.variants or ",".join(plan.variants)
    a.seeds = a.seeds or plan.seeds
    quick_runs = f"{plan.runs}-quick"
    a.runs = a.runs or (quick_runs if a.quick else plan.runs)
    a.results = Path(a.results or ("results/quick" if a.quick else "results"))
    if a.eval_tokens is None:
        a.eval_tokens = 512 if a.quick else plan.eval_tokens
    a.lengths = a.lengths or ("1,2" if a.quick else plan.lengths)
    return a


def train_protocol(cell: dict, sets: list[str]) -> dict:
    """What a training cell's result depends on (cells.py): its config, the
    resolved run config and the sha256 of the files it reads."""
    return run_protocol(VARIANTS[cell["variant"]][0], run_sets(cell, sets))


def eval_protocol(cell: dict, a: argparse.Namespace, stage: str, sets: list[str]) -> dict:
    """An evaluation cell's: the training's, the `latte eval` options and the
    checkpoint evaluated (its manifest's sha256)."""
    args = [
        "--max-tokens",
        str(a.eval_tokens),
        *(["--lengths", a.lengths] if stage == "extrapolation" else ["--latents"]),
    ]
    train = train_protocol(cell, sets)
    run_dir = Path(a.runs) / cell["variant"] / f"seed-{cell['seed']}"
    inputs = {**train[INPUTS], "checkpoint": digest_or_missing(run_dir)}
    return {**train, "eval": " ".join(args), INPUTS: inputs}


FIELDS = {
    "train": ("variant", "seed", "mixer", "val_ppl", "tokens_per_s", "wall_s", "steps", "tokens_seen", "val_tokens"),
    "extrapolation": ("variant", "seed", "mixer", "report"),
    "latents": ("variant", "seed", "mixer", "report"),
}


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    started = time.time()
    sets = list(a.plan_.sets) + (QUICK_SET if a.quick else []) + a.set
    check_sets(sets, a.variants.split(","))
    outputs = stage_outputs(a.results, a.plan_.name)
    stages = a.stages.split(",")
    check_readme(a.readme, [outputs[s][1] for s in stages])
    _check_outputs(outputs, stages)
    claim_work(a.runs, "lm-variants", "--runs")  # checked like --results; marked when the first run starts
    torch.set_num_threads(a.threads)  # what the runs use (OMP_NUM_THREADS), so the provenance says it
    variants, seeds = a.variants.split(","), [int(s) for s in a.seeds.split(",")]
    # seed-major: every variant's first seed before any second seed, so a sweep
    # cut short still compares every variant
    cells = [{"variant": v, "seed": s} for s in seeds for v in variants]
    latent_cells = [c for c in cells if VARIANTS[c["variant"]][1] in ("latte", "macchiato")]
    plan = {  # stage: (cells, run one)
        "train": (cells, lambda c: train_cell(c, a, sets)),
        "extrapolation": (cells, lambda c: eval_cell(c, a, "extrapolation")),
        "latents": (latent_cells, lambda c: eval_cell(c, a, "latents")),
    }
    sweeps = {s: _sweep(a, s, plan[s][0], sets) for s in STAGES if s in stages}
    for sweep in sweeps.values():  # every stage's cells, before any runs
        sweep.check()
    claim_work(a.runs, "lm-variants", "--runs", create=not a.report_only)
    done, missing = {}, {}
    for stage, sweep in sweeps.items():
        done[stage] = sweep.records() if a.report_only else sweep.run(plan[stage][1], desc=f"lm-variants {stage}")
        if stage == "train":
            done[stage] = [_whole_run_wall(r, Path(a.runs)) for r in done[stage]]
        missing[stage] = [f"{c['variant']} seed {c['seed']}" for c in sweep.pending()]
    if not any(done.values()):
        raise ValueError(f"--runs {a.runs}: no finished cells to report (a mistyped folder?); nothing was written")
    builders = {"train": variants_report, "extrapolation": extrapolation_report, "latents": latents_report}
    for stage, records in done.items():
        if not records:
            print(f"lm-variants {stage}: no finished cells to report", file=sys.stderr)
            continue
        out, name = outputs[stage]
        claim_results(out, "lm-variants", flag="--results")
        flat, tables, images = builders[stage](records, out, runs=Path(a.runs), sets=sets, plan=a.plan)
        if missing[stage]:
            tables += (
                "\n\n**Not in this report, not finished when it was written (the same command runs or "
                f"resumes them): {', '.join(missing[stage])}.**"
            )
        if stage == "train":
            steps = () if a.quick else a.plan_.curve_steps  # quick runs stop before the plan's steps
            curves, curve_png = curve_table(cells, Path(a.runs), steps=steps, out=out)
            tables += f"\n\n{curves}" if curves else ""
            images += [curve_png] if curve_png else []
        run = provenance("lm-variants", argv, started, threads=a.threads, stage=stage)
        write_results(out, name, flat, tables, run, readme=a.readme, images=images)
        print(tables)
    return 0


def _sweep(a: argparse.Namespace, stage: str, cells: list[dict], sets: list[str]) -> Sweep:
    """A stage's sweep (cells.py: one reuse rule): its cells with their protocol."""
    protocol = (lambda c: train_protocol(c, sets)) if stage == "train" else (lambda c: eval_protocol(c, a, stage, sets))
    return Sweep(Path(a.runs) / ".cells" / stage, cells, protocol=protocol, fields=FIELDS[stage], folder_flag="--runs")


def _check_outputs(outputs: dict, stages: list[str]) -> None:
    """Before any work: every result folder of the stages is one this
    command may write (latte/guard.py), parents first (a plan's train folder
    holds its other stages' folders)."""
    folders = {outputs[s][0] for s in stages}
    folders |= {outputs["train"][0]} if any(outputs["train"][0] in f.parents for f in folders) else set()
    for folder in sorted(folders, key=lambda f: len(f.parts)):
        claim_results(folder, "lm-variants", flag="--results", create=False)


def check_sets(sets: list[str], variants: list[str]) -> None:
    """Every --set is a valid override of every variant's config, before any
    run starts (a bad one would otherwise fail in each training subprocess,
    or never be read when the cells are already done)."""
    bad = [s for s in sets if "=" not in s or not s.partition("=")[0].strip()]
    if bad:
        raise ValueError(f"--set {bad[0]!r}: expected SECTION.FIELD=VALUE, e.g. train.steps=100")
    for v in variants:
        try:
            load_run_config(VARIANTS[v][0], [f"--{s}" for s in (*sets, *VARIANT_SETS.get(v, ()))])
        except ValueError as e:
            raise ValueError(f"--set {' '.join(sets)}: not a valid override of {VARIANTS[v][0]} ({e})") from None
