"""The dry run of `python -m experiments.gpu_suite`: every stage's command checked without
a GPU, so that GPU time is never spent on a typo (docs/gpu.md §5).

For each stage: the benchmark's or experiment's own argument parser on the
stage's arguments, the points a CUDA ops sweep would measure, the run
configs an experiment would load (with its overrides: a misspelt field is a
ValueError here), the test folder, and whether the output folders can be
written. The packages each stage needs are listed as found here, to be
installed from a wheel in --wheels, or missing (a warning: the GPU machine
is another machine). Exit code 2 when any command is wrong.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import shlex
from pathlib import Path

from latte.guard import check_folder

from . import machine
from .state import PACK_WRITER, SUITE_WRITER

BENCH_MODULES = {
    "ops": "latte.bench.ops",
    "train": "benchmarks.train",
    "decode": "latte.bench.decode",
    "window": "benchmarks.window",
    "check": "latte.bench.cuda_check",
}


def _parse(parse_args, argv: list[str]):
    """(namespace, None) or (None, the parser's message)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse_args(argv), None
    except SystemExit:
        lines = [x for x in err.getvalue().strip().splitlines() if x.strip()]
        return None, lines[-1] if lines else "the argument parser exited"
    except ValueError as e:
        return None, str(e)


def _writable(folder: Path) -> str | None:
    folder = Path(folder)
    parent = next((p for p in [folder, *folder.parents] if p.exists()), Path("."))
    if not parent.is_dir() or not (parent.stat().st_mode & 0o200):
        return f"{folder}: cannot be created under {parent}"
    return None


def folder_problems(args) -> list[str]:
    """OUT and --pack against the write rule the real run applies first
    (latte/guard.py), as messages."""
    found, pack = [], getattr(args, "pack", None)
    for folder, writer, flag in ((args.out, SUITE_WRITER, "--out"), (pack, PACK_WRITER, "--pack")):
        try:
            if folder is not None:
                check_folder(folder, writer, flag=flag)
        except ValueError as e:
            found.append(str(e))
    return found


def _rule(*folders) -> list[str]:
    """An experiment's folders (flag, folder, "results" or "work", experiment)
    against the write rule its own main applies before any work."""
    from experiments.common.results import claim_results, claim_work

    found = []
    for flag, folder, kind, experiment in folders:
        try:
            (claim_work if kind == "work" else claim_results)(folder, experiment, flag, create=False)
        except ValueError as e:
            found.append(str(e))
    return found


def _check_bench(name: str, rest: list[str]) -> tuple[list[str], str]:
    if name not in BENCH_MODULES:
        return [f"unknown benchmark {name!r}; expected one of {list(BENCH_MODULES)}"], ""
    mod = importlib.import_module(BENCH_MODULES[name])
    args, err = _parse(mod.parse_args, rest)
    if err:
        return [f"latte bench {name}: {err}"], ""
    problems = [p for p in [_writable(args.out)] if p]
    detail = ""
    if name == "ops" and args.device == "cuda":
        # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
        from latte.bench import cuda_plan

        pts = cuda_plan(args)
        if not pts:
            problems.append("latte bench ops --device cuda: no point to measure")
        Ts = sorted({p["T"] for p in pts})
        detail = f"{len(pts)} points, T {Ts[0]}..{Ts[-1]}, batch x T {args.tokens}" if pts else ""
    return problems, detail


def _check_lra(rest: list[str]) -> tuple[list[str], str]:
    # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
    from experiments.lra import study as lra
    from latte.train import load_run_config

    args, err = _parse(lra.parse_args, rest)
    if err:
        return [f"python -m experiments.lra: {err}"], ""
    problems = _rule(("--out", args.out, "results", lra.NAME), ("--work", args.work, "work", lra.NAME))
    quick = list(lra.QUICK) if args.quick else []
    cfg = None
    for task in args.tasks:
        for mixer in args.mixers:
            config, overrides = lra.train_overrides(task, mixer, Path(args.work), [*quick, *args.override])
            try:
                cfg = load_run_config(config, overrides)
            except ValueError as e:
                problems.append(f"lra {task}/{mixer}: {e}")
    detail = f"{len(args.tasks) * len(args.mixers)} runs" + (
        f", {cfg.train.steps} steps x {cfg.train.global_batch_size}" if cfg is not None else ""
    )
    return problems, detail


def _check_lm(rest: list[str]) -> tuple[list[str], str]:
    # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
    from experiments.lm_variants import study as lm
    from latte.train import load_run_config

    args, err = _parse(lm.parse_args, rest)
    if err:
        return [f"python -m experiments.lm_variants: {err}"], ""
    problems = _rule(("--runs", args.runs, "work", "lm-variants"))
    try:  # the result folders of its stages, as its main checks them
        lm._check_outputs(lm.stage_outputs(args.results, args.plan_.name), args.stages.split(","))
    except ValueError as e:
        problems.append(str(e))
    sets = (lm.QUICK_SET if args.quick else []) + args.set
    for v in args.variants.split(","):
        try:
            cfg = load_run_config(lm.VARIANTS[v][0], [f"train.run_dir={args.runs}/{v}/seed-0", *sets])
        except ValueError as e:
            problems.append(f"lm-variants {v}: {e}")
    if problems:
        return problems, ""
    d, t = cfg.data, cfg.train
    tokens = t.steps * t.global_batch_size * d.seq_len
    return [], f"seq {d.seq_len}, {t.steps} steps x {t.global_batch_size} = {tokens:,} tokens"


def check_stage(stage) -> tuple[list[str], str]:
    """(problems, a one-line summary of what it would do)."""
    try:
        return _check_argv(list(stage.argv))
    except ImportError as e:  # no torch here, say: the command cannot be checked on this machine
        return [f"cannot be checked here: {type(e).__name__}: {e}"], ""


def _check_argv(argv: list[str]) -> tuple[list[str], str]:
    if argv[:2] == ["-m", "pytest"]:
        tests = [a for i, a in enumerate(argv[2:], 2) if not a.startswith("-") and argv[i - 1] != "-p"]
        junit = [a.split("=", 1)[1] for a in argv if a.startswith("--junitxml=")]
        problems = [f"{t}: no such test folder" for t in tests if not Path(t).exists()]
        problems += [p for p in (_writable(Path(j).parent) for j in junit) if p]
        ignored = {Path(a.split("=", 1)[1]) for a in argv if a.startswith("--ignore=")}
        problems += [f"--ignore={i}: no such test file" for i in sorted(ignored) if not i.exists()]
        files = {f for t in map(Path, tests) for f in ([t] if t.is_file() else t.glob("test_*.py"))} - ignored
        return problems, f"{len(files)} test files"
    if argv[:3] == ["-m", "latte", "bench"] and len(argv) > 3:
        return _check_bench(argv[3], argv[4:])
    if argv[:1] == ["-m"] and argv[1:2] and argv[1].startswith("benchmarks."):
        return _check_bench(argv[1].removeprefix("benchmarks."), argv[2:])
    if argv[:2] == ["-m", "experiments.lra"]:
        return _check_lra(argv[2:])
    if argv[:2] == ["-m", "experiments.lm_variants"]:
        return _check_lm(argv[2:])
    return [f"{shlex.join(argv)}: not a command the dry run knows how to check"], ""


def packages_here(wheels: Path) -> dict[str, str]:
    """{distribution: "found" | "wheel NAME" | "MISSING"} for this interpreter."""
    dists = [d for d, m, _ in machine.REQUIREMENTS if importlib.util.find_spec(m) is None]
    found, _ = machine.wheels_for(dists, wheels)
    out = {d: "found" for d, _, _ in machine.REQUIREMENTS}
    out.update({d: f"wheel {found[d].name}" if d in found else "MISSING" for d in dists})
    return out


def dry_run(todo: list, args, *, quiet: bool = False, fit: tuple | None = None) -> int:
    """0 when every stage's command checks (and, with `fit` from
    stages.loan_fit, the loan holds them with a rerun), else 2."""
    have = packages_here(args.wheels)
    problems = 0
    say = (lambda *_: None) if quiet else print
    say(f"python -m experiments.gpu_suite --dry-run: {len(todo)} stages, budget {args.budget_s:g} s per invocation")
    absent = [f"{d} ({v})" for d, v in have.items() if v != "found"]
    say("packages not importable here: " + (", ".join(absent) if absent else "none"))
    for problem in folder_problems(args):  # the real run refuses these before any stage
        problems += 1
        say(f"\n[ERROR] {problem}")
    for s in todo:
        bad, detail = check_stage(s)
        needs = [d for d, _, w in machine.REQUIREMENTS if w in s.needs and have[d] != "found"]
        problems += len(bad)
        flags = " (optional, resumable)" if s.optional else ""
        say(f"\n[{'ok' if not bad else 'ERROR'}] {s.name}{flags}: {s.what}; ~{s.est_s:g} s, limit {s.budget_s:g} s")
        say("    " + " ".join(f"{k}={v}" for k, v in s.env) + (" " if s.env else "") + shlex.join(["python3", *s.argv]))
        for line in ([detail] if detail else []) + [f"problem: {b}" for b in bad]:
            say(f"    {line}")
        if needs:
            say("    packages: " + ", ".join(f"{d} ({have[d]})" for d in needs))
    core = sum(s.est_s for s in todo if not s.optional)
    say(
        f"\nexpected ~{core:g} s for the non-optional stages (+{sum(s.est_s for s in todo if s.optional):g} s optional)"
    )
    if fit is not None:  # --loan: (fits, seconds, lines)
        for line in fit[2]:
            say(line)
        problems += not fit[0]
    say("dry run: " + ("every command checked" if not problems else f"{problems} problem(s)"))
    return 2 if problems else 0
