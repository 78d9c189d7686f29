"""`python -m experiments.mqar`: associative recall against state size (Zoology protocol, scaled).

Every model is 2 attention-only blocks (mlp "none"), one token mixer, width
64 or 128, 2 heads, vocabulary 8192, trained from scratch on MQAR
(latte.data.mqar) at (T=64, 4 pairs), (128, 8) and (256, 16). AdamW (weight
decay 0.1 except norms/embeddings), linear warm-up then cosine decay
(latte.train.schedule.lr_at), gradient clipping 1.0, at each learning rate of
a small sweep; training stops early once test accuracy reaches 0.99. The
loss and the accuracy count only the query positions (labels != -100); the
LM head is applied to those rows only, which changes nothing but the cost.

A record per (setting, model, lr): accuracy (of the last evaluation: at the
early stop or the end), state_bytes (per layer, float32, see `state_bytes`),
steps, examples, seconds. The report keeps the best lr of each (setting,
model): as in Zoology, lr is selected on the test accuracy.

    python -m experiments.mqar --quick                  # seconds: the end-to-end test
    python -m experiments.mqar --out results/mqar       # the committed sweep (hours)
    python -m experiments.mqar --mixers softmax --settings 64x4 --dims 64   # a slice
    python -m experiments.mqar ... --deadline 2026-11-22T18:45   # cells stop there, recorded as incomplete
    python -m experiments.mqar --settings 256x16 --mixers linear-conv --seeds 1,2   # more seeds of a cell
    python -m experiments.mqar --restore-from results/mqar --report-only   # rebuild the work folder, then the report
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.common.results import (
    StepClock,
    Sweep,
    check_readme,
    claim_results,
    claim_work,
    provenance,
    read_json,
    utc_deadline,
    write_results,
    writer_of,
)
from latte.arguments import checked, float_list, int_at_least, int_list, name_list
from latte.data import MQARData, check_mqar_args, mqar_splits
from latte.models import LatteConfig, LatteForCausalLM
from latte.train import lr_at

from .cells import cell_file_key, other_protocol_records, restore_cells, with_protocol
from .report import flat_records, report
from .train import accuracy, adamw, batches, load_progress, save_progress, scored_logits

NAME = "mqar"
VOCAB_SIZE = 8192
NUM_LAYERS, NUM_HEADS = 2, 2
TARGET = 0.99  # early stop (Zoology)
# Model families: mixer, qk_mixer, window (None: unused), latents as a
# multiple of dim (None: unused). Latents = dim gives Latte the state of
# linear attention at the same width: L (dv + 1) = H dv (dv + 1) when L = H dv.
FAMILIES = {
    "softmax": ("softmax", None, None, None),
    "linear": ("linear", None, None, None),
    "linear-conv": ("linear", "conv", None, None),
    "swa-16": ("swa", None, 16, None),
    "swa-32": ("swa", None, 32, None),
    "latte-none": ("latte", "none", None, 1.0),
    "latte-conv": ("latte", "conv", None, 1.0),
    "latte-conv_rglru": ("latte", "conv_rglru", None, 1.0),
    "macchiato": ("macchiato", "conv_rglru", 16, 1.0),
}
LATENT_MULTIPLES = (0.25, 1.0, 4.0)  # Latte's curve: L = dim/4, dim, 4 dim
SETTINGS = ((64, 4), (128, 8), (256, 16))


@dataclass(frozen=True)
class Budget:
    train_examples: dict  # seq_len -> examples
    test_examples: int
    epochs: int
    batch_size: int
    lrs: tuple
    vocab_size: int = VOCAB_SIZE
    eval_every: int = 250  # steps between test evaluations (early stop granularity)


# Calibrated with softmax attention at (T=64, 4 pairs), dim 64, lr 3e-3: 20,000
# examples stall at 0.24 test accuracy while the training loss keeps falling
# (memorised, 6 epochs); 100,000 reach 0.998 within the second epoch.
FULL = Budget({64: 100000, 128: 100000, 256: 100000}, 1000, 3, 64, (3e-3, 1e-3))
QUICK = Budget({16: 128}, 32, 1, 32, (3e-3,))
QUICK_SETTINGS = ((16, 2),)


def state_bytes(
    mixer: str,
    *,
    dim: int,
    seq_len: int,
    num_latents: int | None = None,
    window_size: int | None = None,
    qk_mixer: str | None = None,
    conv_size: int = 3,
    memory_slots: int = 0,
) -> dict:
    """Recurrent state of ONE layer in float32 bytes, split into the attention
    state and the qk mixer's (conv inputs, RG-LRU state).

    latte: H Lh (dv + 1) = num_latents (dv + 1) floats (Vbar and z);
    softmax: the KV cache after seq_len tokens, 2 T dim; linear: H dk (dv + 1)
    (S and z); swa: the W - 1 cached keys and values, 2 (W - 1) dim;
    macchiato: latte's plus the window cache, plus with M memory slots
    (docs/math.md §4.2) per KV head (K = H here, dk = dv) M keys, values and
    scores and the W - 1 window tokens' pending scores, K (M (dk + dv + 1) +
    W - 1) floats, in attn_state_bytes. Like the window's mask, the slots'
    integer and boolean parts (positions, flags, counters: 9 M K + 8 (W - 1)
    + 8 bytes) are not counted in state_bytes; memory_index_bytes names them."""
    dv = dim // NUM_HEADS
    window = 2 * (window_size - 1) * dim if window_size else 0
    memory = NUM_HEADS * (memory_slots * (2 * dv + 1) + window_size - 1) if memory_slots else 0
    attn = {
        "softmax": 2 * seq_len * dim,
        "linear": NUM_HEADS * dv * (dv + 1),
        "swa": window,
        "latte": (num_latents or 0) * (dv + 1),
        "macchiato": (num_latents or 0) * (dv + 1) + window + memory,
    }[mixer]
    qk = 0
    if qk_mixer:
        qk = (conv_size - 1) * dim * ("conv" in qk_mixer) + dim * ("rglru" in qk_mixer)
    out = {"state_bytes": 4 * (attn + qk), "attn_state_bytes": 4 * attn, "qk_mixer_state_bytes": 4 * qk}
    if memory_slots:
        index = 9 * memory_slots * NUM_HEADS + 8 * (window_size - 1) + 8
        out.update(memory_state_bytes=4 * memory, memory_index_bytes=index)
    return out


def cells_for(settings, dims, families, latent_multiples, lrs, seeds=(0,), max_epochs=FULL.epochs) -> list[dict]:
    """Every (setting, model, dim, num_latents, lr, seed), in the order they
    run: the first lr before the others, the first seed before the others,
    dim 64 before 128, Latte at num_latents = dim (linear attention's state)
    before its other sizes, then setting and family; so a sweep cut short has
    the most comparable cells first. Every cell carries its protocol fields
    (seed, max_epochs; see cells.py)."""
    cells = []
    for seq_len, pairs in settings:
        for dim in dims:
            for fam in families:
                mixer, qk, window, lat = FAMILIES[fam]
                multiples = latent_multiples if mixer == "latte" else ((lat,) if lat else (None,))
                for m in multiples:
                    for lr in lrs:
                        for seed in seeds:
                            cells.append(
                                {
                                    "seq_len": seq_len,
                                    "num_kv_pairs": pairs,
                                    "model": fam,
                                    "dim": dim,
                                    "num_latents": int(m * dim) if m else None,
                                    "lr": lr,
                                    "seed": seed,
                                    "max_epochs": max_epochs,
                                }
                            )

    def priority(c: dict) -> tuple:
        multiple = c["num_latents"] / c["dim"] if c["num_latents"] else 1.0
        return (
            lrs.index(c["lr"]),
            seeds.index(c["seed"]),
            dims.index(c["dim"]),
            multiple != 1.0,
            settings.index((c["seq_len"], c["num_kv_pairs"])),
            list(families).index(c["model"]),
            multiple,
        )

    return sorted(cells, key=priority)


def model_config(cell: dict, vocab_size: int = VOCAB_SIZE) -> LatteConfig:
    mixer, qk, window, _ = FAMILIES[cell["model"]]
    extra = {("linear_qk_mixer" if mixer == "linear" else "qk_mixer"): qk} if qk else {}
    extra.update({k: cell[k] for k in ("memory_slots", "memory_rule") if k in cell})  # memory.py's cells
    return LatteConfig(
        vocab_size=vocab_size,
        dim=cell["dim"],
        num_layers=NUM_LAYERS,
        num_heads=NUM_HEADS,
        latents_per_head=(cell["num_latents"] or NUM_HEADS) // NUM_HEADS,
        mixer=mixer,
        window_size=window or 16,
        mlp="none",
        dropout=0.0,
        max_position_embeddings=cell["seq_len"],
        **extra,
    )


def train_cell(
    cell: dict,
    train: MQARData,
    test: MQARData,
    budget: Budget,
    seed: int = 0,
    verbose: bool = False,
    deadline: float | None = None,
    progress: Path | None = None,
    protocol: dict | None = None,
) -> dict:
    """Train one model on one setting at one lr; returns the record's fields.
    Test accuracy is measured every `budget.eval_every` steps and at the end;
    training stops at the first measurement >= TARGET. The cell's own seed
    and max_epochs, when it has them, replace `seed` and budget.epochs.
    With `progress` (a file), the run saves itself there at every
    evaluation and where the deadline stops it, and continues from what it
    finds there for this cell and `protocol` (train.load_progress)."""
    seed = cell.get("seed", seed)
    budget = dataclasses.replace(budget, epochs=cell.get("max_epochs", budget.epochs))
    torch.manual_seed(seed)
    model = LatteForCausalLM(model_config(cell, train.vocab_size))
    opt = adamw(model, cell["lr"])
    total = budget.epochs * math.ceil(len(train) / budget.batch_size)  # warm-up: a 20th of it
    t0 = time.perf_counter()
    # Training time only (evaluations excluded), per eval interval and per
    # epoch: does a step slow down as the model learns (sharper key logits)?
    clock = StepClock()
    identity = {"cell": cell, "protocol": protocol, "budget": dataclasses.asdict(budget)}
    run, finished = _resume(progress, identity, model, opt, clock)
    if finished is not None:
        return finished  # the sweep had not written its cell file yet

    def snapshot(record: dict | None = None) -> None:
        _snapshot(progress, identity, model, opt, run, clock, time.perf_counter() - t0, record)

    order = batches(len(train), budget.batch_size, budget.epochs, torch.Generator().manual_seed(seed))
    for epoch, idx in itertools.islice(order, run["step"], None):
        run["epoch"] = epoch
        clock.start(epoch)
        lr = lr_at(run["step"], base_lr=cell["lr"], warmup_steps=max(1, total // 20), total_steps=total, decay="cosine")
        _train_step(model, opt, train.input_ids[idx], train.labels[idx], lr, run)
        step = run["step"]
        clock.stop()
        out_of_time = deadline is not None and time.time() >= deadline
        regular = step % budget.eval_every == 0 or step == total
        if out_of_time and not regular:
            snapshot()  # before the extra evaluation, which an uninterrupted run would not make
        if regular or out_of_time:
            acc = _measure(model, test, run, clock, regular)
            if verbose:
                _say(cell, run, t0)
            if regular and acc < TARGET and step < total:
                snapshot()
            if acc >= TARGET or out_of_time:
                break
    record = _record(cell, model, budget, run, clock, total, len(train), len(test), train.fillers, t0)
    if not record["incomplete"]:
        snapshot(record)
    return record


def _resume(progress, identity, model, opt, clock) -> tuple[dict | None, dict | None]:
    """(the run's progress, None), the model, optimizer and clock restored
    from `progress` when it holds this cell's unfinished run; (None, its
    record) when it holds the finished one; a fresh run without either."""
    saved = load_progress(progress, identity) if progress is not None else None
    if saved is not None and saved.get("record") is not None:
        return None, saved["record"]
    if saved is None:  # curve: [step, test accuracy] per evaluation
        fresh = dict(step=0, skipped=0, acc=0.0, best=0.0, epoch=0, loss=math.nan, curve=[], seconds=0.0)
        return {**fresh, "load0": os.getloadavg()[0], "resumed": []}, None
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    run, clock.__dict__ = saved["run"], saved["clock"]
    run["resumed"].append(run["step"])
    return run, None


def _snapshot(progress, identity, model, opt, run, clock, seconds, record=None) -> None:
    """Saves the cell's run to `progress` (if given): `seconds` of this process's training added."""
    if progress is not None:
        state = {**run, "seconds": run["seconds"] + seconds}
        content = {"model": model.state_dict(), "optimizer": opt.state_dict(), "run": state}
        save_progress(progress, identity, {**content, "clock": dict(clock.__dict__), "record": record})


def _train_step(model, opt, input_ids, labels, lr: float, run: dict) -> None:
    """One optimizer step at `lr`; a non-finite step is dropped, and counted in the record."""
    for group in opt.param_groups:
        group["lr"] = lr
    logits, target = scored_logits(model, input_ids, labels)
    loss_t = F.cross_entropy(logits, target)
    loss_t.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if torch.isfinite(loss_t) and torch.isfinite(norm):
        opt.step()
        run["loss"] = float(loss_t.detach())
    else:
        run["skipped"] += 1
    opt.zero_grad(set_to_none=True)
    run["step"] += 1


def _measure(model, test: MQARData, run: dict, clock: StepClock, regular: bool) -> float:
    """Test accuracy now, kept in `run` (in its curve at the regular evaluations only)."""
    clock.interval()
    run["acc"] = acc = accuracy(model, test)
    run["best"] = max(run["best"], acc)
    if regular:
        run["curve"].append([run["step"], round(acc, 4)])
    return acc


def _say(cell: dict, run: dict, t0: float) -> None:
    """The progress line of an evaluation (--verbose)."""
    print(
        f"  {cell['model']} dim {cell['dim']} L {cell['num_latents']} T {cell['seq_len']} "
        f"lr {cell['lr']:g}: step {run['step']} (epoch {run['epoch']}) loss {run['loss']:.3f} "
        f"accuracy {run['acc']:.3f} ({time.perf_counter() - t0:.0f} s)",
        file=sys.stderr,
    )


def _record(cell, model, budget, run, clock, total, n_train, n_test, fillers, t0) -> dict:
    """The record's fields of a cell's run (train_cell)."""
    step, epoch, acc = run["step"], run["epoch"], run["acc"]
    resumed = {"resumed_from_steps": run["resumed"]} if run["resumed"] else {}
    return {
        **state_bytes(
            model.config.mixer,
            dim=cell["dim"],
            seq_len=cell["seq_len"],
            num_latents=cell["num_latents"],
            window_size=FAMILIES[cell["model"]][2],
            qk_mixer=FAMILIES[cell["model"]][1],
            memory_slots=cell.get("memory_slots", 0),
        ),
        "mixer": model.config.mixer,
        "qk_mixer": FAMILIES[cell["model"]][1],
        "window_size": FAMILIES[cell["model"]][2],
        "accuracy": round(acc, 4),
        "best_accuracy": round(run["best"], 4),
        "reached_target": acc >= TARGET,
        "incomplete": acc < TARGET and step < total,
        "planned_steps": total,
        "epochs": epoch,
        "steps": step,
        "skipped_steps": run["skipped"],
        "examples": n_train,
        "test_examples": n_test,
        "examples_seen": min(step * budget.batch_size, epoch * n_train),
        "final_loss": round(run["loss"], 4),
        "seconds": round(run["seconds"] + time.perf_counter() - t0, 1),
        "loadavg_start": round(run["load0"], 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
        "parameters": model.num_parameters(),
        "fillers": fillers,
        "ms_per_step": round(1000 * clock.total_s / max(step, 1), 1),
        "cpu_ms_per_step": round(1000 * clock.cpu_s / max(step, 1), 1),
        "interval_ms_per_step": clock.interval_ms,
        "interval_cpu_ms_per_step": clock.interval_cpu_ms,
        "epoch_train_seconds": clock.epoch_s,
        "accuracy_curve": run["curve"],
        **resumed,
    }


DIMS = int_list(low=NUM_HEADS)
LRS = float_list("learning rates > 0", lambda v: v > 0)
MULTIPLES = float_list("multiples > 0", lambda v: v > 0)
SEEDS = int_list(low=0)


def _settings(text: str) -> tuple[tuple[int, int], ...]:
    """--settings "64x4,128x8": (seq_len, num_kv_pairs) pairs MQAR can hold."""
    allowed = "comma-separated T x pairs like 64x4,128x8 with T >= 4 x pairs"
    out = []
    for item in text.split(","):
        try:
            T, P = (int(v) for v in item.strip().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        try:
            check_mqar_args(VOCAB_SIZE, T, P, 0.01)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r} ({e})") from None
        out.append((T, P))
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected {allowed} without repeats, got {text!r}")
    return tuple(out)


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k, n = -1, 0
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"expected K/N with 0 <= K < N (worker K of N), got {text!r}")
    return k, n


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.mqar", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="a tiny sweep in seconds (the end-to-end test)")
    p.add_argument("--out", default=None, help="results folder (default results/mqar, quick: results/mqar-quick)")
    p.add_argument("--work", default=None, help="finished cells, for resuming (default runs/experiments/mqar[-quick])")
    p.add_argument("--settings", default=None, type=checked(_settings), help="T x pairs list, e.g. 64x4,128x8")
    p.add_argument("--dims", default=None, type=checked(DIMS), help="widths, e.g. 64,128")
    p.add_argument(
        "--mixers", default=None, type=checked(name_list(FAMILIES)), help=f"model families among {', '.join(FAMILIES)}"
    )
    p.add_argument("--lrs", default=None, type=checked(LRS), help="learning rates, e.g. 1e-3,3e-3")
    p.add_argument(
        "--latent-multiples",
        default=None,
        type=checked(MULTIPLES),
        help=f"Latte's num_latents as multiples of dim (default {','.join(map(str, LATENT_MULTIPLES))})",
    )
    p.add_argument("--train-examples", type=int_at_least(1), default=None, help="training examples per setting")
    p.add_argument(
        "--epochs", type=int_at_least(1), default=None, help="most epochs per run (default 3; cells carry it)"
    )
    p.add_argument(
        "--seeds", default="0", type=checked(SEEDS), help="training seeds (model init and batch order), e.g. 0,1,2"
    )
    p.add_argument(
        "--restore-from",
        default=None,
        metavar="RESULTS_DIR",
        help="first write the work folder's missing cell files back from RESULTS_DIR/results.json and "
        "step_times.json (the published cells, on a machine without the original work folder)",
    )
    p.add_argument("--random-fillers", action="store_true", help="random tokens instead of 0 between queries")
    p.add_argument(
        "--shard", default="0/1", type=_shard, help="K/N: run every N-th pending cell from K (parallel workers)"
    )
    p.add_argument("--report-only", action="store_true", help="write the results of the finished cells, run none")
    p.add_argument(
        "--threads",
        type=int_at_least(1),
        default=1,
        help="torch threads (1: these tiny models lose more to thread sync than they gain)",
    )
    p.add_argument("--verbose", action="store_true", help="a line per epoch on stderr")
    p.add_argument(
        "--deadline",
        default=None,
        metavar="YYYY-MM-DDTHH:MM",
        help="UTC wall clock at which a cell stops where it is and is recorded as incomplete "
        "(rerun by the next sweep); no new cell starts after it",
    )
    _report_options(p)
    _memory_options(p)
    return p.parse_args(argv)


def _report_options(p: argparse.ArgumentParser) -> None:
    """The options of the results' text and the README section they fill."""
    p.add_argument(
        "--readme",
        default=None,
        help="replace the section results:NAME (NAME: the --out folder's name) of this markdown file "
        "(the repository's: results/README.md)",
    )
    p.add_argument("--note", default=None, help="a sentence for the results' text (how or where the cells ran)")


def _memory_options(p: argparse.ArgumentParser) -> None:
    """The options of the memory-slot variant (memory.py; study.main runs it)."""
    p.add_argument(
        "--memory",
        action="store_true",
        help="the memory-slot variant (memory.py): Macchiato at T=256 with and without memory slots "
        "beside Latte with the same state bytes (default out results/mqar-memory)",
    )
    p.add_argument(
        "--memory-slots", type=int_at_least(1), default=None, help="with --memory: slots per layer and KV head"
    )


def _plan(a: argparse.Namespace):
    """(budget, settings, dims, families, latent multiples, seeds); the
    options' texts were checked by argparse (parse_args)."""
    budget = QUICK if a.quick else FULL
    settings = _settings(a.settings) if a.settings else QUICK_SETTINGS if a.quick else SETTINGS
    seeds = SEEDS(a.seeds)
    budget = dataclasses.replace(
        budget,
        train_examples={T: a.train_examples or budget.train_examples.get(T, 100000) for T, _ in settings},
        epochs=a.epochs or budget.epochs,  # argparse refuses 0
        lrs=LRS(a.lrs) if a.lrs else budget.lrs,
    )
    dims = DIMS(a.dims) if a.dims else ((16,) if a.quick else (64, 128))
    odd = [d for d in dims if d % NUM_HEADS]
    if odd:
        raise ValueError(f"--dims {a.dims}: each width must be a multiple of the {NUM_HEADS} heads; {odd} is not")
    families = name_list(FAMILIES)(a.mixers) if a.mixers else tuple(FAMILIES)
    multiples = (1.0,) if a.quick else LATENT_MULTIPLES
    if a.latent_multiples:
        multiples = MULTIPLES(a.latent_multiples)
        if any((m * d) != int(m * d) or int(m * d) % NUM_HEADS for m in multiples for d in dims):
            raise ValueError(
                f"--latent-multiples {a.latent_multiples}: each must be > 0 and give a whole "
                f"num_latents, a multiple of the {NUM_HEADS} heads, at every width in {dims}"
            )
    return budget, settings, dims, families, multiples, seeds


def _scope(a: argparse.Namespace) -> str:
    """What part of the full protocol the command covers, for the results'
    text ("" for the full sweep or the quick test)."""
    narrowed = {
        name: v
        for name, v in (
            ("settings", a.settings),
            ("dims", a.dims),
            ("mixers", a.mixers),
            ("lrs", a.lrs),
            ("latent multiples", a.latent_multiples),
            ("training examples", a.train_examples),
            ("epochs", a.epochs),
            ("seeds", a.seeds if a.seeds != "0" else None),
        )
        if v
    }
    note = f" {a.note}" if a.note else ""
    if a.quick or not narrowed:
        return note.strip()
    return (
        "**A reduced CPU budget**, narrowed from the full protocol to "
        + "; ".join(f"{k} {v}" for k, v in narrowed.items())
        + ". The full sweep (widths 64 and 128, lr 3e-3 and 1e-3, every family, num_latents = dim/4, dim, "
        "4 dim, T = 64, 128, 256) is `python -m experiments.mqar`." + note
    )


def protocol(budget: Budget, random_fillers: bool):
    """What a cell's result depends on beyond its own fields (the data and
    the budget), recorded in its file (results.Sweep)."""

    def of(cell: dict) -> dict:
        return {
            "train_examples": budget.train_examples[cell["seq_len"]],
            "test_examples": budget.test_examples,
            "fillers": "random" if random_fillers else "zeros",
            "batch_size": budget.batch_size,
            "eval_every": budget.eval_every,
            "vocab_size": budget.vocab_size,
        }

    return of


def _restored(sweep: Sweep, restore_from: str | None) -> Sweep:
    """The sweep, its missing cell files first written back from the
    published results when --restore-from is given (cells.restore_cells)."""
    if restore_from:
        n = restore_cells(restore_from, sweep.work, published_protocol(Path(restore_from)))
        print(f"mqar: restored {n} cell files from {restore_from} into {sweep.work}", file=sys.stderr)
    return sweep


def published_protocol(results_dir: Path):
    """The protocol of the command that wrote results_dir (its run.json):
    what cells restored from its results ran under (cells.restore_cells)."""
    run = results_dir / "run.json"
    if not run.is_file():
        raise ValueError(f"--restore-from {results_dir}: no run.json there (the command that wrote the results)")
    command = str(read_json(run).get("command", ""))
    words = shlex.split(command)  # `latte experiment mqar ARGS` or `python -m experiments.mqar ARGS`
    if len(words) < 3 or writer_of(command) != f"latte experiment {NAME}":
        raise ValueError(
            f"--restore-from {results_dir}: {run} names no `latte experiment {NAME}` "
            f"(or `python -m experiments.{NAME}`) command"
        )
    try:
        published = parse_args(words[3:])
    except SystemExit:
        raise ValueError(f"--restore-from {results_dir}: the command in {run} no longer parses") from None
    return protocol(_plan(published)[0], published.random_fillers)


def _progress_file(sweep: Sweep, cell: dict) -> Path:
    """Where a cell's run saves its progress (train.save_progress)."""
    return sweep.work / "progress" / f"{cell_file_key(cell)}.pt"


# every record holds these (the report reads them)
FIELDS = ("accuracy", "state_bytes", "mixer", "seconds", "loadavg_start", "fillers", "examples", "test_examples")


def _cell_runner(a: argparse.Namespace, budget: Budget, deadline: float | None, sweep: Sweep):
    """run(cell) -> its record (train_cell), with its setting's data made on first use."""
    data: dict = {}

    def run(cell: dict) -> dict:
        key = (cell["seq_len"], cell["num_kv_pairs"])
        if key not in data:
            data.clear()  # one setting in memory at a time; regenerating one takes seconds
            data[key] = mqar_splits(
                budget.train_examples[key[0]],
                budget.test_examples,
                seq_len=key[0],
                num_kv_pairs=key[1],
                vocab_size=budget.vocab_size,
                seed=0,
                random_fillers=a.random_fillers,
            )
        return train_cell(
            cell, *data[key], budget, verbose=a.verbose, deadline=deadline,
            progress=_progress_file(sweep, cell), protocol=sweep.protocol_of(cell),
        )  # fmt: skip

    return run


def run_pending(sweep: Sweep, sweep_args: dict, run, shard: tuple[int, int], deadline: float | None) -> None:
    """Runs this worker's share (--shard K/N) of the sweep's pending cells,
    none after the deadline; then drops the saved progress of finished cells."""
    k, n = shard
    cells, pending = sweep.cells, sweep.pending()
    print(
        f"mqar: {len(cells) - len(pending)} of {len(cells)} cells already done in {sweep.work}; "
        f"shard {k}/{n} runs {len(pending[k::n])} of the other {len(pending)}",
        file=sys.stderr,
    )
    stop = lambda: deadline is not None and time.time() >= deadline  # noqa: E731
    Sweep(sweep.work, pending[k::n], **sweep_args).run(run, desc=f"mqar {k}/{n}", stop=stop)
    for cell in cells:  # a finished cell's file is written: its saved progress has served
        if sweep.done(cell):
            _progress_file(sweep, cell).unlink(missing_ok=True)


def sweep_main(a: argparse.Namespace, argv: list[str], started: float) -> int:
    """`python -m experiments.mqar` without --memory (study.main): the sweep
    of `a`'s plan, then its report."""
    budget, settings, dims, families, multiples, seeds = _plan(a)
    deadline = utc_deadline(a.deadline, "--deadline")
    out = Path(a.out or ("results/mqar-quick" if a.quick else "results/mqar"))
    check_readme(a.readme, [out.name])
    claim_results(out, NAME, create=False)  # before any work: the one write rule (latte/guard.py)
    work = claim_work(a.work or f"runs/experiments/{out.name}", NAME)  # checked like --out; marked when written
    torch.set_num_threads(a.threads)
    cells = cells_for(settings, dims, families, multiples, budget.lrs, seeds, budget.epochs)
    sweep_args = dict(key=cell_file_key, protocol=protocol(budget, a.random_fillers), fields=FIELDS)
    claim_work(work, NAME, create=not a.report_only or bool(a.restore_from))
    sweep = _restored(Sweep(work, cells, **sweep_args), a.restore_from)
    run = _cell_runner(a, budget, deadline, sweep)
    other_protocol_records(sweep, cells)  # every cell file the report reads is checked before any training
    if not a.report_only:
        run_pending(sweep, sweep_args, run, a.shard, deadline)
    records = [with_protocol(r) for r in sweep.records()] + other_protocol_records(sweep, cells)
    if not records:
        raise ValueError(
            f"--work {sweep.work}: no finished cells of this plan to report (a mistyped folder?); "
            f"{out} and the README are left as they were"
        )
    pending = sweep.pending()
    claim_results(out, NAME)
    tables, images = report(records, out, budget=budget, pending=pending, planned=sweep.cells, scope=_scope(a))
    # named after the folder: results/NAME/ fills the README section results:NAME
    run = provenance(NAME, argv, started, threads=a.threads)
    write_results(out, out.name, flat_records(records), tables, run, readme=a.readme, images=images)
    print(tables)
    return 0
