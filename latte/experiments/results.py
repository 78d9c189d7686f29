"""Resumable sweeps and result files shared by every experiment.

A sweep is a list of cells (flat dicts). Each finished cell is written to
`WORK/cells/<key>.json` atomically, so a killed sweep continues where it
stopped and never redoes a finished cell. The results of an experiment are
written to `OUT/` as:

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
from collections.abc import Callable, Iterable
from pathlib import Path

from ..files import atomic_write
from ..reporting import machine_info, update_readme


def cell_key(cell: dict) -> str:
    """A stable file-name-safe key for a cell: its items in a fixed order."""
    parts = [f"{k}={cell[k]}" for k in sorted(cell)]
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(parts))


class Sweep:
    """Run `fn(cell) -> record` for every cell not finished in an earlier run.

    `records()` returns the records written (finished or marked `incomplete`)
    in cell order. A record must be
    JSON-serialisable; the cell's own fields are merged in front of it."""

    def __init__(self, work_dir: str | Path, cells: Iterable[dict], key: Callable[[dict], str] = cell_key):
        self.work = Path(work_dir)
        self.cells = list(cells)
        self.key = key
        keys = [key(c) for c in self.cells]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"sweep cells must be distinct; repeated: {dup[:3]}")

    def _path(self, cell: dict) -> Path:
        return self.work / "cells" / f"{self.key(cell)}.json"

    def done(self, cell: dict) -> bool:
        """Finished: a record exists and is not marked `incomplete` (a run
        cut short by a deadline is reported, and run again by the next sweep)."""
        path = self._path(cell)
        return path.is_file() and not json.loads(path.read_text()).get("incomplete", False)

    def pending(self) -> list[dict]:
        return [c for c in self.cells if not self.done(c)]

    def run(
        self, fn: Callable[[dict], dict], *, desc: str = "sweep", stop: Callable[[], bool] | None = None
    ) -> list[dict]:
        """`stop()` is asked before each cell: True ends the sweep there."""
        todo = self.pending()
        if len(todo) < len(self.cells):
            print(
                f"{desc}: {len(self.cells) - len(todo)} of {len(self.cells)} cells already done "
                f"in {self.work}; running the other {len(todo)}",
                file=sys.stderr,
            )
        for cell in _progress(todo, desc):
            if stop is not None and stop():
                break
            if self.done(cell):  # finished meanwhile by a parallel worker (--shard) on the same folder
                continue
            record = {**cell, **fn(cell)}
            path = self._path(cell)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(record, indent=1) + "\n")
        return self.records()

    def records(self) -> list[dict]:
        return [json.loads(self._path(c).read_text()) for c in self.cells if self._path(c).is_file()]


def _progress(items: list, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # the progress bar is optional (extra "train")
        return items
    return tqdm(items, desc=desc, unit="cell", dynamic_ncols=True, file=sys.stderr)


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
    """What made a result: the exact command (`latte experiment NAME ARGS`),
    the machine, threads and wall time since `started` (time.time())."""
    command = shlex.join(["latte", "experiment", experiment, *argv])
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
    out.mkdir(parents=True, exist_ok=True)
    for r in records:
        bad = [k for k, v in r.items() if isinstance(v, (dict, list))]
        if bad:
            raise ValueError(f"{name}: result records must be flat; fields {bad} hold {type(r[bad[0]]).__name__}")
    m = run["machine"]
    load = m.get("loadavg_start")
    head = (
        f"#### {name}\n\nCommand: `{run['command']}`\n\n"
        f"{m['cpu_model']}, {m['usable_cores']} cores, torch {m['torch']}, {m['threads']} threads; "
        f"wall time {run['wall_s']:,.0f} s; 1-min load average {load[0]:.1f} when written"
        if load
        else f"#### {name}\n\nCommand: `{run['command']}`"
    )
    links = "".join(f"\n\n![{Path(png).stem}]({png})" for png in images)
    markdown = f"{head}\n\n{tables_md.strip()}\n"
    atomic_write(out / "results.json", json.dumps(records, indent=1) + "\n")
    full = markdown.rstrip("\n") + links + "\n"
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
