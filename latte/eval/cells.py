"""The one reuse rule of every sweep of cells (docs/reliability.md §8):
`latte eval`'s suites (latte/eval/runner.py) and the laboratory's sweeps
(experiments/common/cells.py adds what training sweeps need: run protocols,
run folders set aside).

A cell is a flat dict (its own fields). A finished cell is written to
`WORK/cells/<key>.json` (or the sweep's folder) atomically; it records under
`protocol` the full resolved protocol it ran under: everything outside the
cell's own fields that changes its result (the resolved run config, the
command's options, quick or full) and, under `protocol.inputs`, the sha256
of every input it consumed (the checkpoint's manifest, the base model's
weights and config, data files). A cell file is reused only when its
recorded protocol equals the command's exactly, field for field; otherwise
it is refused (ProtocolMismatch, exit 2) with a message naming each field
that differs, or that the cell does not record: its result answers another
question, so it is neither reused nor overwritten. A cell file written
before protocols were complete records less than the command's protocol and
is refused the same way, unless its writer proves the missing fields (MQAR's
`--restore-from` stamps the protocol of the published command).

Every field a record holds that FIELD_RULES names is checked by type and
range when read: a bad cell is refused naming its file, field and value.
Standard library and latte.files only: the GPU suite reads cells before
torch is installed.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from latte.files import atomic_write, sha256_file

PROTOCOL = "protocol"  # the field of a cell file that records the protocol it ran under
INPUTS = "inputs"  # the protocol's field holding {input name: sha256}
# Overrides that say where or how fast a run goes, never what it computes:
# left out of a protocol, so moving a cache or changing threads reuses cells.
NOT_PROTOCOL = (
    "train.run_dir",
    "data.cache_dir",
    "train.num_threads",
    "data.num_workers",
    "train.tensorboard",
    "train.verify_inputs",  # options of one start of a run (latte/train/inputs.py)
    "train.accept_changed_inputs",
)
NOT_RECORDED = "<not recorded>"


MAX_KEY = 224  # a cell file's name, with ".json" and atomic_write's temporary suffix, stays within 255 bytes


def cell_key(cell: dict) -> str:
    """A stable file-name-safe key for a cell: its items in a fixed order;
    past MAX_KEY characters (long --set overrides), its head and the sha256
    of the whole, so the file name stays within what file systems take."""
    parts = [f"{k}={cell[k]}" for k in sorted(cell)]
    key = re.sub(r"[^A-Za-z0-9_.=,-]+", "_", ",".join(parts))
    if len(key) <= MAX_KEY:
        return key
    return key[: MAX_KEY - 17] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]


def protocol_sets(sets) -> str:
    """Config overrides ("section.field=value", leading dashes allowed) as one
    protocol string, in order (the last one wins), without NOT_PROTOCOL fields."""
    kept = [s.lstrip("-") for s in sets]
    return " ".join(s for s in kept if s.partition("=")[0] not in NOT_PROTOCOL)


class ProtocolMismatch(ValueError):
    """A finished cell ran under another protocol (or inputs) than the command's."""


def protocol_difference(then: dict, now: dict) -> dict:
    """{field: (then, now)} for every field whose value differs, on either
    side (a field one side lacks is NOT_RECORDED there); nested dicts
    (inputs) are compared field by field as `inputs.NAME`."""
    now = json.loads(json.dumps(now))  # as a cell file holds it (tuples become lists)
    out = {}
    for k in [*now, *(k for k in then if k not in now)]:
        a, b = then.get(k, NOT_RECORDED), now.get(k, NOT_RECORDED)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update({f"{k}.{n}": v for n, v in protocol_difference(a, b).items()})
        elif a != b:
            out[k] = (a, b)
    return out


def describe(diff: dict, a: str = "then", b: str = "now", shown: int = 6) -> str:
    items = list(diff.items())
    text = "; ".join(f"{k}: {_short(x)} {a}, {_short(y)} {b}" for k, (x, y) in items[:shown])
    return text + (f"; and {len(items) - shown} more fields" if len(items) > shown else "")


def _short(value, limit: int = 120) -> str:
    text = value if value == NOT_RECORDED else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- field rules


def _number(lo=None, hi=None, *, none=False, integer=False):
    def check(v):
        if v is None:
            return none
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            return False
        return math.isfinite(v) and (lo is None or v >= lo) and (hi is None or v <= hi)

    what = "an integer" if integer else "a finite number"
    rng = f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None else ""
    return check, what + rng + (" or null" if none else "")


FRACTION, POSITIVE, NONNEG, COUNT = _number(0, 1), _number(0), _number(0), _number(0, integer=True)
# Result fields every sweep's records may hold, with what each may be. A field
# a record holds is checked whatever the sweep: one table, one rule (only
# names that mean the same in every sweep: convert's eval cells keep "nll"
# as a string of per-window values, convert-sinks as one number).
FIELD_RULES = {
    **dict.fromkeys(
        ("accuracy", "acc", "acc_norm", "test_accuracy", "test_balanced_accuracy", "val_accuracy", "test_macro_f1"),
        FRACTION,
    ),
    "majority_baseline": FRACTION,
    **dict.fromkeys(("val_ppl", "unigram_ppl"), _number(1e-12)),
    **dict.fromkeys(("val_loss", "acc_stderr", "acc_norm_stderr", "answer_nll", "decoy_nll"), NONNEG),
    "tokens_per_s": _number(1e-12),
    **dict.fromkeys(("wall_s", "train_wall_s", "cell_wall_s", "process_s", "state_bytes"), NONNEG),
    **dict.fromkeys(
        ("steps", "tokens_seen", "val_tokens", "parameters", "examples_scored", "answer_tokens", "answer_likelier"),
        COUNT,
    ),
}


def check_fields(record: dict, path: Path) -> None:
    """Every field of FIELD_RULES the record holds has a value its rule allows;
    else a ValueError naming the file, the field, the value and what is allowed."""
    for name, (ok, allowed) in FIELD_RULES.items():
        if name in record and not ok(record[name]):
            raise ValueError(
                f"{path}: field {name!r} is {record[name]!r}, expected {allowed}; a cell file is written "
                "whole by its sweep, so this one was damaged or edited: move it away to run the cell again"
            )


# --------------------------------------------------------------------------- reading files


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


# --------------------------------------------------------------------------- inputs

_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | Path) -> str:
    """sha256 of a file, remembered for this process while its size and
    modification time stay the same."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def input_digest(path: str | Path) -> str:
    """What names an input's content: a file's sha256; a checkpoint's
    manifest.json sha256 (the manifest holds every file's sha256); a run
    folder's newest committed checkpoint's; any other folder's, the sha256 of
    its files' relative names and sha256s (hidden files and caches left out)."""
    path = Path(path)
    if path.is_file():
        return file_digest(path)
    if (path / "manifest.json").is_file():
        return file_digest(path / "manifest.json")
    steps = sorted(p for p in path.glob("step-*") if (p / "manifest.json").is_file())
    if steps:
        return file_digest(steps[-1] / "manifest.json")
    if not path.is_dir():
        raise ValueError(f"{path}: no such file or folder (an input of this sweep)")
    files = sorted(
        p for p in path.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(path).parts)
    )
    listing = "".join(f"{p.relative_to(path).as_posix()}\0{file_digest(p)}\n" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def digest_or_missing(path: str | Path) -> str:
    """input_digest, or "missing PATH" for an input that is not there (a
    cell recorded on it is then refused: its input cannot be checked)."""
    return input_digest(path) if Path(path).exists() else f"missing {path}"


# --------------------------------------------------------------------------- the sweep


class Sweep:
    """Run `fn(cell) -> record` for every cell not finished in an earlier run.

    `records()` returns the records written (finished or marked `incomplete`)
    in cell order. A record must be JSON-serialisable; the cell's own fields
    are merged in front of it.

    `protocol(cell) -> dict` (or one dict for every cell): the full resolved
    protocol of a cell, its inputs' sha256 under `inputs` (module docstring);
    each cell file records it and is reused only when it matches exactly.
    `fields`: result fields every record must hold (or a function of the cell
    giving them). `folder_flag`: the option that chose the work folder, for
    the messages. `stop() -> bool`: run()'s default stop (below)."""

    def __init__(
        self,
        work_dir: str | Path,
        cells: Iterable[dict],
        key: Callable[[dict], str] = cell_key,
        *,
        protocol: dict | Callable[[dict], dict] | None = None,
        fields: tuple[str, ...] | Callable[[dict], tuple[str, ...]] = (),
        folder_flag: str = "--work",
        stop: Callable[[], bool] | None = None,
    ):
        self.work, self.stop = Path(work_dir), stop
        self.cells = list(cells)
        self.key = key
        self.protocol = protocol if callable(protocol) or protocol is None else (lambda c, p=protocol: p)
        self.fields, self.folder_flag = fields, folder_flag
        keys = [key(c) for c in self.cells]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"sweep cells must be distinct; repeated: {dup[:3]}")

    def _path(self, cell: dict) -> Path:
        return self.work / "cells" / f"{self.key(cell)}.json"

    def protocol_of(self, cell: dict) -> dict | None:
        """The command's protocol of a cell, as a cell file holds it. Asked
        anew each time: an input (a run the sweep's earlier stage trains) may
        change during the command; file_digest remembers unchanged files."""
        return None if self.protocol is None else json.loads(json.dumps(self.protocol(cell)))

    def read(self, path: Path, cell: dict | None = None) -> dict:
        """The record in `path` (of `cell`, or of the cell its own fields
        name), checked: a JSON object holding `fields` with values FIELD_RULES
        allows, the cell's values and exactly this sweep's protocol. Anything
        else is a ValueError naming the file."""
        record = read_cell(path)
        if cell is not None:
            other = {k: (record[k], v) for k, v in cell.items() if k in record and record[k] != v}
            if other:
                raise ValueError(f"{path}: holds another cell ({describe(other, 'in the file', 'expected')})")
        fields = self.fields(cell or record) if callable(self.fields) else self.fields
        missing = [f for f in fields if f not in record]
        if missing:
            raise ValueError(
                f"{path}: not a finished cell of this sweep (no {', '.join(missing)}); "
                "move it away to run the cell again"
            )
        check_fields(record, path)
        if self.protocol is not None:
            recorded = record.get(PROTOCOL)
            diff = protocol_difference(recorded if isinstance(recorded, dict) else {}, self.protocol_of(cell or record))
            if diff:
                what = (
                    f"another protocol or other inputs ({describe(diff)})"
                    if isinstance(recorded, dict)
                    else "a protocol it does not record (written before cells recorded their protocol and the "
                    f"sha256 of their inputs, so they cannot be proven the same: {describe(diff, shown=3)})"
                )
                raise ProtocolMismatch(
                    f"{path}: this cell ran under {what}. "
                    "Only a cell that records exactly this command's protocol and inputs is reused; this one "
                    f"is kept as it is: give this command its own {self.folder_flag} folder, or move the cell "
                    "files away to recompute them (a run folder of another configuration is then set aside "
                    "and started over, never resumed)"
                )
        return record

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
                problems.append(e)
        if problems:
            more = f" ({len(problems) - 1} more cell files of {self.work} likewise)" if len(problems) > 1 else ""
            raise type(problems[0])(str(problems[0]) + more)

    def pending(self) -> list[dict]:
        self.check()
        return [c for c in self.cells if not self.done(c)]

    def run(
        self, fn: Callable[[dict], dict], *, desc: str = "sweep", stop: Callable[[], bool] | None = None
    ) -> list[dict]:
        """`stop()` (default: the sweep's own) is asked before each cell:
        True ends the sweep there, the cells not run left missing."""
        stop = self.stop if stop is None else stop
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
                record[PROTOCOL] = self.protocol_of(cell)
            path = self._path(cell)
            check_fields(record, path)  # never write what reading would refuse
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(record, indent=1) + "\n")
        return self.records()

    def records(self) -> list[dict]:
        """The records of the finished (or incomplete) cells, without their
        recorded protocol (the command's provenance says it)."""
        self.check()
        out = [self._record(c) for c in self.cells]
        return [{k: v for k, v in r.items() if k != PROTOCOL} for r in out if r is not None]


def _progress(items: list, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # the progress bar is optional (extra "train")
        return items
    return tqdm(items, desc=desc, unit="cell", dynamic_ncols=True, file=sys.stderr)
