"""The run folder: one trainer at a time, and which checkpoint a run resumes.

Lock. A trainer holds an exclusive OS advisory lock (``fcntl.flock``) on
``run_dir/train.lock`` for its whole life (rank 0 under torchrun). The
kernel releases it when the process dies, ``kill -9`` included, so a stale
lock cannot block a resume. A second trainer on the same folder stops at
once, naming the holder's pid and host (written into the lock file). The
lock file itself is never deleted: deleting it would let two processes hold
locks on two different files of the same name.

Resume (train.resume):
  auto     the newest step folder that verifies. When step folders exist and
           none verifies, stop with an error that names each folder and why:
           nothing is deleted and nothing starts over silently.
  never    start over at step 0: every step folder already there is moved aside.
  PATH     a step folder, or a run folder (its newest verified step).

Timelines. Resuming from a step older than the newest in the folder (an
explicit older step, or `auto` passing over newer committed folders that
fail verification) starts a branch. Its later steps are not deleted: they
are moved, with copies of the logs, into
``run_dir/abandoned/<UTC time>-<why>/``, so the step folders of a run
folder always form one line and `auto` follows the newest branch. Folders
without a manifest (a save cut short by a crash) newer than the resumed
step are left in place under `auto`: they belong to the timeline being
resumed, which re-saves or cleans them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from latte.guard import MARKER, protected_kind, written_by
from latte.train.checkpoint import scan_checkpoints
from latte.train.manifest import MANIFEST, step_dirs, verify_checkpoint

log = logging.getLogger("latte.train")
LOCK_NAME = "train.lock"
ABANDONED = "abandoned"
LOG_FILES = ("metrics.csv", "val.csv", "samples.txt", "summary.json", "inputs.json")


class RunFolderLocked(ValueError):
    """Another trainer holds the run folder."""


class RunLock:
    """An exclusive flock on run_dir/train.lock, held until `release` (or exit)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunFolderLocked(
                f"{self.path.parent} is in use by another latte train ({holder}); wait for it to finish, "
                "stop it, or choose another train.run_dir"
            ) from None
        except OSError as e:
            os.close(fd)
            raise OSError(e.errno, f"cannot lock {self.path}: {e.strerror}", str(self.path)) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError as e:  # e.g. disk full: say where
            os.close(fd)
            raise OSError(e.errno, f"cannot write {self.path}: {e.strerror}", str(self.path)) from None
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: the holder is still starting"


def prepare_run_dir(run_dir: Path) -> RunLock:
    """Creates run_dir (refusing a path that is a file, or a folder of
    another kind: check_not_foreign) and locks it."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"train.run_dir={str(run_dir)!r} is a file, expected a folder (or a path to create)")
    check_not_foreign(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot create train.run_dir: {e.strerror}", str(run_dir)) from None
    return RunLock(run_dir).acquire()


def check_not_foreign(run_dir: Path) -> None:
    """A run writes only into a run folder of its own (new, empty or a run's):
    never into, nor inside, a checkpoint or a model's folder, nor into a
    folder another command writes (its write marker: results, benchmarks,
    an export; latte/guard.py), nor into a folder of other files (a user's
    documents). A ValueError (exit 2) naming what it is."""
    for place in (run_dir, *run_dir.resolve().parents):
        kind = protected_kind(place)
        if kind and not kind.startswith("a run folder"):
            what = kind if place.resolve() == run_dir.resolve() else f"inside {place}, {kind}"
            raise ValueError(
                f"train.run_dir={str(run_dir)!r}: {what}; a "
                "run writes its own folder only: choose a new train.run_dir (nothing was written)"
            )
    owner = written_by(run_dir) if run_dir.is_dir() else None
    if owner:
        raise ValueError(
            f"train.run_dir={str(run_dir)!r}: written by `{owner}` (its {MARKER}); a run writes its own folder "
            "only: choose a new train.run_dir (nothing was written)"
        )
    entries = sorted(p.name + "/" * p.is_dir() for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if entries and not is_run_folder(run_dir):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ValueError(
            f"train.run_dir={str(run_dir)!r}: holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} "
            f"({shown}) and is not a run folder (no {LOCK_NAME}, no step folders); a run writes only into a new, "
            "empty or its own folder: choose a new train.run_dir (nothing was written or deleted)"
        )


def is_run_folder(folder: Path) -> bool:
    """A folder `latte train` made: it holds the lock file (created first
    thing, never deleted) or step folders."""
    return (folder / LOCK_NAME).exists() or bool(step_dirs(folder))


# --------------------------------------------------------------------------- resume


def choose_resume(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint to resume (None: start at step 0), after moving aside
    what the choice abandons (see the module docstring). Rank 0 only, with
    the lock held."""
    if resume == "never":
        _move_aside(run_dir, [p for _, p in step_dirs(run_dir)], "resume-never")
        return None
    if resume == "auto":
        latest, failed = scan_checkpoints(run_dir)
        if latest is None and failed:
            raise ValueError(
                f"train.resume=auto: {run_dir} holds {len(failed)} step folder(s) and none verifies:\n  "
                + "\n  ".join(f"{p.name}: {why.splitlines()[-1].strip()}" for p, why in failed)
                + "\nnothing was deleted. Repair or remove them, resume from an explicit checkpoint "
                "(--resume PATH), start over here with --resume never (they are moved aside, not "
                "deleted), or use a new train.run_dir"
            )
        for path, why in failed:
            log.warning("not resuming from %s: %s", path, why)
        committed = [p for p, _ in failed if (p / MANIFEST).exists()]
        if latest is not None and committed:
            _move_aside(run_dir, committed, f"failed-verification-resume-from-{latest.name}")
        return latest
    path = _explicit_checkpoint(resume)
    step = verify_checkpoint(path)["step"]
    same_run = path.parent.resolve() == run_dir.resolve()
    later = [p for s, p in step_dirs(run_dir) if not same_run or s > step]
    _move_aside(run_dir, later, f"branch-from-{path.name}" if same_run else f"resume-from-{path.parent.name}")
    return path


def _explicit_checkpoint(resume: str) -> Path:
    path = Path(resume).expanduser()
    if (path / MANIFEST).is_file():
        return path
    latest, failed = scan_checkpoints(path) if path.is_dir() else (None, [])
    if latest is None:
        reasons = "".join(f"\n  {p.name}: {why.splitlines()[-1].strip()}" for p, why in failed)
        raise ValueError(
            f"train.resume={resume!r}: not a checkpoint folder, nor a run folder holding a verified checkpoint{reasons}"
        )
    return latest


def _move_aside(run_dir: Path, folders: list[Path], why: str) -> None:
    """Moves `folders` (step folders of run_dir) and copies of the logs into
    run_dir/abandoned/<time>-<why>/: nothing is deleted. Newest first, so a
    crash half-way leaves the remaining folders a consistent older timeline."""
    if not folders:
        return
    dest = run_dir / ABANDONED / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{why}"
    n = 1
    while dest.exists():
        dest, n = dest.with_name(f"{dest.name.split('~')[0]}~{n}"), n + 1
    dest.mkdir(parents=True)
    for name in LOG_FILES:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, dest / name)
    for folder in sorted(folders, reverse=True):
        os.rename(folder, dest / folder.name)
    (dest / "README.txt").write_text(
        f"Moved here by latte train at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} ({why}):\n"
        f"step folders of an earlier timeline of {run_dir}, and copies of its logs at that time.\n"
        "Resume from one with: latte train --config ... --resume <this folder>/step-N\n",
        encoding="utf-8",
    )
    log.warning(
        "moved %d step folder(s) (%s) aside to %s; nothing was deleted",
        len(folders),
        ", ".join(sorted(p.name for p in folders)),
        dest,
    )
