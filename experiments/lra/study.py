"""`python -m experiments.lra`: ListOps and Pathfinder-32 (Long Range Arena) with
the bidirectional model, latte against softmax and linear attention.

    python -m experiments.lra                      # the committed results/lra/ (hours on 2 CPU cores)
    python -m experiments.lra --quick --out /tmp/x # seconds: what the tests run
    python -m experiments.lra --budget reduced --work runs/lra-reduced   # 200 x 16 for ListOps/Pathfinder,
                                              # marked as a reduced CPU budget everywhere
    python -m experiments.lra --budget lra --tasks listops --parts train --work runs/lra-protocol
                                              # ListOps at the LRA's own protocol (5,000 x 32 on
                                              # 96,000 expressions), checkpoint chosen on validation

Parts, each a resumable sweep cell under --work (a killed run continues;
a killed training resumes from its last checkpoint, exactly):
1. generator speed: ListOps examples/s and Pathfinder images/s on ONE core,
   with the load average (the machine is shared: say whether it was quiet);
2. training: `latte train --config lra/<task> --model.mixer=<mixer>` for
   every task and mixer, one budget (the config's steps x batch);
3. results/lra/: results.json (one record per cell), results.md (tables,
   budgets, the exact commands, baselines), curves.png (validation accuracy
   and training loss against examples seen), pathfinder_examples.png (test
   images with their labels, to check by eye), and the README section.

Reference points: the majority class of the training split (scored on
test) and the LRA Transformer (Tay et al. 2021, Table 1: ListOps 36.37,
Pathfinder 71.40, trained for 5K steps x 32 and 200 epochs x 160K).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import time
from pathlib import Path

import numpy as np
import torch

from experiments.common.cells import finished_summary, run_protocol, set_aside_changed_run
from experiments.common.results import Sweep, check_readme, claim_results, claim_work, provenance, write_results
from latte.data import lra as lra_data
from latte.reporting import pyplot, save_figure
from latte.train import find_latest_checkpoint, load_run_config, open_run, read_csv, step_dir_name, step_dirs, train

NAME = "lra"
TASKS = ("listops", "pathfinder", "listops-short")
# A control, not an LRA task: ListOps cut to 10-100 tokens and depth 4, same model and budget.
# It shows whether the recipe learns at all when the sequences are short.
VARIANTS = {
    "listops-short": (
        "listops",
        [
            "data.listops_min_length=10",
            "data.listops_max_length=100",
            "data.listops_max_depth=4",
            "model.max_position_embeddings=128",
        ],
    )
}
MIXERS = ("latte", "softmax", "linear")
# Models beside the configs' (a "mixer" of the sweep): name -> (model.mixer, overrides).
# latte-paper: Latte at the paper's ListOps size (width 128, 6 layers, 40 latents: 10 per head x 4 heads).
MODELS = {"latte-paper": ("latte", ["model.dim=128", "model.num_layers=6", "model.latents_per_head=10"])}
MODEL_TASKS = {"latte-paper": ("listops",)}  # the tasks a model of MODELS is sized for
ALL_MIXERS = (*MIXERS, *MODELS)
LRA_TRANSFORMER = {"listops": 0.3637, "pathfinder": 0.7140}  # test accuracy, LRA paper Table 1
LRA_BUDGET = {
    "listops": "5K steps x batch 32 (160K examples), 6 layers, dim 512",
    "pathfinder": "200 epochs of 160K (62K steps x batch 512), 1 layer, dim 128",
}
LRA_EXAMPLES = {"listops": 5_000 * 32, "pathfinder": 200 * 160_000}  # training examples seen
# --quick: a few steps on a few examples, for the tests (seconds)
QUICK = [
    "train.steps=2",
    "train.global_batch_size=4",
    "train.eval_every=0",
    "train.save_every=0",
    "train.eval_batches=1",
    "optim.warmup_steps=0",
    "data.train_examples=16",
    "data.validation_examples=4",
    "data.test_examples=8",
    "data.num_workers=1",
    "model.dim=16",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.latents_per_head=2",
    "train.tensorboard=false",
    "train.time_budget_minutes=null",
]
QUICK_LISTOPS = ["data.listops_min_length=20", "data.listops_max_length=60", "data.listops_max_depth=4"]
# --budget reduced: the LRA tasks cut to 200 steps x 16 (3,200 examples; warm-up kept at 1/16 of the
# steps), what fits in about an hour of one shared CPU thread; the control keeps its config budget.
REDUCED = ["train.steps=200", "optim.warmup_steps=25", "train.eval_every=50", "train.save_every=50"]
# --budget lra: ListOps at the LRA's own protocol: 96,000 training expressions (the same stream,
# cut after the unchanged test and validation splits: see latte.data.lra.common), 5,000 steps x 32
# (warm-up 1/16 of the steps, as the config's 100 of 1,600). Pathfinder at what fits about 2 hours
# per mixer on 2 threads (softmax, the slowest, at an estimated 50 examples/s): 160,000 training
# images (the LRA's training split size), 9,000 steps x 32 = 288,000 examples, 1/111 of the LRA's
# 200 epochs x 160,000. Every periodic validation scores the whole validation split and every one
# has a checkpoint (kept): the test split is scored at the step of the best validation accuracy.
LRA_PROTOCOL = {
    "listops": ["data.train_examples=96000", "train.steps=5000", "optim.warmup_steps=312", "train.eval_every=250"],
    "pathfinder": ["data.train_examples=160000", "train.steps=9000", "optim.warmup_steps=562", "train.eval_every=500"],
}
LRA_EVERY = {"listops": 250, "pathfinder": 500}
LRA_COMMON = ["train.global_batch_size=32", "train.eval_batches=0"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.lra", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--out",
        default=None,
        help="where results.json/md and the PNGs go (results/lra; with --budget lra: results/lra/protocol)",
    )
    p.add_argument("--work", default="runs/lra", help="run folders and finished sweep cells (resumable)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument(
        "--mixers",
        nargs="+",
        default=None,
        choices=ALL_MIXERS,
        help=f"{', '.join(MIXERS)} (--budget lra: latte linear softmax latte-paper, in that order); "
        "latte-paper: Latte at the paper's ListOps size (width 128, 6 layers, 40 latents; ListOps only)",
    )
    p.add_argument("--parts", nargs="+", default=["generators", "train"], choices=["generators", "train"])
    p.add_argument(
        "--readme",
        default=None,
        help="markdown file whose section results:lra to replace (the repository's: results/README.md)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds, for tests")
    p.add_argument(
        "--budget",
        default="full",
        choices=["full", "reduced", "lra"],
        help="full: the configs' 1,600 steps x 16; reduced: 200 steps x 16 for listops and "
        "pathfinder (a reduced CPU budget, said so in every output); lra: ListOps at the LRA "
        "protocol (96,000 expressions, 5,000 steps x 32), Pathfinder at 9,000 x 32 on 160,000 "
        "images, the test split scored at the checkpoint of the best validation accuracy",
    )
    p.add_argument(
        "--full-work",
        default="runs/lra",
        help="with --budget reduced: full-budget cells finished in this --work folder are shown "
        "beside the reduced ones (read only, never run)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write the results of the finished cells and run nothing; the others are listed as missing",
    )
    p.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="extra config overrides for every training run",
    )
    args = p.parse_args(argv)
    lra = args.budget == "lra"
    args.out = args.out or ("results/lra/protocol" if lra else "results/lra")
    args.mixers = args.mixers or (["latte", "linear", "softmax", "latte-paper"] if lra else list(MIXERS))
    return args


# --------------------------------------------------------------------------- generators


def generator_speed(task: str, quick: bool) -> dict:
    """Examples (ListOps) or images (Pathfinder) per second in this one process."""

    load = os.getloadavg()
    t0, cpu0 = time.perf_counter(), time.process_time()
    n = generator_count(task, quick)
    if task == "listops":
        spec = lra_data.listops.ListOpsSpec(min_length=20, max_length=60) if quick else lra_data.listops.ListOpsSpec()
        _, drawn = lra_data.listops.generate_shard(0, 0, n, spec)
        extra = {"candidates_per_example": round(drawn / n, 2)}
    else:
        lra_data.pathfinder.generate_shard(0, 0, n, lra_data.pathfinder.PathfinderSpec())
        extra = {}
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    # cpu_share: CPU time / wall time of this process: near 1 when it had a core to itself;
    # per_cpu_s: per second of CPU time, what a whole free core would give
    return {
        "per_s_per_core": round(n / seconds, 1),
        "per_cpu_s": round(n / max(cpu, 1e-9), 1),
        "generated": n,
        "seconds": round(seconds, 2),
        "cpu_share": round(cpu / seconds, 2),
        "loadavg_1min": round(load[0], 2),
        **extra,
    }


def example_grid(path: Path, data, count: int = 24) -> Path | None:
    """A grid of Pathfinder images with their labels (1 = the markers are on one path)."""
    plt = pyplot()
    if plt is None:
        return None
    count = min(count, len(data))
    cols = 6
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows))
    for i, ax in enumerate(np.atleast_1d(axes).flat):
        ax.axis("off")
        if i < count:
            ax.imshow(np.asarray(data.inputs[0][i]).reshape(32, 32), cmap="gray", vmin=0, vmax=255)
            ax.set_title(f"{'same' if data.labels[i] else 'different'} ({data.labels[i]})", fontsize=8)
    fig.suptitle("Pathfinder-32 (contour length 14): markers on the same path (1) or not (0)", fontsize=9)
    return save_figure(plt, fig, path, dpi=100)


# --------------------------------------------------------------------------- training


def train_overrides(task: str, mixer: str, work: Path, extra: list[str]) -> tuple[str, list[str]]:
    """(config name, overrides) of one cell: `latte train --config <name> --<override> ...`."""
    base, variant = VARIANTS.get(task, (task, []))
    model, sizes = MODELS.get(mixer, (mixer, []))
    run_dir = f"train.run_dir={work / f'{task}-{mixer}'}"
    return f"lra/{base}", [f"model.mixer={model}", *sizes, run_dir, *variant, *extra]


def run_training(task: str, mixer: str, work: Path, extra: list[str], budget: str = "full") -> dict:
    """Trains one cell in this process (resuming its run folder) and reads back its
    summary; with budget lra, the test split is scored at the checkpoint chosen on validation."""

    config, overrides = train_overrides(task, mixer, work, extra)
    cfg = load_run_config(config, overrides)
    set_aside_changed_run(cfg.train.run_dir, config, overrides)  # never resumed under another config (cells.py)
    # wall_s covers this process only: a resumed run says from which step
    latest = find_latest_checkpoint(cfg.train.run_dir) if Path(cfg.train.run_dir).is_dir() else None
    resumed_from = int(latest.name.rsplit("-", 1)[1]) if latest is not None else 0
    t0, load_start = time.time(), os.getloadavg()[0]
    # a run that already ended (killed before its cell was written) is read, not resumed for 0 steps:
    # its summary keeps the training's throughput (cells.py: finished_summary)
    s = finished_summary(cfg.train.run_dir, cfg.train.steps)
    s = s if s is not None and "test_accuracy" in s else train(cfg)
    if "test_accuracy" not in s:
        raise RuntimeError(
            f"{task}/{mixer}: the run stopped before its final evaluation ({s.get('stopped')}); "
            "run the experiment again to resume it"
        )
    counts = s["label_counts"]
    return {
        "test_accuracy": s["test_accuracy"],
        "test_balanced_accuracy": s["test_balanced_accuracy"],
        "test_macro_f1": s["test_macro_f1"],
        "val_accuracy": s["val_accuracy"],
        "majority_baseline": s["majority_baseline"],
        "lra_transformer": LRA_TRANSFORMER.get(task),
        "steps": s["step"],
        "batch": cfg.train.global_batch_size,
        "examples": s["examples_seen"],
        "train_examples": s["split_examples"]["train"],
        "test_examples": s["test_examples"],
        "parameters": s["parameters"],
        "wall_s": round(time.time() - t0, 1),
        "resumed_from_step": resumed_from,
        "train_examples_per_s": round(s["train_examples_per_s"] or 0.0, 2),
        "train_label_counts": " ".join(map(str, counts["train"])),
        "test_label_counts": " ".join(map(str, counts["test"])),
        "loadavg_1min": round(os.getloadavg()[0], 2),
        "loadavg_start": round(load_start, 2),
        "threads": torch.get_num_threads(),
        "run_wall_s": round(s.get("wall_time_s") or 0.0, 3),  # every process that trained the run
        "command": shlex.join(["latte", "train", "--config", config, *(f"--{o}" for o in overrides)]),
        **(chosen_on_validation(Path(cfg.train.run_dir), s) if budget == "lra" else {}),
    }


def validation_curve(run_dir: Path, whole: int) -> dict[int, float]:
    """step -> accuracy of the validations of the whole split (`whole` examples) in
    the run's val.csv; a later row of a step (a resumed run's) replaces an earlier."""
    rows = read_csv(run_dir / "val.csv") if (run_dir / "val.csv").is_file() else []
    return {
        int(r["step"]): float(r["val_accuracy"])
        for r in rows
        if r.get("val_accuracy") and round(float(r["val_examples"])) == whole
    }


def chosen_on_validation(run_dir: Path, summary: dict) -> dict:
    """The test metrics at the checkpoint of the best whole-split validation accuracy
    (the earliest of equals), the last step's beside them, and the validation curve.
    The chosen checkpoint is scored on validation again: it must give val.csv's accuracy."""
    whole = summary["split_examples"]["validation"]
    curve = validation_curve(run_dir, whole)
    saved = {step for step, _ in step_dirs(run_dir)}
    scored = [(acc, -step) for step, acc in curve.items() if step in saved]
    if not scored:
        raise RuntimeError(
            f"{run_dir}: no validation of the whole split ({whole} examples) in val.csv has a checkpoint "
            "to choose (--budget lra validates the whole split at every checkpoint)"
        )
    acc, step = max(scored)[0], -max(scored)[1]
    val, test = score_checkpoint(run_dir / step_dir_name(step))
    if abs(val["accuracy"] - acc) > 1.5 / whole:  # the same weights: at most a near-tie's argmax may move
        raise RuntimeError(
            f"{run_dir / step_dir_name(step)}: validation accuracy {val['accuracy']:.4f} now, {acc:.4f} "
            "in val.csv at that step: the checkpoint does not hold the weights that were validated"
        )
    batch = summary["examples_seen"] // max(1, summary["step"])
    return {
        "selection": "best validation accuracy",
        "selected_step": step,
        "selected_examples": step * batch,
        "val_accuracy": acc,
        "test_accuracy": test["accuracy"],
        "test_balanced_accuracy": test["balanced_accuracy"],
        "test_macro_f1": test["macro_f1"],
        "final_val_accuracy": summary["val_accuracy"],
        "final_test_accuracy": summary["test_accuracy"],
        "val_curve": " ".join(f"{k * batch}:{v:.4f}" for k, v in sorted(curve.items())),
    }


def score_checkpoint(step_dir: Path) -> tuple[dict, dict]:
    """(validation, test) metrics of one checkpoint, on the splits its config names."""
    trained = open_run(step_dir)
    task = trained.task
    task._load(log=None)  # the splits (from the data cache) that inference alone does not load
    with torch.no_grad():
        return tuple(task._score(trained.model, task.splits[split], 0) for split in ("validation", "test"))


# --------------------------------------------------------------------------- outputs


def curves(path: Path, work: Path, records: list[dict]) -> Path | None:
    """Validation accuracy and training loss against training examples seen,
    one column per task, one line per mixer."""
    plt = pyplot()
    if plt is None:
        return None

    runs = [r for r in records if r.get("part") == "train"]
    tasks = sorted({r["task"] for r in runs}, key=TASKS.index)
    if not tasks:
        return None
    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 7), squeeze=False)
    for col, task in enumerate(tasks):
        acc_ax, loss_ax = axes[0, col], axes[1, col]
        for r in (r for r in runs if r["task"] == task):
            run = _run_dir(r, work)
            name = f"{r['mixer']}, full budget" if r.get("budget") == "full" and task not in VARIANTS else r["mixer"]
            val = read_csv(run / "val.csv") if (run / "val.csv").is_file() else []
            pts = [(int(v["step"]) * r["batch"], float(v["val_accuracy"])) for v in val if v.get("val_accuracy")]
            if pts:
                acc_ax.plot(*zip(*pts), "o-", ms=3, label=name)
            train = read_csv(run / "metrics.csv") if (run / "metrics.csv").is_file() else []
            xs = [int(t["step"]) * r["batch"] for t in train if math.isfinite(float(t["loss"]))]
            ys = [float(t["loss"]) for t in train if math.isfinite(float(t["loss"]))]
            if ys:
                k = max(1, len(ys) // 25)
                smooth = np.convolve(ys, np.ones(k) / k, mode="valid")
                loss_ax.plot(xs[k - 1 :], smooth, label=f"{name} (mean of {k} steps)")
        first = next(r for r in runs if r["task"] == task)
        acc_ax.axhline(first["majority_baseline"], color="gray", ls=":", label="majority class")
        if task in LRA_TRANSFORMER:
            acc_ax.axhline(LRA_TRANSFORMER[task], color="black", ls="--", label="LRA Transformer (full budget)")
        acc_ax.set_title(f"{task}: validation accuracy")
        loss_ax.set_title(f"{task}: training loss (cross-entropy)")
        for ax in (acc_ax, loss_ax):
            ax.set_xlabel("training examples seen")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return save_figure(plt, fig, path, dpi=100)


def _run_dir(record: dict, work: Path) -> Path:
    """The run folder of a training record: its command's --train.run_dir."""
    for arg in shlex.split(record["command"]):
        if arg.startswith("--train.run_dir="):
            return Path(arg.split("=", 1)[1])
    return work / f"{record['task']}-{record['mixer']}"


def tables_md(records: list[dict]) -> str:
    gens = [r for r in records if r.get("part") == "generator"]
    runs = [r for r in records if r.get("part") == "train"]
    lines = []
    if runs:
        lines += _budget_note(runs)
        lines += [
            "| task | mixer | budget | test accuracy | balanced | validation | majority class | LRA Transformer "
            "| examples (steps x batch) | wall time | parameters |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            lines.append(
                f"| {r['task']} | {r['mixer']} | {r.get('budget', 'full')} | {r['test_accuracy']:.3f} "
                f"| {r['test_balanced_accuracy']:.3f} "
                f"| {r['val_accuracy']:.3f} | {r['majority_baseline']:.3f} | {_fmt(r['lra_transformer'])} "
                f"| {r['examples']:,} ({r['steps']} x {r['batch']}) | {_wall(r)} "
                f"| {r['parameters'] / 1e3:.0f}K |"
            )
        tests = sorted({f"{r['task']} {r['test_examples']:,} examples" for r in runs})
        lines += [
            "",
            "Test splits: "
            + ", ".join(tests)
            + "; training splits: "
            + ", ".join(sorted({f"{r['task']} {r['train_examples']:,}" for r in runs}))
            + ". Load average (1 min) at the end of each run: "
            + ", ".join(f"{r['task']}/{r['mixer']}/{r.get('budget', 'full')} {r['loadavg_1min']:.1f}" for r in runs)
            + ".",
            "",
        ]
        lines += _label_table(runs)
        lines += ["Commands (one per row, in this order):", "", "```"] + [r["command"] for r in runs] + ["```", ""]
        lines += [*_lra_tables(runs), _verdict(runs), ""]
    if gens:
        lines += [
            "| generator | per second (wall), one process | per CPU second | CPU share of the process "
            "| load average (1 min) | published generator |",
            "|---|---|---|---|---|---|",
        ]
        for g in gens:
            unit = "examples" if g["task"] == "listops" else "images"
            ref = "unseeded script, no timing published" if g["task"] == "listops" else "about 2 images/s (0.5 s each)"
            per_cpu = f"{g['per_cpu_s']:,.1f} {unit}" if "per_cpu_s" in g else "-"
            lines.append(
                f"| {g['task']} | {g['per_s_per_core']:,.1f} {unit} | {per_cpu} "
                f"| {g.get('cpu_share', float('nan')):.2f} "
                f"| {g['loadavg_1min']:.1f} | {ref} |"
            )
        lines.append("")
    return "\n".join(lines)


LRA_NOTE = (
    "**The LRA protocol.** Rows marked `lra`: ListOps trained as the Long Range Arena trains it, 5,000 "
    "steps x 32 = 160,000 examples on 96,000 generated training expressions (the generator's stream cut "
    "after the 2,000-example test and 1,000-example validation splits, which stay as they were: the three "
    "are disjoint), warm-up 312 steps then cosine decay; Pathfinder at 9,000 x 32 = 288,000 examples on "
    "160,000 images (the LRA's 200 epochs x 160,000 = 32M examples is 111 times more). The whole "
    "validation split is scored every 250 (ListOps) or 500 (Pathfinder) steps, each time with a "
    "checkpoint; the test accuracy is that of the checkpoint with the best validation accuracy (the last "
    "step's is shown beside it). The model is the config's (width 64, 2 layers) for latte, softmax and "
    "linear; latte-paper is Latte at the paper's ListOps size (width 128, 6 layers, 40 latents); the LRA "
    "Transformer is width 512, 6 layers."
)


def _budget_note(runs: list[dict]) -> list[str]:
    """Says plainly when the LRA tasks ran on the reduced CPU budget, and how to run the full one."""
    if any(r.get("budget") == "lra" for r in runs):
        return [LRA_NOTE, ""]
    if not any(r.get("budget") == "reduced" for r in runs):
        return ["Budget: the configs' (`latte/configs/lra/*.yaml`), the same for every mixer of a task.", ""]
    return [
        "**Reduced CPU budget.** ListOps and Pathfinder rows marked `reduced` trained for 200 steps x 16 "
        "= 3,200 examples (warm-up 25 steps), one eighth of the configs' 1,600 x 16 = 25,600, because the "
        "machine (2 cores shared by several jobs, one thread per run) could not fit the full protocol for "
        "all three mixers in the time there was. Every mixer of a task has the same budget. Rows marked "
        "`full` ran the configs' budget (the control, and any full-budget cells already finished). "
        "Full mode: `python -m experiments.lra --readme results/README.md`.",
        "",
    ]


def _lra_verdict(runs: list[dict]) -> str:
    """Each run at the LRA protocol against the LRA Transformer and the majority class."""
    out = []
    for r in (r for r in runs if r.get("budget") == "lra"):
        acc = r["test_accuracy"]
        above, gap = acc - r["majority_baseline"], acc - r["lra_transformer"]
        half = 1.96 * math.sqrt(acc * (1 - acc) / r["test_examples"])  # normal approximation, one test split
        out.append(
            f"- {r['task']}, {r['mixer']}: {acc:.4f} after {r['examples']:,} examples (chosen at "
            f"{r['selected_examples']:,}; 95% interval of {r['test_examples']:,} test examples ± {100 * half:.1f} "
            f"points), {100 * above:+.1f} points from the majority class ({r['majority_baseline']:.4f}) and "
            f"{100 * gap:+.2f} points from the LRA Transformer ({r['lra_transformer']:.4f}, trained on "
            f"{LRA_BUDGET[r['task']]}): "
            + (
                "level with it within that interval."
                if abs(gap) <= half
                else f"{'above' if gap > 0 else 'below'} it, outside that interval."
            )
        )
    return "\n".join(out)


def _wall(r: dict) -> str:
    """Wall time of every process that trained the run (the trainer's summary);
    a cell without it: the finishing process's, naming the steps it covers."""
    if r.get("run_wall_s"):
        return f"{r['run_wall_s'] / 60:.0f} min"
    start = r.get("resumed_from_step", 0)
    return f"{r['wall_s'] / 60:.0f} min" + (f" (steps {start + 1}-{r['steps']} only)" if start else "")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _label_table(runs: list[dict]) -> list[str]:
    """The label distribution of each task's training and test splits (share of examples per class)."""
    lines = [
        "| task | split | examples per class (class 0, 1, ...) | share of the most frequent |",
        "|---|---|---|---|",
    ]
    for task in TASKS:
        r = next((r for r in runs if r["task"] == task), None)
        if r is None:
            continue
        for split in ("train", "test"):
            counts = [int(c) for c in r[f"{split}_label_counts"].split()]
            lines.append(f"| {task} | {split} | {', '.join(map(str, counts))} | {max(counts) / sum(counts):.3f} |")
    return lines + [""]


def _lra_tables(runs: list[dict]) -> list[str]:
    """The runs at the LRA protocol: the checkpoint chosen on validation, the run's wall
    time, threads and load; then each task's validation accuracy against examples seen."""
    rows = [r for r in runs if r.get("budget") == "lra"]
    if not rows:
        return []
    lines = [
        "| task | model | test accuracy (checkpoint chosen on validation) | chosen at step (examples) "
        "| validation there | test / validation at the last step | majority class | LRA Transformer "
        "| wall time of the run | threads | load average (start, end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['mixer']} | {r['test_accuracy']:.3f} | {r['selected_step']:,} "
            f"({r['selected_examples']:,}) | {r['val_accuracy']:.3f} | {r['final_test_accuracy']:.3f} / "
            f"{r['final_val_accuracy']:.3f} | {r['majority_baseline']:.3f} | {_fmt(r['lra_transformer'])} "
            f"| {r['run_wall_s'] / 60:.0f} min | {r['threads']} | {r['loadavg_start']:.1f}, {r['loadavg_1min']:.1f} |"
        )
    lines.append("")
    for task in TASKS:
        curves = {r["mixer"]: dict(p.split(":") for p in r["val_curve"].split()) for r in rows if r["task"] == task}
        if not curves:
            continue
        xs = sorted({int(x) for c in curves.values() for x in c})
        lines += [
            f"{task}: validation accuracy (whole split) against training examples seen",
            "",
            "| examples seen | " + " | ".join(curves) + " |",
            "|---|" + "---|" * len(curves),
            *(f"| {x:,} | " + " | ".join(c.get(str(x), "-") for c in curves.values()) + " |" for x in xs),
            "",
        ]
    return lines


def _verdict(runs: list[dict]) -> str:
    """What the numbers say against the LRA reference, and what scale would close the gap."""
    if any(r.get("budget") == "lra" for r in runs):
        return _lra_verdict(runs)
    out = []
    for task in TASKS:
        rs = [r for r in runs if r["task"] == task]
        if not rs:
            continue
        best = max(rs, key=lambda r: r["test_accuracy"])
        above = best["test_accuracy"] - best["majority_baseline"]
        if task in VARIANTS:
            out.append(
                f"- {task} (a control, not an LRA task: 10-100 tokens, depth 4, the same model, "
                f"{best['examples']:,} examples): best {best['mixer']} {best['test_accuracy']:.3f}, "
                f"{100 * above:+.1f} points from the majority class ({best['majority_baseline']:.3f})."
            )
            continue
        gap = LRA_TRANSFORMER[task] - best["test_accuracy"]
        out.append(
            f"- {task}: best {best['mixer']} {best['test_accuracy']:.3f} after {best['examples']:,} examples, "
            f"{100 * above:+.1f} points from the majority class ({best['majority_baseline']:.3f}) and "
            f"{'%.1f points below' % (100 * gap) if gap > 0 else 'at or above'} the LRA Transformer "
            f"({LRA_TRANSFORMER[task]:.3f}), which trained on {LRA_BUDGET[task]}: "
            f"{LRA_EXAMPLES[task] / best['examples']:,.0f} times the examples seen here."
        )
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.time()
    out, work = Path(args.out), Path(args.work)
    name = section_name(args.budget)
    check_readme(args.readme, [name])
    check_overrides(args, work)
    claim_results(out, NAME, create=False)  # before any work: the one write rule (latte/guard.py)
    claim_work(work, NAME)  # checked like --out; marked when the first cell runs
    cells = [{"part": "generator", "task": t} for t in args.tasks if "generators" in args.parts and t not in VARIANTS]
    if "train" in args.parts:
        pairs = [(t, m) for t in args.tasks for m in args.mixers if t in MODEL_TASKS.get(m, (t,))]
        cells += [{"part": "train", "task": t, "mixer": m} for t, m in pairs]
    if not cells:
        raise ValueError(
            f"--parts {' '.join(args.parts)} --tasks {' '.join(args.tasks)}: no cells (the control "
            f"{', '.join(VARIANTS)} has no generator of its own)"
        )

    def run(cell: dict) -> dict:
        if cell["part"] == "generator":
            return generator_speed(cell["task"], args.quick)
        budget = budget_of(cell["task"], args.budget)
        overrides = cell_overrides(cell, args, work)
        return {"budget": budget, **run_training(cell["task"], cell["mixer"], work, overrides, budget)}

    claim_work(work, NAME, create=not args.report_only)
    sweep = Sweep(work, cells, **sweep_checks(args, work))
    missing = sweep.pending() if args.report_only else []
    records = sweep.records() if args.report_only else sweep.run(run, desc="lra")
    if args.budget == "reduced" and Path(args.full_work).resolve() != work.resolve():
        records += full_budget_records(Path(args.full_work), cells, args, work)
    if not records:  # report-only on an empty or mistyped folder: leave the published files alone
        raise ValueError(
            f"--work {work}: no finished cells to report (a mistyped folder?); "
            f"{out} and the README are left as they were"
        )
    records.sort(key=_row_order)
    claim_results(out, NAME)
    # the example images only beside Pathfinder results (a report of none would generate its data for them)
    pathfinder_done = any(r["task"] == "pathfinder" for r in records)
    if pathfinder_done:
        sets = cell_overrides({"part": "train", "task": "pathfinder"}, args, work)
        example_grid(out / "pathfinder_examples.png", _pathfinder_test_split(sets))
    curves(out / "curves.png", work, records)
    md = tables_md(records) + _missing_md(missing, argv) + _in_progress_md(missing, args, work)
    md += "\n![validation accuracy and training loss](curves.png)\n"
    if pathfinder_done:
        md += "\n![Pathfinder test images with labels](pathfinder_examples.png)\n"
    write_results(out, name, records, md, provenance(NAME, argv, started), readme=args.readme)
    print(tables_md(records))
    return 0


def section_name(budget: str) -> str:
    """The README section (results:NAME) of a budget: the LRA protocol's has its own."""
    return "lra-protocol" if budget == "lra" else NAME


def cell_overrides(cell: dict, args: argparse.Namespace, work: Path, budget: str | None = None) -> list[str]:
    """The config overrides a training cell runs with (the user's --override
    last: it wins over the budget's). `budget`: instead of the command's."""
    quick = [*QUICK, f"data.cache_dir={work / 'cache'}"] if args.quick else []
    quick_task = QUICK_LISTOPS if args.quick and cell["task"] == "listops" else []
    own = budget_overrides(cell["task"], budget or budget_of(cell["task"], args.budget), work)
    return [*own, *quick, *quick_task, *args.override]


def budget_overrides(task: str, budget: str, work: Path) -> list[str]:
    """The overrides of a task's budget (before --quick's sizes, which win in the tests)."""
    if budget == "reduced":
        return REDUCED
    if budget != "lra":
        return []
    every = LRA_EVERY[task]  # a checkpoint at every validation, all kept, for the choice on validation
    steps = int(next(o for o in LRA_PROTOCOL[task] if o.startswith("train.steps=")).split("=")[1])
    keep = steps // every + 5
    saves = [f"train.save_every={every}", f"train.keep={keep}", f"data.cache_dir={work / 'cache'}"]
    return [*LRA_PROTOCOL[task], *LRA_COMMON, *saves]


def generator_count(task: str, quick: bool) -> int:
    """Examples (ListOps) or images (Pathfinder) the generator-speed cell times."""
    return {"listops": (400, 8), "pathfinder": (512, 4)}[task][quick]


TRAIN_FIELDS = ("task", "mixer", "test_accuracy", "test_balanced_accuracy", "val_accuracy", "majority_baseline")
TRAIN_FIELDS += ("steps", "batch", "examples", "wall_s", "parameters", "command", "loadavg_1min")
TRAIN_FIELDS += ("train_examples", "test_examples", "train_label_counts", "test_label_counts", "lra_transformer")
GENERATOR_FIELDS = ("task", "per_s_per_core", "generated", "loadavg_1min")


def sweep_checks(args: argparse.Namespace, work: Path, budget: str | None = None) -> dict:
    """The protocol of each cell (results.Sweep): a training cell's config and
    overrides, a generator cell's count; and the fields a record holds."""

    def protocol(cell: dict) -> dict:
        if cell["part"] == "generator":
            return {"examples": generator_count(cell["task"], args.quick)}
        config, overrides = train_overrides(cell["task"], cell["mixer"], work, cell_overrides(cell, args, work, budget))
        return run_protocol(config, overrides)

    return dict(protocol=protocol, fields=lambda c: GENERATOR_FIELDS if c["part"] == "generator" else TRAIN_FIELDS)


def check_overrides(args: argparse.Namespace, work: Path) -> None:
    """Every --override is valid for every task's config, before any run (a
    bad one would otherwise fail inside a run, or never be read at all when
    the cells are done)."""
    bad = [o for o in args.override if "=" not in o or not o.partition("=")[0].strip()]
    if bad:
        raise ValueError(f"--override {bad[0]!r}: expected SECTION.FIELD=VALUE, e.g. train.steps=100")
    for task in args.tasks if args.override and "train" in args.parts else ():
        cell = {"part": "train", "task": task, "mixer": args.mixers[0]}
        config, overrides = train_overrides(task, args.mixers[0], Path(args.work), cell_overrides(cell, args, work))
        try:
            load_run_config(config, overrides)
        except ValueError as e:
            raise ValueError(f"--override {' '.join(args.override)}: not valid for {config} ({e})") from None


def full_budget_records(full_work: Path, cells: list[dict], args: argparse.Namespace, work: Path) -> list[dict]:
    """Cells of the LRA tasks finished at the configs' full budget in an earlier
    `python -m experiments.lra --work full_work` (marked budget=full), checked
    against this command's protocol at the full budget."""
    wanted = [c for c in cells if c["part"] == "train" and c["task"] not in VARIANTS]
    checks = sweep_checks(args, full_work, budget="full")
    return [{**r, "budget": "full"} for r in Sweep(full_work, wanted, **checks).records()]


def _row_order(r: dict) -> tuple:
    """Generators first, then by task, budget (reduced before full) and mixer."""
    return (
        r["part"] != "generator",
        TASKS.index(r["task"]),
        r.get("budget") == "full",
        ALL_MIXERS.index(r["mixer"]) if "mixer" in r else 0,
    )


def _missing_md(missing: list[dict], argv: list[str]) -> str:
    if not missing:
        return ""
    names = ", ".join("/".join(str(c[k]) for k in ("task", "mixer", "part") if k in c) for c in missing)
    command = shlex.join(["latte", "experiment", NAME, *(a for a in argv if a != "--report-only")])
    return (
        f"\n**Missing cells** (not finished when these results were written; the same command without "
        f"--report-only, `{command}`, resumes them): {names}.\n"
    )


def _in_progress_md(missing: list[dict], args: argparse.Namespace, work: Path) -> str:
    """Where each missing training cell's run folder stands (read from its CSV logs):
    steps done of planned, and its validations so far. Not a result: the run may
    still be going, and its test split is scored only when it ends."""
    lines = []
    for cell in (c for c in missing if c["part"] == "train"):
        config, overrides = train_overrides(cell["task"], cell["mixer"], work, cell_overrides(cell, args, work))
        cfg = load_run_config(config, overrides)
        run = Path(cfg.train.run_dir)
        train_rows = read_csv(run / "metrics.csv") if (run / "metrics.csv").is_file() else []
        if not train_rows:
            continue
        batch = cfg.train.global_batch_size
        val = read_csv(run / "val.csv") if (run / "val.csv").is_file() else []
        seen = {int(v["step"]): v for v in val if v.get("val_accuracy")}
        curve = ", ".join(
            f"{step * batch:,}: {float(v['val_accuracy']):.3f} ({int(float(v['val_examples'])):,} examples)"
            for step, v in sorted(seen.items())
        )
        step = int(train_rows[-1]["step"])
        lines.append(
            f"- {cell['task']}/{cell['mixer']} (`{run}`): step {step:,} of {cfg.train.steps:,} "
            f"({step * batch:,} of {cfg.train.steps * batch:,} examples) logged; validation accuracy against "
            f"examples seen so far: {curve or 'none yet'}."
        )
    if not lines:
        return ""
    head = (
        "\n**Runs in progress** (read from their run folders when this was written; not results: the "
        "test split is scored, at the checkpoint chosen on validation, only when a run ends):\n\n"
    )
    return head + "\n".join(lines) + "\n"


def budget_of(task: str, budget: str) -> str:
    """How a cell's budget compares with the configs' (recorded in every training record)."""
    return budget if budget in ("reduced", "lra") and task not in VARIANTS else "full"


def _pathfinder_test_split(extra: list[str]):
    """The test split the Pathfinder runs use (read from the data cache)."""

    d = load_run_config("lra/pathfinder", extra).data
    splits, _ = lra_data.load_task(
        "pathfinder",
        sizes={"train": d.train_examples, "validation": d.validation_examples, "test": d.test_examples},
        seed=d.seed,
        cache_dir=d.cache_dir,
        num_workers=d.num_workers,
        pathfinder_spec=d.pathfinder_spec(),
    )
    return splits["test"]
