"""`python -m experiments.mqar --memory`: the Macchiato at T = 256 with and
without memory slots (docs/math.md §4.2), trained with the slots in place,
beside Latte with the same state bytes (issue 57, item 5).

The plan, one setting (T = 256, 16 pairs), width 64, lr 3e-3, seed 0: the
`macchiato` family of sweep.py (window 16, 64 latents, conv + RG-LRU latent
logits) without memory and with M slots per layer and KV head under each
selection rule but the oracle (which needs marked positions); and
`latte-conv_rglru` (the same latent branch without the window) with the
num_latents whose float32 state comes nearest the Macchiato's with the
slots (sweep.state_bytes gives every formula). The selection is not
differentiable (a score only ranks the tokens); the gradient reaches the
held keys and values, so the model learns with its slots in place.

The budget is a CPU's (MEMORY below: 20,000 training examples, 1 epoch, an
evaluation every 100 steps, early stop at 0.99), far smaller than mqar's
(100,000 examples, 3 epochs, where the Macchiato without memory reaches
0.044 at T = 256 and 0.914 in 6 epochs): the table compares early learning
at one budget, not what each model can hold.

    python -m experiments.mqar --memory --quick        # seconds: the end-to-end test
    python -m experiments.mqar --memory                # results/mqar-memory (7 cells)
    python -m experiments.mqar --memory --shard K/2    # two workers on the same work folder
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from experiments.common.results import (
    Sweep,
    check_readme,
    claim_results,
    claim_work,
    provenance,
    utc_deadline,
    write_results,
)
from latte.reporting import md_table

from . import sweep as M
from .cells import cell_file_key
from .plot import _bytes
from .report import flat_records

MACCHIATO, LATTE = "macchiato", "latte-conv_rglru"  # the families compared (sweep.FAMILIES)
RULES = ("recall", "key_norm", "attention", "random")  # every rule but the oracle
MEMORY = M.Budget({256: 6400}, 500, 1, 32, (3e-3,), eval_every=50)
MEMORY_SETTING, MEMORY_DIM, MEMORY_SLOTS = (256, 16), 64, 32
QUICK = M.Budget({32: 128}, 32, 1, 32, (3e-3,))
QUICK_SETTING, QUICK_DIM, QUICK_SLOTS = (32, 4), 16, 4  # T > the window (16), or no token leaves it
# mqar's options that choose the plan; --memory has its own
SWEEP_ONLY = ("settings", "dims", "mixers", "lrs", "latent_multiples", "restore_from")


def _bytes_of(model: str, dim: int, num_latents: int, slots: int = 0) -> int:
    mixer, qk, window, _ = M.FAMILIES[model]
    kw = dict(dim=dim, seq_len=0, num_latents=num_latents, window_size=window, qk_mixer=qk, memory_slots=slots)
    return M.state_bytes(mixer, **kw)["state_bytes"]


def matched_latents(dim: int, slots: int) -> int:
    """Latte's num_latents (a multiple of the heads) whose state comes
    nearest the Macchiato's with `slots` memory slots (ties: the smaller)."""
    target = _bytes_of(MACCHIATO, dim, dim, slots)
    step = M.NUM_HEADS
    options = range(step, target // (dim // M.NUM_HEADS + 1) + step, step)  # L (dv + 1) floats <= target
    return min(options, key=lambda L: (abs(_bytes_of(LATTE, dim, L) - target), L))


def memory_cells(setting, dim: int, slots: int, lr: float, seeds, epochs: int) -> list[dict]:
    """The plan's cells, seed by seed: Macchiato without memory, with the
    slots under the first two rules, Latte at the matched state, then the
    other rules (a sweep cut short has the first comparisons)."""
    T, pairs = setting
    base = {"seq_len": T, "num_kv_pairs": pairs, "dim": dim, "lr": lr}
    cells = []
    for seed in seeds:
        common = {**base, "seed": seed, "max_epochs": epochs}
        memory = [{**common, "model": MACCHIATO, "num_latents": dim, "memory_slots": slots, "memory_rule": rule}
                  for rule in RULES]  # fmt: skip
        latte = {**common, "model": LATTE, "num_latents": matched_latents(dim, slots)}
        cells += [{**common, "model": MACCHIATO, "num_latents": dim}, *memory[:2], latte, *memory[2:]]
    return cells


def _plan(a: argparse.Namespace):
    """(budget, cells) of the command; mqar's plan options are refused."""
    given = [f"--{f.replace('_', '-')}" for f in SWEEP_ONLY if getattr(a, f)]
    if given:
        raise ValueError(
            f"{', '.join(given)}: --memory runs its own plan (T=256, width 64, lr 3e-3, the Macchiato with "
            f"and without slots and Latte at the same state); it takes --memory-slots, --train-examples, "
            f"--epochs, --seeds, --shard, --deadline and the output options"
        )
    budget = QUICK if a.quick else MEMORY
    setting, dim = (QUICK_SETTING, QUICK_DIM) if a.quick else (MEMORY_SETTING, MEMORY_DIM)
    slots = a.memory_slots or (QUICK_SLOTS if a.quick else MEMORY_SLOTS)
    budget = dataclasses.replace(
        budget,
        train_examples={setting[0]: a.train_examples or budget.train_examples[setting[0]]},
        epochs=a.epochs or budget.epochs,
    )
    return budget, memory_cells(setting, dim, slots, budget.lrs[0], M.SEEDS(a.seeds), budget.epochs)


def memory_main(a: argparse.Namespace, argv: list[str], started: float) -> int:
    """`python -m experiments.mqar --memory`: the sweep's steps (sweep.sweep_main) on this plan."""
    budget, cells = _plan(a)
    deadline = utc_deadline(a.deadline, "--deadline")
    out = Path(a.out or ("results/mqar-memory-quick" if a.quick else "results/mqar-memory"))
    check_readme(a.readme, [out.name])
    claim_results(out, M.NAME, create=False)
    work = claim_work(a.work or f"runs/experiments/{out.name}", M.NAME)
    torch.set_num_threads(a.threads)
    sweep_args = dict(key=cell_file_key, protocol=M.protocol(budget, a.random_fillers), fields=M.FIELDS)
    claim_work(work, M.NAME, create=not a.report_only)
    sweep = Sweep(work, cells, **sweep_args)
    if not a.report_only:
        M.run_pending(sweep, sweep_args, M._cell_runner(a, budget, deadline, sweep), a.shard, deadline)
    records = sweep.records()
    if not records:
        raise ValueError(f"--work {sweep.work}: no finished cells of this plan to report; {out} is left as it was")
    claim_results(out, M.NAME)
    tables = memory_report(records, cells, budget, a.note)
    run = provenance(M.NAME, argv, started, threads=a.threads)
    write_results(out, out.name, flat_records(records), tables, run, readme=a.readme)
    print(tables)
    return 0


def _record_of(cell: dict, records: list[dict]) -> dict | None:
    """The record of a planned cell (the same fields, and no memory where the cell has none)."""
    for r in records:
        if all(r.get(k) == v for k, v in cell.items()) and r.get("memory_slots", 0) == cell.get("memory_slots", 0):
            return r
    return None


def _row(cell: dict, r: dict | None) -> list[str]:
    slots = f"{cell['memory_slots']}, {cell['memory_rule']}" if cell.get("memory_slots") else "none"
    name = f"{cell['model']} L={cell['num_latents']}" + (" w=16" if cell["model"] == MACCHIATO else "")
    state = _bytes(_bytes_of(cell["model"], cell["dim"], cell["num_latents"], cell.get("memory_slots", 0)))
    if r is None:
        return [name, slots, state, "not run", "", "", "", "", ""]
    cut = f" (stopped at step {r['steps']:,} of {r['planned_steps']:,})" if r.get("incomplete") else ""
    curve = " ".join(f"{s}:{acc:.3f}" for s, acc in r.get("accuracy_curve") or [])
    return [
        name, slots, state, f"{r['accuracy']:.3f}{cut}", f"{r['best_accuracy']:.3f}", f"{r['steps']:,}",
        f"{r['seconds']:,.0f}", f"{r['loadavg_start']:.1f}", curve,
    ]  # fmt: skip


def memory_report(records: list[dict], cells: list[dict], budget: M.Budget, note: str | None) -> str:
    """The table of every planned cell (a cell not run says so), and the protocol."""
    rows = [_row(c, _record_of(c, records)) for c in cells]
    (T, pairs), dim = next(iter({(c["seq_len"], c["num_kv_pairs"]): c["dim"] for c in cells}.items()))
    head = ["model", "memory (slots, rule)", "state bytes / layer", "accuracy", "best", "steps", "s", "load", "curve"]
    text = (
        f"MQAR at T={T}, {pairs} pairs, width {dim}, 2 attention-only layers, 2 heads, vocabulary "
        f"{budget.vocab_size}; {budget.train_examples[T]:,} training examples, {budget.test_examples:,} test "
        f"examples, batch {budget.batch_size}, at most {cells[0]['max_epochs']} epoch(s), lr {cells[0]['lr']:g}, "
        f"test accuracy every {budget.eval_every} steps (curve: step:accuracy), early stop at {M.TARGET}; "
        f"{len(cells)} cells. The memory slots are in place during training (selection is not differentiable; "
        "the held keys and values get the gradient). State bytes per layer in float32 (sweep.state_bytes): "
        "Macchiato L (dv + 1) + 2 (w - 1) dim + qk mixer, plus with M slots K (M (dk + dv + 1) + w - 1) "
        "(K = 2 KV heads, dk = dv = dim / 2); the slots' positions, flags and counters, 9 M K + 8 (w - 1) + 8 "
        "bytes, are not counted (as the window's mask is not); Latte L (dv + 1) + qk mixer, L chosen nearest "
        "the Macchiato with slots."
    )
    return md_table(head, rows) + "\n\n" + text + (f" {note}" if note else "")
