"""Resumable sweeps and result files shared by every experiment.

A sweep is a list of cells (flat dicts) run by cells.Sweep, the one reuse
rule of every sweep (a finished cell is reused only when its recorded
protocol and inputs match the command's exactly). The results of an
experiment are written to `OUT/` (a folder the one write rule of
latte/guard.py allows: new, empty or written by the same experiment) as:

- `results.json`: a list of flat records (one per cell or row),
- `results.md`: a header naming the command, machine, threads and wall time,
  then the experiment's tables,
- `run.json`: the same provenance as data (command, machine, threads, wall_s),
- PNG plots written by the experiment itself.

A README section between `<!-- results:NAME:start -->` and
`<!-- results:NAME:end -->` is replaced by `results.md` when asked, so every
number in the README comes from these files.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from experiments import COMMANDS, MOVED
from latte.files import atomic_write
from latte.guard import check_folder, check_place, claim_folder, written_by
from latte.reporting import machine_info, update_readme

# the one reuse rule lives in cells.py; these names are re-exported for the sweeps
from .cells import (  # noqa: F401
    NOT_PROTOCOL,
    PROTOCOL,
    ProtocolMismatch,
    Sweep,
    cell_key,
    protocol_sets,
    read_cell,
    read_json,
)


def writer_of(command: str) -> str:
    """The writer a results folder's marker names (latte/guard.py): `latte
    experiment NAME` (the name the markers keep from the retired verb) for
    the experiment a run.json command ran, in either form (`python -m
    experiments.MODULE ...` or the recorded `latte experiment NAME ...`)."""
    words = shlex.split(command)
    if words[:2] == ["latte", "experiment"] and len(words) > 2:
        return " ".join(words[:3])
    if words[:2] in (["python", "-m"], ["python3", "-m"]) and len(words) > 2:
        names = {**MOVED, **{module: name for name, module in COMMANDS.items()}}
        return f"latte experiment {names.get(words[2], words[2])}"
    return " ".join(words[:3])


def moved_command(command: str) -> str | None:
    """The command a recorded `python -m MODULE ...` runs as today when its
    study has moved to a folder of its own (experiments.MOVED), else None."""
    words = shlex.split(command)
    if words[:2] != ["python", "-m"] or len(words) < 3 or words[2] not in MOVED:
        return None
    return shlex.join(["python", "-m", COMMANDS[MOVED[words[2]]], *words[3:]])


def annotate_moved(folder: str | Path) -> bool:
    """Says under a results folder's recorded command the command it runs as
    today (run.json: command_now; results.md: a line below the command),
    when its study has moved; True when it added them."""
    folder = Path(folder)
    run = read_json(folder / "run.json")
    now = moved_command(run["command"])
    if now is None or run.get("command_now") == now:
        return False
    atomic_write(folder / "run.json", json.dumps({**run, "command_now": now}, indent=1) + "\n")
    md = (folder / "results.md").read_text()
    line = f"Command: `{run['command']}`\n"
    note = f'\nRun today as `{now}` (the study moved: experiments/README.md, "Moved").\n'
    atomic_write(folder / "results.md", md.replace(line, line + note, 1))
    return True


def claim_results(out: str | Path, experiment: str, flag: str = "--out", *, create: bool = True) -> Path:
    """OUT is a folder the experiment EXPERIMENT may write (latte/guard.py:
    new, empty or its own), else a WriteRefused naming it; with `create`
    (right before the first file is written) created and marked; without
    (before any work) only checked. write_results holds it while it writes."""
    writer = f"latte experiment {experiment}"
    if not create:
        return check_folder(out, writer, flag=flag)
    with claim_folder(out, writer, flag=flag) as folder:
        return folder


def claim_work(folder: str | Path, experiment: str, flag: str = "--work", *, create: bool = False) -> Path:
    """FOLDER (--work, --runs: run folders and sweep cells) checked like
    --out (latte/guard.py), before any work and in dry runs: new, empty or
    written by an experiment (the convert experiments share theirs), or one
    that holds a sweep's cells or convert's quick stand-ins already (cells/,
    .cells/, cells-*/, quick-base/: a work folder from before they were
    marked, or one quick_setup made); never a run, a checkpoint, a
    model's folder or inside one, nor another folder of files (a corpus:
    cells written there would change its hash). With `create` (right before
    the first file is written) a new or empty one is created and marked."""
    path = Path(folder)
    owner = written_by(path) if path.is_dir() else None
    if (owner or "").startswith("latte experiment ") or _holds_cells(path):
        return check_place(path, flag=flag)
    return claim_results(path, experiment, flag, create=create)


def _holds_cells(folder: Path) -> bool:
    """The folder holds a sweep's cell folders (cells.Sweep's layout) or the
    stand-in base of the convert experiments' --quick (convert.quick_setup)."""
    names = {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()
    return bool(names & {"cells", ".cells", "quick-base"}) or any(n.startswith("cells-") for n in names)


def check_readme(readme: str | Path | None, names, kind: str = "results") -> None:
    """Before any work: the markdown file given to --readme exists and holds
    the sections that will be replaced (`<!-- KIND:NAME:start/end -->`)."""
    if readme is None:
        return
    path = Path(readme)
    if not path.is_file():
        raise ValueError(f"--readme {readme}: no such file (the repository's is results/README.md)")
    text = path.read_text(encoding="utf-8")
    missing = [n for n in names if f"<!-- {kind}:{n}:start -->" not in text or f"<!-- {kind}:{n}:end -->" not in text]
    if missing:
        raise ValueError(
            f"--readme {readme}: no section markers for {', '.join(missing)} "
            f"(add `<!-- {kind}:{missing[0]}:start -->` and `<!-- {kind}:{missing[0]}:end -->` where it goes)"
        )


class StepClock:
    """Time of training steps alone (evaluations excluded), split by
    evaluation interval and by epoch: start(epoch) / stop() around each step,
    interval() at each evaluation. Wall time, and the CPU time of the calling
    thread: with one torch thread that is the step's own work, which other jobs
    on a shared machine stretch far less than its wall time."""

    def __init__(self) -> None:
        self.total_s, self.cpu_s, self.epoch_s, self.interval_ms, self.interval_cpu_ms = 0.0, 0.0, [], [], []
        self._t = self._c = self._interval_s = self._interval_c = 0.0
        self._steps = 0

    def start(self, epoch: int) -> None:
        if len(self.epoch_s) < epoch:
            self.epoch_s.append(0.0)
        self._t, self._c = time.perf_counter(), time.thread_time()

    def stop(self) -> None:
        dt, dc = time.perf_counter() - self._t, time.thread_time() - self._c
        self.total_s += dt
        self.cpu_s += dc
        self._interval_s += dt
        self._interval_c += dc
        self._steps += 1
        self.epoch_s[-1] = round(self.epoch_s[-1] + dt, 2)

    def interval(self) -> None:
        n = max(self._steps, 1)
        self.interval_ms.append(round(1000 * self._interval_s / n, 1))
        self.interval_cpu_ms.append(round(1000 * self._interval_c / n, 1))
        self._interval_s = self._interval_c = 0.0
        self._steps = 0


def utc_deadline(text: str | None, option: str) -> float | None:
    """A UTC wall-clock time like 2026-11-22T18:45 as a time.time() value."""
    if text is None:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected a UTC time like 2026-11-22T18:45") from None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def provenance(experiment: str, argv: list[str], started: float, **extra) -> dict:
    """What made a result: the exact command (`python -m experiments.NAME ARGS`,
    run from the repository root), the machine, threads and wall time since
    `started` (time.time())."""
    module = COMMANDS.get(experiment, f"experiments.{experiment.replace('-', '_')}")
    command = shlex.join(["python", "-m", module, *argv])
    return {"command": command, "machine": machine_info(), "wall_s": round(time.time() - started, 1), **extra}


def write_results(
    out_dir: str | Path,
    name: str,
    records: list[dict],
    tables_md: str,
    run: dict,
    *,
    readme: str | Path | None = None,
    images: Iterable[str] = (),
) -> Path:
    """results.json, results.md and run.json in out_dir; the README section
    `results:NAME` is replaced by results.md when `readme` is given. `images`:
    PNG file names in out_dir, linked at the end (relative to out_dir in
    results.md, to the README's folder in the README)."""
    out = Path(out_dir)
    if not records:  # a stub would replace the published files and README section
        raise ValueError(f"{name}: no records to write; {out} and the README are left as they were")
    check_folder(out, writer_of(run["command"]))  # the one write rule (latte/guard.py), before the checks below
    for r in records:
        bad = [k for k, v in r.items() if isinstance(v, (dict, list))]
        if bad:
            raise ValueError(f"{name}: result records must be flat; fields {bad} hold {type(r[bad[0]]).__name__}")
    m = run["machine"]
    load = m.get("loadavg_start")
    # a --report-only invocation trains nothing: its seconds are not the runs' (their tables hold those)
    wall = "wall time of this report-only invocation" if "--report-only" in shlex.split(run["command"]) else "wall time"
    head = (
        f"#### {name}\n\nCommand: `{run['command']}`\n\n"
        f"{m['cpu_model']}, {m['usable_cores']} cores, torch {m['torch']}, {m['threads']} threads; "
        f"{wall} {run['wall_s']:,.0f} s; 1-min load average {load[0]:.1f} when written"
        if load
        else f"#### {name}\n\nCommand: `{run['command']}`"
    )
    links = "".join(f"\n\n![{Path(png).stem}]({png})" for png in images)
    full = f"{head}\n\n{tables_md.strip()}".rstrip("\n") + links + "\n"
    with claim_folder(out, writer_of(run["command"])):  # held while the three files and the README are written
        atomic_write(out / "results.json", json.dumps(records, indent=1) + "\n")
        atomic_write(out / "results.md", full)
        atomic_write(out / "run.json", json.dumps(run, indent=1) + "\n")
        if readme is not None:
            update_readme(Path(readme), name, readme_body(full, out, Path(readme)), kind="results")
    return out


def readme_body(markdown: str, out: Path, readme: Path) -> str:
    """results.md as the README shows it: links to files beside results.md
    (plots) made relative to the README, and the heading given back the
    level it has in results.md (update_readme puts three levels below)."""
    rel = Path(os.path.relpath(out, readme.parent)).as_posix()
    body = re.sub(r"\]\((?![a-z]+://|/|#)([^)]+)\)", lambda m: f"]({rel}/{m.group(1)})", markdown)
    return re.sub(r"^####? ", "# ", body, count=1)


def run_latte(args: list[str], log: Path, threads: int) -> None:
    """`python -m latte ARGS` in a subprocess with `threads` OpenMP threads,
    its output appended to `log`. A killed experiment leaves the run folder
    resumable; a failure raises RuntimeError with the end of the log."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"\n$ latte {' '.join(args)}\n")
        f.flush()
        rc = subprocess.run(
            [sys.executable, "-m", "latte", *args], stdout=f, stderr=subprocess.STDOUT, env=env
        ).returncode
    if rc != 0:
        raise RuntimeError(f"latte {' '.join(args[:3])} ... exited {rc}; end of {log}:\n{log.read_text()[-2000:]}")


def convert_run(config: str, run: Path, sets: list[str], threads: int) -> dict:
    """summary.json of the `latte convert --config CONFIG` run in `run` with
    `sets` (section.field=value): a run of another configuration or other
    inputs is set aside first, never resumed (cells.set_aside_changed_run);
    a finished one (its cell lost to a kill) is read, not rerun; any other
    is trained, or resumed, now."""
    from .cells import finished_summary, resolved_config, set_aside_changed_run

    set_aside_changed_run(run, config, sets)
    if finished_summary(run, resolved_config(config, sets)["train.steps"]) is None:
        args = [f"--train.run_dir={run}", f"--train.num_threads={threads}", "--train.tensorboard=false"]
        run_latte(
            ["convert", "--config", config, *args, *[f"--{s}" for s in sets]], run.parent / f"{run.name}.log", threads
        )
    return json.loads((run / "summary.json").read_text())
