"""`python -m experiments.convert`: a model converted into Latte-Macchiato
by `latte convert` (by default the shipped SmolLM2-135M run,
runs/convert-smollm2: --converted), evaluated against the original and its
window + sinks twin (docs/evaluation.md §7, docs/conversion.md). Each stage
is a suite of `latte eval` run with the study's budget (suites.py) into its
own results folder, resumable cell by cell there:

  eval       the ppl suite: per-token loss over --documents held-out
             documents of --data up to the largest --contexts; perplexity by
             context and position bucket, decode ms/token and the decoding
             state's bytes at each context -> NAME
  tasks, needle, retrieval, fewshot
             the suites of those names -> NAME-STAGE

Retired, with no live result: the recipes stage (one `latte convert` run per
up-training recipe; results/convert-recipes is in results/archive.md) and
the eval stage's own code (per-corpus tables and statements, its plot, the
window without sinks and the sinks' ablations, the original reading fewer
documents to the longest context): `git show 0862f81:experiments/convert/`
holds them; the stages sinks and sample `git show
77f872f:experiments/convert/stages.py`. The published folders that code
wrote say so in results/README.md.

--converted (a `latte convert` run folder, one of its step-N folders or its
model/ folder) must record the experiment's original (the base of --config
with --set) as its base. --quick converts a tiny stand-in model in --runs
itself (2 steps) and evaluates it.

    python -m experiments.convert --quick                 # tiny stand-in model, seconds (the test)
    python -m experiments.convert --readme results/README.md   # the shipped run: eval, tasks, needle
    python -m experiments.convert --stages eval --data essays --name convert/essays   # another corpus
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from experiments.common.cells import input_digest
from experiments.common.results import claim_work, convert_run
from latte.arguments import checked, int_at_least, int_list, name_list
from latte.data import load_documents, train_bpe
from latte.eval import check_models, open_subject
from latte.train import load_run_config

from .stages import CONTEXTS, DOCUMENTS, NEEDLE_CONTEXTS, NEEDLE_TRIALS, TASK_EXAMPLES
from .suites import FEWSHOT_TASKS, RETRIEVAL_TASKS, STAGES, check_tasks, suite_stage

DEFAULT_STAGES = STAGES[:3]  # retrieval and fewshot on request
DEFAULT_CONVERTED = "runs/convert-smollm2"  # the shipped run: latte convert --config convert/smollm2
# The defaults of the options --quick changes; an option given explicitly wins over either.
FULL = {
    "contexts": ",".join(map(str, CONTEXTS)),
    "documents": DOCUMENTS,
    "data": "plays",
    "threads": 2,
    "needle_contexts": ",".join(map(str, NEEDLE_CONTEXTS)),
    "task_examples": TASK_EXAMPLES,
    "retrieval_contexts": "1024,2048,4096,8192,16384",
    "retrieval_trials": 3,
    "fewshot_tasks": ",".join(FEWSHOT_TASKS),
    "fewshot_examples": 100,
}
QUICK = {
    "contexts": "64,128",
    "documents": 2,
    "data": "validation",
    "threads": 1,
    "needle_contexts": "96,160",
    "task_examples": 4,
    "retrieval_contexts": "400,512",
    "retrieval_trials": 1,
    "fewshot_tasks": "arc_challenge,naturalqs_open",
    "fewshot_examples": 2,
}


def _add_budget_args(p: argparse.ArgumentParser) -> None:
    """The models compared, and the budget of each stage (suites.py)."""
    p.add_argument(
        "--converted",
        default=None,
        help="the converted model evaluated: a latte convert run (its newest checkpoint), one of its "
        f"step-N folders or a model folder (default {DEFAULT_CONVERTED}; --quick: its stand-in)",
    )
    p.add_argument(
        "--models",
        default="original,window+sinks,converted",
        help="models compared: converted, and original and window+sinks (latte eval --against)",
    )
    ints = checked(int_list(low=2))
    p.add_argument("--contexts", default=None, type=ints, help=f"eval stage, tokens ({FULL['contexts']})")
    p.add_argument("--documents", type=int_at_least(1), default=None, help=f"eval stage ({DOCUMENTS})")
    p.add_argument("--data", default=None, help="eval stage: latte eval --data (plays; --quick: validation)")
    p.add_argument("--tasks", default=None, help="zero-shot tasks of the tasks stage (latte eval's)")
    p.add_argument(
        "--task-examples", type=int_at_least(0), default=None, help=f"examples per task (0 = all; {TASK_EXAMPLES})"
    )
    needle = checked(int_list(64, distinct=False))
    p.add_argument("--needle-contexts", default=None, type=needle, help=f"tokens ({FULL['needle_contexts']})")
    p.add_argument("--needle-trials", type=int_at_least(1), default=NEEDLE_TRIALS, help="prompts per (context, depth)")
    p.add_argument("--retrieval-tasks", default=",".join(RETRIEVAL_TASKS), help="tasks of the retrieval stage")
    p.add_argument("--retrieval-contexts", default=None, type=checked(int_list(64)), help="retrieval contexts")
    p.add_argument("--retrieval-trials", default=None, type=int_at_least(1), help="haystack orders (3)")
    p.add_argument("--fewshot-tasks", default=None, help=f"fewshot tasks ({FULL['fewshot_tasks']})")
    p.add_argument("--fewshot-examples", default=None, type=int_at_least(1), help="examples per task (100)")


def results_name(text: str) -> str:
    """--name: a results folder under --out and its README section; NAME/SUB
    (one level) writes OUT/NAME/SUB, section NAME-SUB (tools/readme_tables.py)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*(/[A-Za-z][A-Za-z0-9._-]*)?", text):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME/SUB (letters, digits, '.', '_', '-'), got {text!r}")
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.convert", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--stages",
        default=",".join(DEFAULT_STAGES),
        type=checked(name_list(STAGES)),
        help=f"comma-separated, of {', '.join(STAGES)}",
    )
    p.add_argument("--config", default="convert/smollm2", help="latte convert config naming the original")
    p.add_argument("--set", action="append", default=[], help="extra override of --config (section.field=value)")
    p.add_argument("--runs", default="runs/convert-experiment", help="folder of --quick's stand-in model")
    p.add_argument("--out", default="results", help="the results folders (--name) go here")
    p.add_argument(
        "--name",
        default="convert",
        type=results_name,
        help="results folders NAME, NAME-STAGE and their README sections (another model's results "
        "beside SmolLM2's: e.g. convert/gemma3-270m, section convert-gemma3-270m)",
    )
    _add_budget_args(p)
    p.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads (2)")
    p.add_argument("--readme", default=None, help="replace the sections of --name in this markdown file")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a tiny stand-in model and corpus, seconds (options given explicitly are kept)",
    )
    a = p.parse_args(argv)
    a.user_set = list(a.set)  # --quick adds its own overrides in front (quick_setup)
    a.section = a.name.replace("/", "-")
    for name, value in (QUICK if a.quick else FULL).items():
        if getattr(a, name) is None:
            setattr(a, name, value)
    return a


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    stages = check_args(a)
    claim_work(a.runs, "convert", "--runs", create=True)  # before any work: the one write rule, as --out
    torch.set_num_threads(a.threads)
    if a.quick:
        quick_setup(a)
    check_sets(a)
    a.inputs = {"base": experiment_base(a)}
    model = Path(a.converted or (quick_converted(a) if a.quick else DEFAULT_CONVERTED))
    check_same_base(a, open_subject(model))
    for stage in stages:
        suite_stage(a, argv, stage, model)
    return 0


def experiment_base(a: argparse.Namespace) -> dict:
    """The sha256 of every file of the experiment's original (the base of
    --config with --set: what loading it reads, config.json included)."""
    from latte.convert import base_reference, resolve_base  # optional dependency (extra "hf")

    cfg = load_run_config(a.config, [f"--{s}" for s in a.set])
    folder, gguf = resolve_base(cfg.base.path, cfg.base.gguf_file, where="base")
    return base_reference(folder, gguf)["sha256"]


def check_same_base(a: argparse.Namespace, subject) -> str:
    """The converted model must record the experiment's original as its base
    (sha256 of every file), else every "converted - original" would compare
    it with another model: a ValueError (exit 2) naming the files that
    differ. Returns the sha256 naming the converted model's weights (its
    checkpoint's manifest, or its folder's files)."""
    recorded, base = (getattr(subject.model.config, "base_weights", None) or {}).get("sha256"), a.inputs["base"]
    if recorded != base:
        differ = sorted(
            n for n in {*(recorded or {}), *a.inputs["base"]} if (recorded or {}).get(n) != a.inputs["base"].get(n)
        )
        raise ValueError(
            f"--converted {subject.source}: "
            + (
                f"converted from another base than the experiment's original (sha256 differs for {', '.join(differ)})"
                if recorded
                else "records no base model (a self-contained export); its original cannot be checked"
            )
            + f"; the original here is the base of --config {a.config} with its --set overrides: give the "
            "matching --config/--set base.path, or a model converted from this base"
        )
    checkpoint = subject.run.checkpoint if subject.run is not None else subject.source
    return input_digest(checkpoint)


def check_sets(a: argparse.Namespace) -> None:
    """Every --set is a valid override of --config, before any work."""
    bad = [s for s in a.set if "=" not in s or not s.partition("=")[0].strip()]
    if bad:
        raise ValueError(f"--set {bad[0]!r}: expected SECTION.FIELD=VALUE, e.g. train.steps=100")
    try:
        load_run_config(a.config, [f"--{s}" for s in a.set])
    except ValueError as e:
        given = f"--config {a.config}" + "".join(f" --set {s}" for s in a.user_set)
        raise ValueError(f"{given}: not valid ({e})") from None


def check_args(a: argparse.Namespace) -> list[str]:
    """Parses the list options in place; returns the stages. Errors name the option."""
    from latte.eval import ZERO_SHOT_TASKS

    a.models = check_models(a.models)
    a.tasks = check_tasks(a.tasks or ",".join(ZERO_SHOT_TASKS))
    a.retrieval_tasks = check_tasks(a.retrieval_tasks, RETRIEVAL_TASKS, "--retrieval-tasks")
    a.fewshot_tasks = check_tasks(a.fewshot_tasks, FEWSHOT_TASKS, "--fewshot-tasks")
    a.contexts = sorted({int(x) for x in a.contexts.split(",")})
    a.retrieval_contexts = sorted({int(x) for x in a.retrieval_contexts.split(",")})
    a.needle_contexts = sorted({int(x) for x in a.needle_contexts.split(",")})
    return a.stages.split(",")


def quick_converted(a: argparse.Namespace) -> Path:
    """--quick's converted model: quick_setup's stand-in base converted by
    `latte convert` in RUNS/quick-run (2 steps), once; a finished run is read."""
    run = Path(a.runs) / "quick-run"
    convert_run(a.config, run, a.set, a.threads)
    return run


def quick_setup(a: argparse.Namespace) -> None:
    """A tiny random Llama and a BPE of Python's help text stand in for
    SmolLM2 and its tokenizer: every stage runs in seconds."""
    import transformers as tf  # optional dependency (extra "hf"): only the quick stand-in model needs it here

    root = Path(a.runs) / "quick-base"
    if not (root / "base" / "config.json").is_file():
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(
            vocab_size=320,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
        tf.LlamaForCausalLM(cfg).save_pretrained(root / "base")
        train_bpe((d.text for d in load_documents("pydoc")), vocab_size=320).save(root)
    a.set = [
        f"base.path={root / 'base'}",
        "data.source=pydoc",
        f"data.tokenizer={root / 'tokenizer.json'}",
        "data.seq_len=32",
        f"data.cache_dir={Path(a.runs) / 'cache'}",
        "conversion.window_size=8",
        "conversion.latents_per_head=4",
        "conversion.chunk_size=8",
        "train.steps=2",
        "optim.warmup_steps=1",
        "train.eval_batches=1",
        "train.save_every=0",
        "train.sample_tokens=0",
        "train.time_budget_minutes=null",
        *a.set,
    ]
