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

from experiments import COMMANDS
from latte.files import atomic_write
from latte.reporting import machine_info, update_readme


def cell_key(cell: dict) -> str:
    """A stable file-name-safe key for a cell: its items in a fixed order."""
    parts = [f"{k}={cell[k]}" for k in sorted(cell)]
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(parts))


PROTOCOL = "protocol"  # the field of a cell file that records the protocol it ran under
# Overrides that say where or how fast a run goes, never what it computes:
# left out of a protocol, so moving a cache or changing threads reuses cells.
NOT_PROTOCOL = ("train.run_dir", "data.cache_dir", "train.num_threads", "data.num_workers", "train.tensorboard")


def protocol_sets(sets) -> str:
    """Config overrides ("section.field=value", leading dashes allowed) as one
    protocol string, in order (the last one wins), without NOT_PROTOCOL fields."""
    kept = [s.lstrip("-") for s in sets]
    return " ".join(s for s in kept if s.partition("=")[0] not in NOT_PROTOCOL)


class Sweep:
    """Run `fn(cell) -> record` for every cell not finished in an earlier run.

    `records()` returns the records written (finished or marked `incomplete`)
    in cell order. A record must be JSON-serialisable; the cell's own fields
    are merged in front of it.

    `protocol(cell) -> dict` (or one dict for every cell) names everything
    outside the cell's own fields that changes its result (budget, data
    options, config overrides, ...); each cell file records it. A finished
    cell whose protocol differs from this sweep's on a field both name is
    refused, naming both values: its result answers another question, so it
    is neither reused under this command nor overwritten (docs/reliability.md
    §8). A cell file written before protocols were recorded states its own
    through `legacy(record) -> dict` (the fields its JSON holds). `fields`:
    result fields every record must hold (or a function of the cell giving
    them). `folder_flag`: the option that chose the work folder, for the
    messages."""

    def __init__(
        self,
        work_dir: str | Path,
        cells: Iterable[dict],
        key: Callable[[dict], str] = cell_key,
        *,
        protocol: dict | Callable[[dict], dict] | None = None,
        legacy: Callable[[dict], dict] | None = None,
        fields: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
        folder_flag: str = "--work",
    ):
        self.work = Path(work_dir)
        self.cells = list(cells)
        self.key = key
        self.protocol = protocol if callable(protocol) or protocol is None else (lambda c, p=protocol: p)
        self.legacy, self.fields, self.folder_flag = legacy, fields, folder_flag
        keys = [key(c) for c in self.cells]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"sweep cells must be distinct; repeated: {dup[:3]}")

    def _path(self, cell: dict) -> Path:
        return self.work / "cells" / f"{self.key(cell)}.json"

    def read(self, path: Path, cell: dict | None = None) -> dict:
        """The record in `path` (of `cell`, or of the cell its own fields
        name), checked: a JSON object holding `fields`, the cell's values and
        this sweep's protocol. Anything else is a ValueError naming the file."""
        record = read_cell(path)
        if cell is not None:
            other = {k: (record[k], v) for k, v in cell.items() if k in record and record[k] != v}
            if other:
                raise ValueError(f"{path}: holds another cell ({_pairs(other, 'in the file', 'expected')})")
        fields = self.fields(cell or record) if callable(self.fields) else self.fields
        missing = [f for f in fields if f not in record]
        if missing:
            raise ValueError(
                f"{path}: not a finished cell of this sweep (no {', '.join(missing)}); "
                "move it away to run the cell again"
            )
        if self.protocol is not None:
            mismatch = protocol_mismatch(self.recorded_protocol(record), self.protocol(cell or record))
            if mismatch:
                raise ProtocolMismatch(
                    f"{path}: this cell ran under another protocol ({_pairs(mismatch, 'then', 'now')}). "
                    f"Its result is kept as it is: give this protocol its own {self.folder_flag} folder, "
                    "or move the cell files away to rerun them"
                )
        return record

    def recorded_protocol(self, record: dict) -> dict:
        """The protocol a record ran under: recorded, or stated by its own fields (older cell files)."""
        if isinstance(record.get(PROTOCOL), dict):
            return record[PROTOCOL]
        return self.legacy(record) if self.legacy is not None else {}

    def _record(self, cell: dict) -> dict | None:
        path = self._path(cell)
        return self.read(path, cell) if path.is_file() else None

    def done(self, cell: dict) -> bool:
        """Finished: a record exists and is not marked `incomplete` (a run
        cut short by a deadline is reported, and run again by the next sweep)."""
        record = self._record(cell)
        return record is not None and not record.get("incomplete", False)

    def check(self) -> None:
        """Every cell file of this sweep is readable and of this protocol; one
        error names how many are not, and the first one's problem."""
        problems = []
        for cell in self.cells:
            try:
                self._record(cell)
            except ValueError as e:
                problems.append(str(e))
        if problems:
            more = f" ({len(problems) - 1} more cell files of {self.work} likewise)" if len(problems) > 1 else ""
            raise ValueError(problems[0] + more)

    def pending(self) -> list[dict]:
        self.check()
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
            if self.protocol is not None:
                record[PROTOCOL] = self.protocol(cell)
            path = self._path(cell)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(record, indent=1) + "\n")
        return self.records()

    def records(self) -> list[dict]:
        """The records of the finished (or incomplete) cells, without their
        recorded protocol (the command's provenance says it)."""
        self.check()
        out = [self._record(c) for c in self.cells]
        return [{k: v for k, v in r.items() if k != PROTOCOL} for r in out if r is not None]


class ProtocolMismatch(ValueError):
    """A finished cell ran under another protocol than the command's."""


def protocol_mismatch(then: dict, now: dict) -> dict:
    """{field: (then, now)} for the fields both protocols name with different values."""
    now = json.loads(json.dumps(now))  # as a cell file holds it (tuples become lists)
    return {k: (then[k], now[k]) for k in now if k in then and then[k] != now[k]}


def _pairs(diff: dict, a: str, b: str) -> str:
    return "; ".join(f"{k}: {x!r} {a}, {y!r} {b}" for k, (x, y) in diff.items())


def read_json(path: str | Path, expect: type = dict):
    """The JSON value of a cell or results file, of type `expect`; a file that
    is not one (truncated, garbage, another type) is a ValueError naming it."""
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path}: not valid JSON ({e}); cell and result files are written whole, so this one was damaged "
            "or written by something else: move it away (a cell file: to run the cell again)"
        ) from None
    if not isinstance(value, expect):
        raise ValueError(f"{path}: a JSON {type(value).__name__}, expected a JSON {expect.__name__}")
    return value


def read_cell(path: str | Path) -> dict:
    """A cell file's record (a JSON object), checked by read_json."""
    return read_json(path, dict)


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
    out.mkdir(parents=True, exist_ok=True)
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
