"""What a run read: its inputs, recorded so that the run is never resumed,
evaluated again or reused on other inputs as if they had not changed
(docs/reliability.md §2, "Inputs").

RUN_DIR/inputs.json is written by rank 0 at setup, after the task has read
its data: for every input file the task names (`Task.input_files`: corpus
files, a tokenizer file, a base model's files, the packed token caches) its
path, size, modification time and sha256, by a name that says what it is
("data.source:/abs/doc.txt", "data.tokenizer", "base:model.safetensors",
"cache:train").

Resuming compares the record of the checkpoint's run folder with the
inputs the run reads now: size and mtime first, sha256 only where those
differ (or for every file with train.verify_inputs), so an input that was
only touched or copied back is no change. An input whose sha256 differs,
one that is new, or one that is gone is a change: the run is refused
(InputsChanged, exit 2) naming each input with its recorded and current
values, before anything is written, unless train.accept_changed_inputs is
set, which records the new values and lists the change under "accepted" in
the record. A run that predates the record resumes with a warning ("inputs
not recorded") and records its inputs from then on.

The names starting with "cache:" are derived inputs: known only after the
task has read (and packed) its data, so compared in the second check only.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from latte.files import atomic_write, sha256_file

log = logging.getLogger("latte.train")
RECORD = "inputs.json"
FORMAT = "latte-run-inputs"
DERIVED = "cache:"
INIT = "init_from:"  # train.init_from's weight files (latte/train/init_from.py): a fresh start reads them
ACCEPT_FLAG = "--accept-changed-inputs (train.accept_changed_inputs=true)"


class InputsChanged(ValueError):
    """An input of a run changed since the run recorded it (the CLI exits 2)."""


# --------------------------------------------------------------------------- one input

_DIGESTS: dict[tuple, str] = {}


def _stat(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _digest(path: Path, entry: dict, fresh: bool = False) -> str:
    """sha256 of the file, remembered for this process while its path, size
    and mtime stay the same (both checks of a setup hash a file once);
    `fresh`: read the file again whatever is remembered."""
    key = (entry["path"], entry["size"], entry["mtime_ns"])
    if fresh or key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def describe_file(path: str | Path) -> dict:
    """The record of one input file: path, size, mtime_ns, sha256."""
    path = Path(path)
    entry = _stat(path)
    return {**entry, "sha256": _digest(path, entry)}


def _show(entry: dict | None) -> str:
    if entry is None:
        return "not there"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["mtime_ns"] / 1e9))
    sha = f", sha256 {entry['sha256']}" if "sha256" in entry else ""
    return f"{entry['path']}, {entry['size']} bytes, modified {when}{sha}"


# --------------------------------------------------------------------------- comparing


def compare(recorded: dict, files: dict[str, Path], *, verify: bool = False, fresh: bool = False) -> tuple[dict, dict]:
    """(changes, entries now). `changes`: {name: (recorded, now)}, each value
    in words (path, size, mtime and sha256 of the file), for every input that
    changed, is new or is gone; `files` maps names to the paths read now. An
    input is the same when path, size and mtime are the recorded ones
    (without `verify`) or its sha256 is. `fresh`: every sha256 read from the
    file, none remembered from earlier in this process."""
    changes, now = {}, {}
    for name in sorted(recorded.keys() | files.keys()):
        old, path = recorded.get(name), files.get(name)
        was = _show(old) if isinstance(old, dict) else "nothing"
        if path is None or not Path(path).is_file():
            changes[name] = (was, "not read" if path is None else f"{path} missing")
            continue
        cur = _stat(Path(path))
        if isinstance(old, dict) and not verify and all(old.get(k) == cur[k] for k in cur):
            now[name] = old
            continue
        cur["sha256"] = _digest(Path(path), cur, fresh)
        now[name] = cur
        if not isinstance(old, dict) or old.get("sha256") != cur["sha256"]:
            changes[name] = (was, _show(cur))
    return changes, now


def _lines(changes: dict) -> list[str]:
    return [f"{name}: recorded {was}; now {now}" for name, (was, now) in changes.items()]


def read_record(run_dir: str | Path) -> dict | None:
    """The run folder's record, or None when it has none (a run that
    predates records); a record that is not one is a ValueError naming it."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable record of the run's inputs ({e}); {_REMEDY}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("inputs"), dict):
        raise ValueError(f"{path}: not a record of a run's inputs (format {FORMAT!r}); {_REMEDY}")
    return record


def write_record(run_dir: Path, inputs: dict, accepted: list) -> None:
    record = {"format": FORMAT, "version": 1, "inputs": inputs, "accepted": accepted}
    atomic_write(Path(run_dir) / RECORD, json.dumps(record, indent=1) + "\n")


_REMEDY = (
    "restore the recorded inputs; or start over with --resume never (earlier steps are moved aside, "
    f"not deleted) or a new train.run_dir; or continue on the inputs as they are now with {ACCEPT_FLAG}, "
    f"which records their new values and the change in {RECORD}"
)


# --------------------------------------------------------------------------- at setup


def check_inputs(
    run_dir: Path,
    files: dict[str, Path],
    *,
    resumed: Path | None,
    step: int = 0,
    verify: bool = False,
    accept: bool = False,
    prepared: bool = True,
) -> None:
    """The inputs check of `latte train` (rank 0). `resumed`: the checkpoint
    folder resumed (None: a fresh start); its run folder's record is the
    reference. `prepared` False: the check before anything is written (the
    derived inputs are not known yet, nothing is recorded); True: the check
    after the task read its data, which writes run_dir's record."""
    if resumed is None:
        if prepared:
            write_record(run_dir, {name: describe_file(p) for name, p in sorted(files.items())}, [])
        return
    record = read_record(resumed.parent) if not accept else _read_or_none(resumed.parent)
    if record is None:
        if prepared:
            log.warning(
                "inputs not recorded: %s predates records of a run's inputs, so it resumes without checking "
                "them; they are recorded from now on in %s",
                resumed.parent,
                run_dir / RECORD,
            )
            write_record(run_dir, {name: describe_file(p) for name, p in sorted(files.items())}, [])
        return
    recorded = (
        record["inputs"] if prepared else {k: v for k, v in record["inputs"].items() if not k.startswith(DERIVED)}
    )
    changes, now = compare(recorded, files, verify=verify, fresh=verify and not prepared)  # each file read once
    if changes and not accept:
        raise InputsChanged(_changed_message(resumed, changes))
    if not prepared:
        return
    accepted = list(record.get("accepted") or [])
    if changes:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        accepted.append({"time": when, "step": step, "changes": _lines(changes)})
        log.warning(
            "resuming %s at step %d on changed inputs (%s), as train.accept_changed_inputs asks: the new values "
            "and the change are recorded in %s:\n  %s",
            resumed,
            step,
            len(changes),
            run_dir / RECORD,
            "\n  ".join(_lines(changes)),
        )
    if changes or now != record["inputs"] or resumed.parent.resolve() != run_dir.resolve():
        write_record(run_dir, now, accepted)


def _read_or_none(run_dir: Path) -> dict | None:
    """The record, or None also when it is damaged (accepting replaces it)."""
    try:
        return read_record(run_dir)
    except ValueError as e:
        log.warning("%s; replacing it, as train.accept_changed_inputs asks", str(e).split(";")[0])
        return None


def _changed_message(resumed: Path, changes: dict, shown: int = 10) -> str:
    lines = _lines(changes)
    more = f"\n  and {len(changes) - shown} more" if len(changes) > shown else ""
    return (
        f"cannot resume from {resumed}: {len(changes)} input{'s' * (len(changes) > 1)} of the run changed since "
        f"{resumed.parent / RECORD} recorded them:\n  "
        + "\n  ".join(lines[:shown])
        + more
        + f"\nits steps were trained on the recorded inputs, so resuming would continue (and evaluate) on other "
        f"data; nothing was written. To go on: {_REMEDY}"
    )
