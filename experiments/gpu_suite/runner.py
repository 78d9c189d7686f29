"""The runner of `python -m experiments.gpu_suite` (experiments/gpu_suite/stages.py): budgets, one
subprocess per stage, resumable records, the tarball for the device tool.

A stage's record in OUT/suite.json has its status:
  ok       exit 0
  failed   a non-zero exit (for pytest: tests failed; its JUnit XML says which)
  timeout  killed at its own limit (budget_s): not started again unless --redo
           or resumable
  cut      killed because this invocation's budget ran out: started again
           next time
  skipped  not started: a package it needs is missing (the reason says which)
A stage whose expected time does not fit in what is left is deferred (no
record); a later, shorter stage may run in its place.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import site
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from latte.files import atomic_write
from latte.guard import check_folder, claim_folder

from . import kernels, machine
from .state import PACK_WRITER, SUITE_WRITER, load_state, save_state  # noqa: F401 (the runner's API)

PACK_MARGIN_S = 25.0  # kept free at the end of the budget: records, report, tarball
PACK_LIMIT = 15 * 2**20  # the device tool returns files of at most 16 MiB
TERM_GRACE_S = 20.0  # SIGTERM first (training saves a checkpoint and stops), then SIGKILL
RERUN = ("cut",)  # statuses started again by a later invocation (plus timeout/failed when resumable)


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def stage_protocol(stage, quick: bool) -> dict:
    """What a stage's record answers (cells.py's one reuse rule): its exact
    command and the mode; a record of another is run again, never reused."""
    return {"command": _command(stage), "mode": "quick" if quick else "full"}


def _command(stage) -> str:
    return " ".join(f"{k}={v}" for k, v in stage.env) + " " * bool(stage.env) + shlex.join(["python3", *stage.argv])


def _pump(pipe, log, echo: bool) -> None:
    for line in iter(pipe.readline, b""):
        log.write(line)
        log.flush()
        if echo:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()


def _die_with_parent(parent: int) -> None:
    """In a stage's process, before it starts (Linux): SIGTERM when the suite
    dies, even by SIGKILL (PR_SET_PDEATHSIG), so a killed suite never leaves
    its stage writing beside the one the next invocation starts (a training
    stage saves its checkpoint and stops on SIGTERM)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the suite died before the call
        os.kill(os.getpid(), signal.SIGTERM)


OUTSIDE = "<outside the checkout>"


def portable(arg: str, repo: Path) -> str:
    """An argument as the committed records keep it: a path inside the
    checkout relative to it, any other absolute path (the device's $OUT, a
    wheel folder elsewhere) replaced by OUTSIDE, so no record names a machine."""
    key, eq, value = arg.rpartition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
    if not value.startswith("/"):
        return arg
    try:
        value = Path(value).resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        value = OUTSIDE
    return key + eq + value


def _relative_log(log_path: Path, repo: Path) -> None:
    """A stage's log without the machine's paths that tracebacks print: the
    checkout's made relative, the interpreter's site-packages named so."""
    text = log_path.read_text(errors="replace")
    roots = {f"{d}/": "<site-packages>/" for d in site.getsitepackages()} | {f"{repo.resolve()}/": ""}
    new = text
    for root, short in roots.items():
        new = new.replace(root, short)
    if new != text:
        atomic_write(log_path, new)


def run_stage(argv: list[str], env: dict, log_path: Path, limit_s: float, *, echo: bool = True) -> tuple[int, bool]:
    """(exit code, killed) of `python3 argv` in its own process group, output to log_path (and stdout)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n$ {shlex.join(['python3', *argv])}  # {_utc()}\n".encode())
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=functools.partial(_die_with_parent, os.getpid()) if sys.platform == "linux" else None,
        )
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, echo), daemon=True)
        pump.start()
        killed = False
        try:
            proc.wait(timeout=max(limit_s, 1.0))
        except subprocess.TimeoutExpired:
            killed = True
            for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
        pump.join(timeout=10)
    _relative_log(log_path, Path.cwd())
    return proc.returncode, killed


def _should_run(stage, rec: dict | None, redo: list[str], quick: bool = False) -> str | None:
    """None to run it, else why not. A record of another command or mode
    (--quick) is never reused: the stage runs again (and says why)."""
    # on use: the suite starts with the standard library (cells.py's top level is standard library only)
    from experiments.common.cells import describe, protocol_difference

    if rec is None or stage.name in redo:
        return None
    diff = protocol_difference(rec.get("protocol") or {}, stage_protocol(stage, quick))
    if diff:
        print(f"suite: {stage.name}: its record answers another command; running it again ({describe(diff)})")
        return None
    status = rec["status"]
    if status in RERUN or (stage.resumable and status in ("timeout", "failed")):
        return None
    if status == "skipped":
        return None  # its package may be there now
    return f"{status} earlier ({rec.get('wall_s', 0):.0f} s); --redo {stage.name} runs it again"


def _stage_env(stage, base: dict, cache: Path | None = None) -> dict:
    """base with the stage's variables: "{fresh}" a new empty folder, "{kernels}" the kernel cache."""
    extra = {k: (tempfile.mkdtemp(prefix=f"latte-{stage.name}-") if v == "{fresh}" else v) for k, v in stage.env}
    if cache is not None:
        extra = {k: v.replace("{kernels}", str(cache)) for k, v in extra.items()}
    return {**base, **extra}


def uses_kernels(todo: list) -> bool:
    return any("{kernels}" in v for s in todo for _, v in s.env)


def _kernels(args, todo: list, inv: dict) -> Path | None:
    """The kernel cache of the stages that name one (kernels.py): carried in
    from --kernels-from (or its own folder's earlier record) only when the
    GPU, Triton and torch match, else started empty; recorded in inv."""
    if not uses_kernels(todo):
        return None
    cache, here = kernels.folder(args), kernels.key_of(inv["machine"])
    source = getattr(args, "kernels_from", None)
    if source is None and (cache.parent / kernels.RECORD).exists():
        source = cache.parent  # an earlier invocation's cache in place
    held = claim_folder(args.pack, PACK_WRITER, flag="--pack") if args.pack is not None else contextlib.nullcontext()
    with held:  # the cache lives in --pack: written under its write rule (latte/guard.py)
        decision = kernels.carry_in(source, cache, here)
        if not decision["carried_in"]:
            kernels.reset(cache)
        kernels.record(cache, here)
    inv["kernels"] = {**decision, "cache": portable(str(cache.resolve()), Path.cwd()), "machine": here}
    print(f"suite: kernel cache: {json.dumps(decision)}", flush=True)
    return cache


def pack(args, todo: list, state: dict) -> Path | None:
    """OUT and the stages' output folders (no data caches) in PACK/gpu-suite.tar.gz, < 16 MiB."""
    if args.pack is None:
        return None
    with claim_folder(args.pack, PACK_WRITER, flag="--pack"):  # held while writing (latte/guard.py)
        return _pack(args, todo, state)


def _pack(args, todo: list, state: dict) -> Path:
    target = args.pack / "gpu-suite.tar.gz"
    tmp = args.pack / f".gpu-suite.tar.gz.tmp-{os.getpid()}"  # a kill leaves the old tarball or the new one
    extra = [Path(o) for s in todo for o in s.outputs if Path(o).exists()]
    for folders in ([Path(args.out), *extra], [Path(args.out), *(e for e in extra if not str(e).startswith("runs"))]):
        with tarfile.open(tmp, "w:gz") as tar:
            for f in folders:
                tar.add(f, filter=_packed)
        if tmp.stat().st_size <= PACK_LIMIT:
            break
        state.setdefault("notes", []).append(f"{_utc()}: the tarball without run folders (over 15 MiB with them)")
    os.replace(tmp, target)
    readme = Path(args.out) / "README.md"
    if readme.exists():
        atomic_write(args.pack / "README.md", readme.read_text())
    return target


def _packed(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What the tarball keeps: no data caches, no temp files a kill left."""
    name = info.name.rsplit("/", 1)[-1]
    return None if "/cache" in info.name or name.endswith(".cache") or ".tmp-" in name else info


def _finish_stage(args, todo, state) -> None:
    # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
    from .report import write_report

    save_state(args.out, state)
    try:
        write_report(args.out, state)
    except Exception as e:  # noqa: BLE001  a report bug must not lose the stage's files
        print(f"suite: the report failed ({type(e).__name__}: {e}); suite.json is written", flush=True)
    pack(args, todo, state)


def _prepare(args, argv, state) -> tuple[dict, dict]:
    """Probe, install what is missing, probe again; the invocation's record."""
    repo = Path.cwd()
    env = machine.child_env(args.site if args.site.exists() else None, repo)
    before = machine.probe(env)
    installed = machine.install(machine.missing_of(before), args.wheels, args.site)
    env = machine.child_env(args.site if args.site.exists() else None, repo)
    after = machine.probe(env) if installed["installed"] else before
    argv = [portable(a, repo) for a in argv]
    inv = {"started_utc": _utc(), "argv": argv, "budget_s": args.budget_s, "machine": after, "install": installed}
    state["invocations"].append(inv)
    return env, inv


def _refuse(args, state, inv, why: str) -> int:
    print(f"suite: {why}", flush=True)
    inv["outcome"] = why
    save_state(args.out, state)
    return 2


def _stage_record(stage, args, inv: dict, rc: int, killed: bool, limit: float, started: float) -> dict:
    """suite.json's record of a stage that ran: its outcome, and the command
    and mode it answers (stage_protocol)."""
    status = (
        "ok" if rc == 0 and not killed else ("cut" if limit < stage.budget_s else "timeout") if killed else "failed"
    )
    return {
        "status": status,
        "rc": rc,
        "wall_s": round(time.monotonic() - started, 1),
        "limit_s": round(limit, 1),
        "budget_s": stage.budget_s,
        "when_utc": _utc(),
        "gpu": inv["machine"].get("gpu_name") or inv["machine"].get("gpu"),  # stages may run on several machines
        "kernels": None if "kernels" not in inv else "carried in" if inv["kernels"]["carried_in"] else "cold",
        "command": _command(stage),
        "protocol": stage_protocol(stage, args.quick),
        "log": f"logs/{stage.name}.log",
    }


def run(todo: list, args, argv: list[str], *, require_cuda: bool = True, validate: bool = True) -> int:
    """Every stage of todo that is not done, within args.budget_s. Returns 0
    when it ran (the outcomes are in the records), 2 when it could not start."""
    t0 = time.monotonic()
    if args.pack is not None:  # before anything runs: the one write rule (latte/guard.py)
        check_folder(args.pack, PACK_WRITER, flag="--pack")
    with claim_folder(args.out, SUITE_WRITER):  # held until the suite ends: one suite at a time in OUT
        return _run(todo, args, argv, t0, require_cuda=require_cuda, validate=validate)


def _run(todo: list, args, argv: list[str], t0: float, *, require_cuda: bool, validate: bool) -> int:
    """run() with OUT held."""
    import importlib

    # on use: the suite starts with the standard library and installs the rest first (docs/gpu.md §5)
    from .dryrun import dry_run

    state = load_state(args.out)
    env, inv = _prepare(args, argv, state)
    if args.site.exists() and str(args.site) not in sys.path:
        sys.path.insert(0, str(args.site))
        importlib.invalidate_caches()
    print(json.dumps({k: inv["machine"].get(k) for k in ("gpu", "driver", "python", "torch_cuda")}), flush=True)
    print(f"install: {json.dumps(inv['install'])}", flush=True)
    if require_cuda and not inv["machine"].get("cuda_available"):
        return _refuse(args, state, inv, f"no usable CUDA device here: {json.dumps(inv['machine'])[:600]}")
    if validate and dry_run(todo, args, quiet=True) != 0:
        dry_run(todo, args)
        return _refuse(args, state, inv, "the dry run found problems: nothing was run")
    missing = set(machine.missing_of(inv["machine"]))
    cache = _kernels(args, todo, inv)
    inv["ran"] = []
    for stage in todo:
        why = _should_run(stage, state["stages"].get(stage.name), args.redo, args.quick)
        left = args.budget_s - (time.monotonic() - t0) - PACK_MARGIN_S
        lacking = [d for d in missing if machine.what_needs(d) in stage.needs]
        if why:
            print(f"suite: {stage.name}: {why}", flush=True)
            continue
        if lacking:
            rec = {"status": "skipped", "reason": f"needs {', '.join(lacking)} (no wheel in {args.wheels})"}
            state["stages"][stage.name] = {**rec, "when_utc": _utc()}
            print(f"suite: {stage.name}: skipped: {rec['reason']}", flush=True)
            continue
        if left < stage.est_s:
            print(f"suite: {stage.name}: deferred: needs ~{stage.est_s:g} s, {max(left, 0):.0f} s left", flush=True)
            continue
        limit = min(stage.budget_s, left)
        print(f"\nsuite: {stage.name} ({stage.what}), limit {limit:.0f} s", flush=True)
        started = time.monotonic()
        rc, killed = run_stage(
            list(stage.argv), _stage_env(stage, env, cache), Path(args.out) / "logs" / f"{stage.name}.log", limit
        )
        state["stages"][stage.name] = rec = _stage_record(stage, args, inv, rc, killed, limit, started)
        status = rec["status"]
        inv["ran"].append(stage.name)
        print(f"suite: {stage.name}: {status} in {rec['wall_s']:.0f} s (exit {rc})", flush=True)
        _finish_stage(args, todo, state)
    inv["wall_s"] = round(time.monotonic() - t0, 1)
    _finish_stage(args, todo, state)
    print(f"suite: done in {inv['wall_s']:.0f} s; records in {Path(args.out) / 'suite.json'}", flush=True)
    return 0
