"""The stages of `python -m experiments.convert` (see experiments/convert/study.py):
training runs per recipe, long-context evaluation cells."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from experiments.common.cells import INPUTS, digest_or_missing, run_protocol
from experiments.common.results import Sweep, convert_run
from latte.data import TokenWindows
from latte.eval import TRAINED, as_model, bos_cell, converted_nll, documents, original_decode, original_nll, sinks_cell
from latte.train import nll_sums, open_run, pack_split, run_wall_time, subset, summarize

RECIPES = {  # name -> latte convert overrides of the shipped config, each one spelled out in full
    "end_to_end+lora8": ["conversion.lora_rank=8"],
    "end_to_end": ["conversion.lora_rank=0"],
    "kl_only": ["distill.lm_weight=0", "conversion.lora_rank=0"],
    "layerwise": ["distill.objective=layerwise", "conversion.lora_rank=0"],
}
# the recipe the shipped config runs and the long-context evaluation reads:
# the best of the recipe comparison (results/convert-recipes)
DEFAULT_RECIPE = "end_to_end+lora8"
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
# budgets of the evaluation stages, sized from measured costs to fit about
# four hours on 2 threads for the four models (docs/evaluation.md §7.4)
DOCUMENTS = 2  # per corpus
FULL_DOCUMENTS = 1  # read to 32K by every model; the others to 8K
TASK_EXAMPLES = 100
NEEDLE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
NEEDLE_TRIALS = 1

SHORT = 8192  # the original reads its other documents this far (its training context)


def run_dir(a, recipe: str) -> Path:
    return Path(a.runs) / "recipes" / recipe


def checks(a, fields=(), extra=None) -> dict:
    """cells.Sweep's checks of a stage: the protocol every cell records (the
    runs' config, --set overrides and resolved config; the sha256 of every
    input: the base model's files, data files, the converted model's
    checkpoint once opened (a.inputs); plus `extra(cell)`: the stage's own
    settings, whose `inputs` add to the others) and the fields its record holds."""

    def protocol(cell: dict) -> dict:
        own = dict(extra(cell)) if extra else {}
        base = run_protocol(a.config, a.set)
        inputs = {**base[INPUTS], **getattr(a, "inputs", {}), **own.pop(INPUTS, {})}
        return {**base, **own, INPUTS: inputs}

    return dict(protocol=protocol, fields=fields, folder_flag="--runs")


# --------------------------------------------------------------------------- recipes


def recipes_stage(a) -> list[dict]:
    names = [r for r in a.recipes.split(",") if r]
    bad = [r for r in names if r not in RECIPES]
    if bad or DEFAULT_RECIPE not in names:
        raise ValueError(f"--recipes: unknown {bad}" if bad else f"--recipes must include {DEFAULT_RECIPE!r}")
    cells = [{"recipe": r} for r in sorted(names, key=lambda r: r != DEFAULT_RECIPE)]
    cells += [{"recipe": "none (swa)"}, {"recipe": "none (original)"}]

    # a baseline reads the default recipe's run: its checkpoint is an input
    def baseline(c: dict) -> dict:
        return {INPUTS: {"run": digest_or_missing(run_dir(a, DEFAULT_RECIPE))}} if "none" in c["recipe"] else {}

    fields = ("val_ppl", "val_tokens", "train_tokens")
    sweep = Sweep(Path(a.runs) / "cells-recipes", cells, **checks(a, fields, extra=baseline))
    rows = sweep.run(lambda c: _recipe_cell(c, a), desc="recipes")
    # a recipe's overrides as defined now (a cell keeps the string it ran with)
    return [{**r, "overrides": " ".join(RECIPES[r["recipe"]])} if r["recipe"] in RECIPES else r for r in rows]


def _recipe_cell(cell: dict, a) -> dict:
    recipe = cell["recipe"]
    if recipe.startswith("none"):  # the untrained baselines on the same validation windows
        return _baseline_ppl(run_dir(a, DEFAULT_RECIPE), original="original" in recipe)
    run = run_dir(a, recipe)
    load0, t0 = os.getloadavg()[0], time.time()
    s = convert_run(a.config, run, [*RECIPES[recipe], *a.set], a.threads)
    return _recipe_record(s, run, recipe, load0, t0)


def _recipe_record(s: dict, run: Path, recipe: str, load0: float, t0: float) -> dict:
    return {
        "val_ppl": s["val_ppl"],
        "val_tokens": s["val_tokens"],
        "train_tokens": s["tokens_seen"],
        "steps": s["step"],
        "train_wall_s": round(run_wall_time(run), 3),
        "stopped": s.get("stopped", ""),
        "overrides": " ".join(RECIPES[recipe]),
        "load_start": round(load0, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "cell_wall_s": round(time.time() - t0, 1),
    }


@torch.no_grad()
def _baseline_ppl(run: Path, *, original: bool) -> dict:
    """Validation perplexity (the trainer's windows) of the converted model
    before up-training (as_sliding_window: beta = -30, no LoRA) or of
    the original."""
    trained = open_run(run)
    model = trained.model.model  # Distiller -> the converted model
    t0 = time.perf_counter()
    task = trained.task
    windows = _val_windows(trained)
    with model.as_original() if original else model.as_sliding_window() as scored:
        total, count = nll_sums(scored, windows, batch_size=1)
    m = summarize(total, int(count), time.perf_counter() - t0)
    del task
    return {
        "val_ppl": m["ppl"],
        "val_tokens": m["tokens"],
        "train_tokens": 0,
        "steps": 0,
        "train_wall_s": 0.0,
        "stopped": "",
        "overrides": "",
        "cell_wall_s": round(time.perf_counter() - t0, 1),
    }


def _val_windows(trained):
    c = trained.config.data
    return subset(TokenWindows(pack_split(trained.config, trained.tokenizer, "validation"), c.seq_len), c.val_windows)


# --------------------------------------------------------------------------- long-context evaluation

DECODE_STEPS = 9  # timed decode steps after each context (the first is a warm-up)
CORPORA = ("plays", "essays")


def held_out_documents(a, subject, corpus: str, n: int, max_context: int) -> list[tuple[str, torch.Tensor]]:
    """n held-out documents of a corpus (`latte eval --data`'s: the longest
    held-out plays, with --quick the stand-in run's own validation
    documents; the held-out essays joined in n seeded orders), tokenized
    after the model's first token, cut at max_context + 1 tokens plus the
    few that decode timing feeds after the last context."""
    texts = documents(subject, "validation" if a.quick and corpus == "plays" else corpus, n)
    limit = max_context + 1 + DECODE_STEPS
    return [(name, torch.tensor((subject.bos + subject.tokenizer.encode(text))[:limit])) for name, text in texts]


def eval_stage(a, subject, sinks: int) -> list[dict]:
    """Per-token loss of every model over every held-out document, and the
    original's decode timing (docs/conversion.md §6)."""
    contexts, cells, docs = a.contexts, [], {}
    for corpus in a.corpora:
        for i, (name, ids) in enumerate(held_out_documents(a, subject, corpus, a.documents, a.max_context)):
            docs[(corpus, name)] = ids
            # the cell names how far it reads, so a sweep to a longer context
            # does not reuse a shorter one's per-token losses
            for m in reversed(a.models):
                full = (
                    i < a.original_full_documents
                    if m == "original"
                    else a.full_documents in (0, None) or i < a.full_documents
                )
                reads = a.max_context if full else min(SHORT, a.max_context)
                cell = {"model": m, "corpus": corpus, "document": name, "max_context": reads, **bos_cell(subject)}
                cell.update(sinks_cell(m, sinks))
                cell.update({"source": subject.identity} if m in TRAINED else {})
                cells.append(cell)
    if "original" in a.models:
        cells += [{"model": "original-decode", "document": f"context-{c}"} for c in contexts]

    def extra(cell: dict) -> dict:  # how far each model reads depends on its document's rank
        reach = {}
        if cell["model"] == "original":
            reach = {"original_full_documents": a.original_full_documents}
        elif cell["model"] != "original-decode":
            reach = {"full_documents": a.full_documents}
        return {"contexts": ",".join(map(str, contexts)), **reach}

    def fields(cell: dict) -> tuple:
        return ("ms_per_token", "state_bytes") if cell["model"] == "original-decode" else ("nll", "wall_s", "load")

    sweep = Sweep(Path(a.runs) / "cells-eval", cells, **checks(a, fields, extra=extra))
    sweep.run(lambda cell: _eval_cell(cell, subject, docs, contexts), desc="eval")
    return sweep.records()


def _eval_cell(cell, subject, docs, contexts) -> dict:
    model = subject.model
    load0, c0 = os.getloadavg()[0], time.process_time()
    if cell["model"] == "original-decode":
        c = int(cell["document"].removeprefix("context-"))
        return {**original_decode(model, c), "context": c, "load": round(load0, 2)}
    ids = docs[(cell["corpus"], cell["document"])]
    if cell["model"] == "original":
        res = original_nll(model, ids[: cell["max_context"] + 1])
    else:  # (the few extra tokens feed the decode timing after the last context)
        ids = ids[: cell["max_context"] + 1 + DECODE_STEPS]
        with as_model(subject, cell["model"], cell.get("sinks", 0)) as m:  # every model but the original
            res = converted_nll(m, ids, contexts=contexts, decode_steps=DECODE_STEPS)
    record = {
        "tokens": int(res.nll.shape[0]),
        "wall_s": round(res.wall_s, 1),
        "cpu_s": round(time.process_time() - c0, 1),
        "load": round(load0, 2),
        "nll": ",".join(f"{x:.5f}" for x in res.nll.tolist()),
    }
    for c, d in res.decode.items():
        record[f"ms_per_token_{c}"] = round(d["ms_per_token"], 2)
        record[f"state_bytes_{c}"] = int(d["state_bytes"])
    return record


def nll_of(record: dict) -> torch.Tensor:
    return torch.tensor([float(x) for x in record["nll"].split(",")], dtype=torch.float64)
