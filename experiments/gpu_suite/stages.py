"""`python -m experiments.gpu_suite`: everything issue 26 runs on a GPU, in one resumable
command that fits short GPU windows (docs/gpu.md §5, docs/evaluation.md §1.2).

    python3 -m experiments.gpu_suite --dry-run              # every stage's command checked, no GPU
    python3 -m experiments.gpu_suite --wheels .whl --budget-s 540 --pack "$OUT"
    python3 -m experiments.gpu_suite --loan --wheels .whl --pack "$OUT"  # issue 56 in one loan (loan())

A bare CUDA machine with a copy of the repo is enough: this module and
machine.py use the standard library only until the stages start. In order:
1. what the machine has (torch + CUDA, triton, fla-core, ...; nvidia-smi),
   and the missing packages installed from wheels in --wheels (machine.py);
2. the dry run again, so that a typo costs seconds, not a stage;
3. the stages (STAGES below) in priority order, each a subprocess with its
   own time limit, its log in OUT/logs/, its files in OUT; a stage starts only
   when its expected time fits in what is left of --budget-s, and a later,
   shorter one may run in its place;
4. after every stage: OUT/suite.json (status, wall time, command of every
   stage; the machine of every invocation), OUT/README.md (targets met or
   missed, latte.bench.cuda_report; report.py), and, with --pack DIR, one tarball of
   everything written (DIR/gpu-suite.tar.gz) plus DIR/README.md.
Run it again and it continues: finished stages are not redone (--redo NAME
does), and a cut-off resumable stage continues where it stopped.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path("benchmarks/cuda")
DEFAULT_WORK = Path("runs/gpu")  # run folders of the training stages (ignored by git: carry them)
# --quick writes apart from the full suite's folders and published results
QUICK_OUT, QUICK_WORK, QUICK_RESULTS = Path("benchmarks/cuda-quick"), Path("runs/gpu-quick"), Path("results/quick")
DEFAULT_BUDGET_S = 1140.0  # 19 minutes; one call of the device tool: --budget-s 540
FIRST_RUN_BUDGET_S = 500.0  # --first-run: all the evidence within 8.5 minutes, compiles included
# --loan (issue 56): one 15-minute loan holds the machine's start, one call of LOAN_BUDGET_S and a
# second call that reruns the longest stage (probe and install again, then the stage)
LOAN_S, MACHINE_START_S, PROBE_S, LOAN_BUDGET_S = 900.0, 120.0, 35.0, 530.0
COMPILE_TESTS = "tests/gpu/test_cuda_compile.py"  # the compile-heavy tests/gpu, run last


@dataclass(frozen=True)
class Stage:
    """One step of the suite: `python3 ARGV...` with its limits.

    budget_s: its own wall-clock limit; est_s: what it usually takes (it
    starts only when that fits in what is left); needs: the REQUIREMENTS
    groups (machine.REQUIREMENTS) without which it cannot run; env: extra variables
    ("{fresh}" becomes a new empty folder); resumable: started again after a
    cut-off, it continues; outputs: folders it writes besides OUT."""

    name: str
    argv: tuple[str, ...]
    budget_s: float
    est_s: float
    needs: tuple[str, ...] = ("core",)  # hard needs; a missing fla-core only turns fla rows "unavailable"
    env: tuple[tuple[str, str], ...] = ()
    optional: bool = False
    resumable: bool = False
    outputs: tuple[str, ...] = ()
    what: str = ""


def _pytest(out: Path, junit: str, *paths: str) -> tuple[str, ...]:
    where = paths or ("tests/gpu",)
    return ("-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *where, f"--junitxml={out / junit}")


def _bench(name: str, out: Path, quick: bool, *rest: str) -> tuple[str, ...]:
    """`latte bench NAME` for the package's benchmarks, `python -m benchmarks.NAME` for the repository's."""
    command = ("-m", f"benchmarks.{name}") if name in ("train", "window") else ("-m", "latte", "bench", name)
    return (*command, "--out", str(out), *(("--quick",) if quick else ()), *rest)


LRA_OVERRIDES = (  # the LRA protocol's ListOps budget: 5K steps x batch 32; warm-up 1/16 of the steps
    "train.steps=5000",
    "train.global_batch_size=32",
    "optim.warmup_steps=312",
    "train.eval_every=500",
    "train.save_every=250",
    "data.num_workers=8",
)
CONTEXTS = "1024,4096,16384,65536,131072"
LM_SETS = ("data.seq_len=512", "model.window_size=128", "model.max_position_embeddings=512", "train.steps=300")


def _benches(out: Path, quick: bool) -> list[Stage]:
    """The measurements: tests, correctness and speed (limits and expected seconds are guesses;
    the first run's, in first_run(), were measured on an H200)."""
    ieee = (("TRITON_F32_DEFAULT", "ieee"), ("TRITON_CACHE_DIR", "{fresh}"))
    ops = ("--device", "cuda", "--point-cap", "60", "--time-budget", "330")
    full = lambda *a: () if quick else a  # noqa: E731  arguments of the full-size run only
    return [
        Stage("tests", _pytest(out, "tests-tf32.xml"), 420, 240, ("core", "tests"), what="tests/gpu, TF32"),
        Stage("check", _bench("check", out, quick, "--device", "cuda"), 180, 60, what="fla vs float64 on the device"),
        Stage(
            "ops-bf16",
            _bench("ops", out, quick, *ops, "--dtype", "bfloat16"),
            420,
            300,
            what="latte-fla vs sdpa (flash) vs chunk_gla vs torch, 1K..128K, bfloat16",
        ),
        Stage(
            "train",
            _bench("train", out, quick, "--device", "cuda", *full("--tokens-per-step", "32768")),
            360,
            180,
            what="Table 6 model, one AdamW step per mixer: tokens/s",
        ),
        Stage(
            "decode",
            _bench("decode", out, quick, "--device", "cuda", "--prefill-cap", "60", *full("--contexts", CONTEXTS)),
            300,
            120,
            what="ms/token from the state vs the SDPA KV cache, 1K..128K",
        ),
        Stage("tests-ieee", _pytest(out, "tests-ieee.xml"), 420, 180, ("core", "tests"), ieee, what="tests/gpu, IEEE"),
        Stage(
            "ops-fp32",
            _bench("ops", out, quick, *ops, "--dtype", "float32", "--providers", "latte,latte-fla,fla-gla,sdpa"),
            420,
            240,
            what="the sweep in float32 (no macchiato)",
        ),
        Stage(
            "window",
            _bench("window", out, quick, "--device", "cuda", *full("--seqs", "1024,4096,16384")),
            360,
            180,
            what="Macchiato's window: tiles vs flex vs sdpa",
        ),
    ]


def stages(out: Path = DEFAULT_OUT, work: Path = DEFAULT_WORK, quick: bool = False) -> list[Stage]:
    """The suite, in priority order (what a 10-minute window must not miss first)."""
    q = ("--quick",) if quick else ()
    results = QUICK_RESULTS if quick else Path("results")
    return _benches(out, quick) + [
        Stage(
            "lra",
            ("-m", "experiments.lra", "--tasks", "listops", "--mixers", "latte", "softmax", "linear")
            + ("--parts", "train", "--work", str(work / "lra"), "--out", str(results / "lra-gpu"), *q)
            + (() if quick else ("--override", *LRA_OVERRIDES)),
            1800,
            300,
            optional=True,
            resumable=True,
            outputs=(str(results / "lra-gpu"), str(work / "lra")),
            what="ListOps at the LRA budget (5K steps x 32), latte/softmax/linear",
        ),
        Stage(
            "lm",
            ("-m", "experiments.lm_variants", "--variants", "softmax,latte-conv_rglru,macchiato,swa")
            + (
                "--seeds",
                "0",
                "--stages",
                "train",
                "--runs",
                str(work / "lm"),
                "--results",
                str(results / "gpu-seq512"),
            )
            + q
            + tuple(x for s in (() if quick else LM_SETS) for x in ("--set", s)),
            1200,
            300,
            ("core", "lm"),
            (("LATTE_BACKEND", "auto"),),
            optional=True,
            resumable=True,
            outputs=(str(results / "gpu-seq512"), str(work / "lm")),
            what="LM variants at sequence 512, one token budget",
        ),
    ]


def first_run(out: Path = DEFAULT_OUT, work: Path = DEFAULT_WORK, quick: bool = False) -> list[Stage]:
    """`--first-run` (issue 42): one call on a bare GPU machine, each stage
    smaller than the full suite's, under one hard deadline (FIRST_RUN_BUDGET_S);
    Triton's kernel cache kept in WORK/triton-kernels (packed with the
    results) so that a second call starts warm."""
    env = (("TRITON_CACHE_DIR", str(work / "triton-kernels")),)
    kernels = (str(work / "triton-kernels"),)
    providers = "latte,latte-fla,latte-fla-compiled,latte-fla-fused,fla-gla,fla-gate,sdpa"
    ops = ("--device", "cuda", "--dtype", "bfloat16", "--providers", providers)
    ops += () if quick else ("--seqs", "4096,16384,65536", "--tokens", "65536")
    full = lambda *a: () if quick else a  # noqa: E731  arguments of the full-size run only
    return [
        Stage("first-tests", _pytest(out, "tests-tf32.xml"), 240, 200, ("core", "tests"), env, outputs=kernels,
              what="tests/gpu, TF32"),
        Stage("first-check", _bench("check", out, quick, "--device", "cuda", *full("--seqs", "256,4096")), 60, 35,
              env=env, outputs=kernels, what="fla and torch vs float64 on the device, T 256 and 4096"),
        Stage("first-ops", _bench("ops", out, quick, *ops, "--point-cap", "15", "--time-budget", "120"), 150, 115,
              env=env, outputs=kernels,
              what="latte (torch; fla eager, compiled, fused), chunk_gla, the gate, sdpa: 4K-64K bf16"),
        Stage("first-train", _bench("train", out, quick, "--device", "cuda", *full("--tokens-per-step", "16384")),
              100, 75, env=env, outputs=kernels, what="Table 6 model, one AdamW step per mixer: tokens/s"),
        Stage("first-decode", _bench("decode", out, quick, "--device", "cuda", "--prefill-cap", "20",
                                     *full("--contexts", "1024,16384,131072")),
              75, 50, env=env, outputs=kernels, what="ms/token from the state vs the KV cache, to 128K"),
    ]  # fmt: skip


def loan(out: Path = DEFAULT_OUT, work: Path = DEFAULT_WORK, quick: bool = False) -> list[Stage]:
    """`--loan` (issue 56): everything measured within one 15-minute loan, in
    priority order: ops, decode (1K, 16K and 128K from synthetic states, the
    captured step of latte, Macchiato and softmax), train, then tests/gpu
    (the fast files first, the compile-heavy one last). Every stage compiles
    into one kernel cache that travels back and, on a matching machine, in
    again (kernels.py); the whole fits LOAN_S with a rerun (loan_fit)."""
    env = (("TRITON_CACHE_DIR", "{kernels}/triton"), ("TORCHINDUCTOR_CACHE_DIR", "{kernels}/inductor"))
    providers = "latte-fla,latte-fla-compiled,latte-fla-fused,fla-gla,fla-gate,sdpa"
    ops = ("--device", "cuda", "--dtype", "bfloat16", "--providers", providers)
    ops += () if quick else ("--seqs", "4096,16384,65536", "--tokens", "65536")
    full = lambda *a: () if quick else a  # noqa: E731  arguments of the full-size run only
    decode = ("--device", "cuda", "--synthetic-state", "--mixers", "latte,macchiato,softmax")
    fast = ("tests/gpu", f"--ignore={COMPILE_TESTS}")
    # the 2026-11-28 loan: 5 fla variants at T 512 and 4096 took over 90 s, tests/gpu 114 s (docs/gpu.md §5.3)
    train = ("--mixers", "latte,macchiato,softmax", "--backends", "fla")
    return [
        Stage("loan-ops", _bench("ops", out, quick, *ops, "--point-cap", "15", "--time-budget", "120"), 150, 110,
              env=env, what="latte (fla: eager, compiled, fused), chunk_gla, the gate, sdpa: 4K-64K bf16"),
        Stage("loan-decode", _bench("decode", out, quick, *decode, *full("--contexts", "1024,16384,131072")),
              90, 60, env=env, what="captured decode step at 1K, 16K, 128K from synthetic states"),
        Stage("loan-train", _bench("train", out, quick, "--device", "cuda", *train, *full("--tokens-per-step", "16384",
              "--seqs", "4096")), 150, 90, env=env, what="Table 6 model, one AdamW step per mixer, T 4096: tokens/s"),
        Stage("loan-tests", _pytest(out, "tests-tf32.xml", *fast), 150, 125, ("core", "tests"), env,
              what="tests/gpu without the compile-heavy file, TF32"),
        Stage("loan-tests-compile", _pytest(out, "tests-compile-tf32.xml", COMPILE_TESTS), 150, 80,
              ("core", "tests"), env, what="tests/gpu's compile-heavy file, TF32"),
    ]  # fmt: skip


def loan_fit(todo: list[Stage], budget_s: float, margin_s: float) -> tuple[bool, float, list[str]]:
    """(whether it fits LOAN_S, seconds one loan takes, the sum spelt out):
    the machine's start, one call (the probe, the stages, the records; at
    most budget_s, and every stage must fit in it) and a second call that
    reruns the longest stage."""
    stages_s = sum(s.est_s for s in todo if not s.optional)
    call = PROBE_S + stages_s + margin_s
    rerun = PROBE_S + max((s.est_s for s in todo), default=0.0) + margin_s
    total = MACHINE_START_S + max(call, budget_s) + rerun
    lines = [
        f"one call: probe {PROBE_S:g} s + stages {stages_s:g} s + records {margin_s:g} s = {call:g} s "
        f"(budget {budget_s:g} s)",
        f"one loan: start {MACHINE_START_S:g} s + the call {max(call, budget_s):g} s + a rerun of the longest "
        f"stage {rerun:g} s = {total:g} s of {LOAN_S:g} s",
    ]
    fits = call <= budget_s and total <= LOAN_S
    if not fits:
        lines.append(
            f"[ERROR] --loan: the stages do not fit one {LOAN_S:g} s loan with a rerun (--budget-s {budget_s:g})"
        )
    return fits, total, lines


def plan(args) -> list[Stage]:
    """Every stage of the plan the flags name (the suite, --first-run or --loan)."""
    every = first_run if getattr(args, "first_run", False) else loan if getattr(args, "loan", False) else stages
    return every(args.out, args.work, args.quick)


def parse_args(argv=None, names: list[str] | None = None):
    p = argparse.ArgumentParser(
        allow_abbrev=False, prog="python -m experiments.gpu_suite", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the suite's folder (default benchmarks/cuda; --quick: benchmarks/cuda-quick)",
    )
    p.add_argument(
        "--work", type=Path, default=None, help="run folders of the training stages (runs/gpu, runs/gpu-quick)"
    )
    p.add_argument("--wheels", type=Path, default=Path(".whl"), help="wheels of the missing packages (.whl/)")
    p.add_argument("--site", type=Path, default=Path("/tmp/latte-gpu-site"), help="where the wheels are installed")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for this invocation (default 1140; 500 first run; 530 loan)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--first-run", action="store_true", help="the first-run stages only, 500 s in all (first_run)")
    which.add_argument("--loan", action="store_true", help="issue 56's stages, one 15-minute loan (loan)")
    p.add_argument(
        "--kernels-from",
        type=Path,
        default=None,
        help="a folder holding kernel-cache/ and kernel-cache.json of an earlier loan (--loan; kernels.py)",
    )
    p.add_argument("--stages", default=None, help="comma-separated subset, in the suite's order (default all)")
    p.add_argument("--skip", default="", help="comma-separated stages to leave out")
    p.add_argument("--no-optional", action="store_true", help="leave out the optional stages (lra, lm)")
    p.add_argument("--redo", default="", help="comma-separated stages to run again although recorded")
    p.add_argument("--pack", type=Path, default=None, help="after each stage, tarball everything written here")
    p.add_argument("--quick", action="store_true", help="every stage at its tiny size (checks the plumbing)")
    p.add_argument("--dry-run", action="store_true", help="check every stage's command; run nothing")
    p.add_argument("--report-only", action="store_true", help="rewrite OUT's tables from its JSON; run nothing")
    args = p.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = FIRST_RUN_BUDGET_S if args.first_run else LOAN_BUDGET_S if args.loan else DEFAULT_BUDGET_S
    names = names or [s.name for s in (first_run() if args.first_run else loan() if args.loan else stages())]
    for flag in ("stages", "skip", "redo"):
        given = [x for x in (getattr(args, flag) or "").split(",") if x]
        bad = [x for x in given if x not in names]
        if bad:
            p.error(f"--{flag}: unknown stage(s) {bad}; the stages are {', '.join(names)}")
        setattr(args, flag, given)
    if args.kernels_from is not None and not (args.loan and args.kernels_from.is_dir()):
        why = "no such folder" if args.loan else "only with --loan"
        p.error(f"--kernels-from {args.kernels_from}: {why} (a folder holding kernel-cache/ and kernel-cache.json)")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        p.error(f"--budget-s: expected a finite number of seconds > 0, got {args.budget_s:g}")
    args.out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    args.work = args.work or (QUICK_WORK if args.quick else DEFAULT_WORK)
    return args


def selected(args) -> list[Stage]:
    every = plan(args)
    return [
        s
        for s in every
        if (not args.stages or s.name in args.stages)
        and s.name not in args.skip
        and not (args.no_optional and s.optional and s.name not in args.stages)
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return _main(args, argv)
    except ValueError as e:  # a folder the write rule refuses, a damaged suite.json: exit 2 naming it
        print(f"python -m experiments.gpu_suite: {e}", file=sys.stderr)
        return 2


def _main(args, argv) -> int:
    # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
    from . import runner

    if args.report_only:
        # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
        from .report import regenerate

        for path in regenerate(args.out):
            print(f"wrote {path}")
        return 0
    todo = selected(args)
    if args.dry_run:
        # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
        from .dryrun import dry_run

        fit = loan_fit(todo, args.budget_s, runner.PACK_MARGIN_S) if args.loan else None
        return dry_run(todo, args, fit=fit)
    return runner.run(todo, args, argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
