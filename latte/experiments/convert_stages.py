"""The stages of `latte experiment convert` (see latte/experiments/convert.py):
training runs per recipe, long-context evaluation cells, the long sample."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from latte.data import TokenWindows
from latte.eval.long_context import converted_nll, original_decode, original_nll, original_window_nll
from latte.train.lm import pack_split, split_corpus
from latte.train.runs import open_run
from latte.train.validation import nll_sums, subset, summarize

from .results import Sweep, protocol_sets, run_latte

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

SHORT = 8192  # the original reads its other documents this far (its training context)


def run_dir(a, recipe: str) -> Path:
    return Path(a.runs) / "recipes" / recipe


def checks(a, fields=(), extra=None) -> dict:
    """results.Sweep's checks of a stage: the protocol every cell records
    (the runs' config and --set overrides, plus `extra(cell)`: the stage's
    own settings) and the fields its record holds."""

    def protocol(cell: dict) -> dict:
        return {"config": a.config, "sets": protocol_sets(a.set), **(extra(cell) if extra else {})}

    return dict(protocol=protocol, fields=fields, folder_flag="--runs")


# --------------------------------------------------------------------------- recipes


def recipes_stage(a) -> list[dict]:
    names = [r for r in a.recipes.split(",") if r]
    bad = [r for r in names if r not in RECIPES]
    if bad or DEFAULT_RECIPE not in names:
        raise ValueError(f"--recipes: unknown {bad}" if bad else f"--recipes must include {DEFAULT_RECIPE!r}")
    cells = [{"recipe": r} for r in sorted(names, key=lambda r: r != DEFAULT_RECIPE)]
    cells += [{"recipe": "none (swa)"}, {"recipe": "none (original)"}]
    sweep = Sweep(Path(a.runs) / "cells-recipes", cells, **checks(a, ("val_ppl", "val_tokens", "train_tokens")))
    rows = sweep.run(lambda c: _recipe_cell(c, a), desc="recipes")
    # a recipe's overrides as defined now (a cell keeps the string it ran with)
    return [{**r, "overrides": " ".join(RECIPES[r["recipe"]])} if r["recipe"] in RECIPES else r for r in rows]


def _recipe_cell(cell: dict, a) -> dict:
    recipe = cell["recipe"]
    if recipe.startswith("none"):  # the untrained baselines on the same validation windows
        return _baseline_ppl(run_dir(a, DEFAULT_RECIPE), original="original" in recipe)
    run = run_dir(a, recipe)
    load0, t0 = os.getloadavg()[0], time.time()
    sets = [*RECIPES[recipe], *a.set]
    run_latte(
        [
            "convert",
            "--config",
            a.config,
            f"--train.run_dir={run}",
            f"--train.num_threads={a.threads}",
            "--train.tensorboard=false",
            *[f"--{s}" for s in sets],
        ],
        run / "experiment.log",
        a.threads,
    )
    s = json.loads((run / "summary.json").read_text())
    return {
        "val_ppl": s["val_ppl"],
        "val_tokens": s["val_tokens"],
        "train_tokens": s["tokens_seen"],
        "steps": s["step"],
        "train_wall_s": round(s["wall_time_s"], 1),
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


def held_out_documents(trained, n: int, max_context: int) -> list[tuple[str, torch.Tensor]]:
    """The n longest held-out documents, tokenized, cut at max_context + 1
    tokens plus the few that decode timing feeds after the last context."""

    _, val_docs = split_corpus(trained.config)
    docs = sorted(val_docs, key=lambda d: -len(d.text))[:n]
    out = []
    for d in docs:
        ids = torch.tensor(trained.tokenizer.encode(d.text)[: max_context + 1 + DECODE_STEPS])
        out.append((d.name, ids))
    return out


def eval_stage(a) -> list[dict]:
    trained = _open(run_dir(a, DEFAULT_RECIPE))
    docs = held_out_documents(trained, a.documents, a.max_context)
    contexts = a.contexts
    # the cell names how far it reads, so a sweep to a longer context does
    # not reuse a shorter one's per-token losses
    cells = [
        {
            "model": m,
            "document": name,
            "max_context": a.max_context,
            **({"recipe": DEFAULT_RECIPE} if m == "converted" else {}),
        }  # swa and original: any recipe's run
        for m in ("converted", "swa", "original")
        for name, _ in docs
    ]
    cells += [{"model": "original-decode", "document": f"context-{c}"} for c in contexts]
    rank = {name: i for i, (name, _) in enumerate(docs)}
    by_name = dict(docs)

    def extra(cell: dict) -> dict:  # the original's reach depends on its document's rank
        full = {"original_full_documents": a.original_full_documents} if cell["model"] == "original" else {}
        return {"contexts": ",".join(map(str, contexts)), **full}

    def fields(cell: dict) -> tuple:
        return ("ms_per_token", "state_bytes") if cell["model"] == "original-decode" else ("nll", "wall_s", "load")

    sweep = Sweep(Path(a.runs) / "cells-eval", cells, **checks(a, fields, extra=extra))
    sweep.run(lambda cell: _eval_cell(cell, trained, by_name, rank, contexts, a), desc="eval")
    return sweep.records()


def _open(run: Path):
    return open_run(run)


def _eval_cell(cell, trained, docs, rank, contexts, a) -> dict:
    model = trained.model.model
    load0 = os.getloadavg()[0]
    if cell["model"] == "original-decode":
        c = int(cell["document"].removeprefix("context-"))
        return {**original_decode(model, c), "context": c, "load": round(load0, 2)}
    ids = docs[cell["document"]]
    if cell["model"] == "original":
        limit = a.max_context if rank[cell["document"]] < a.original_full_documents else min(SHORT, a.max_context)
        res = original_nll(model, ids[: limit + 1])
    elif cell["model"] == "swa":
        with model.as_sliding_window(num_sinks=0):  # the window alone (the sinks stage adds them)
            res = converted_nll(model, ids, contexts=contexts, decode_steps=DECODE_STEPS)
    else:
        res = converted_nll(model, ids, contexts=contexts, decode_steps=DECODE_STEPS)
    record = {
        "tokens": int(res.nll.shape[0]),
        "wall_s": round(res.wall_s, 1),
        "load": round(load0, 2),
        "nll": ",".join(f"{x:.5f}" for x in res.nll.tolist()),
    }
    for c, d in res.decode.items():
        record[f"ms_per_token_{c}"] = round(d["ms_per_token"], 2)
        record[f"state_bytes_{c}"] = int(d["state_bytes"])
    return record


def nll_of(record: dict) -> torch.Tensor:
    return torch.tensor([float(x) for x in record["nll"].split(",")], dtype=torch.float64)


# --------------------------------------------------------------------------- attention sinks

SINKS = (0, 1, 4)  # first tokens kept visible next to the window


def sinks_stage(a) -> list[dict]:
    """Per held-out document and number of sinks: the original's per-token
    loss under the window mask (docs/conversion.md §6)."""

    trained = _open(run_dir(a, DEFAULT_RECIPE))
    docs = dict(held_out_documents(trained, a.documents, a.sink_context))
    cells = [
        {"model": "swa-mask", "sinks": k, "document": name, "max_context": a.sink_context}
        for k in SINKS
        for name in docs
    ]

    def cell_fn(cell):
        model, load0 = trained.model.model, os.getloadavg()[0]
        window = model.converted[0].window_size
        res = original_window_nll(
            model, docs[cell["document"]][: a.sink_context + 1], window=window, sinks=cell["sinks"]
        )
        return {
            "window": window,
            "tokens": int(res.nll.shape[0]),
            "wall_s": round(res.wall_s, 1),
            "load": round(load0, 2),
            "nll": ",".join(f"{x:.5f}" for x in res.nll.tolist()),
        }

    sweep = Sweep(Path(a.runs) / "cells-sinks", cells, **checks(a, ("nll", "tokens", "wall_s", "load")))
    sweep.run(cell_fn, desc="sinks")
    return sweep.records()


# --------------------------------------------------------------------------- sample


def sample_stage(a) -> dict:
    cells = [{"sample": "long-context", "context": a.sample_context, "recipe": DEFAULT_RECIPE}]
    sweep = Sweep(Path(a.runs) / "cells-sample", cells, **checks(a, ("generated", "prompt_tokens")))
    return sweep.run(lambda c: _sample_cell(c, a), desc="sample")[0]


@torch.no_grad()
def _sample_cell(cell, a) -> dict:
    trained = _open(run_dir(a, DEFAULT_RECIPE))
    name, ids = held_out_documents(trained, 1, cell["context"] + 64)[0]
    prompt = ids[: cell["context"]]
    model = trained.model.model
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    new = [int(t[0]) for t in model.stream(prompt[None], 60, temperature=0.7, top_k=50, generator=g)]
    tok = trained.tokenizer
    return {
        "document": name,
        "prompt_tokens": int(prompt.shape[0]),
        "prompt_tail": tok.decode(prompt[-120:].tolist()),
        "generated": tok.decode(new),
        "reference": tok.decode(ids[cell["context"] : cell["context"] + 60].tolist()),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
