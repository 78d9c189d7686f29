"""The one write rule for every command that writes outside its own run
folder (docs/reliability.md §8): `latte export`, the suite's report and
`--pack`, the experiments' result folders, the single benchmarks' `--out`
and `latte eval --out`.

A command writes only into a folder that
- does not exist (it is created),
- is empty, or
- was written by the same command before: it holds MARKER, a small JSON
  file naming the writer, left there by `claim_folder` on first use.
Anything else (a project's root, a README folder, another command's
results, a base model's folder, a checkpoint, a run folder, or any folder
inside one of those) is refused with a WriteRefused (a ValueError: the CLI
exits 2) naming the folder and what it holds, before anything is written.

A folder several commands share (the single benchmarks' `--out`, such as
benchmarks/, and the GPU suite's folder they run in; `latte eval --out
FILE`) follows the same rule file by file (`claim_files`): the marker also
records which command wrote each file, and a command creates new files or
replaces only the ones it wrote itself there.
The marker is written whole (a temp file renamed over it) and under an
exclusive lock on the folder (flock of its descriptor), the rule checked
again under the lock: of two commands claiming one folder at once only one
gets it, and two benchmarks recording their files at once both keep their
record. A temp file a kill left beside the marker does not count as the
folder's content, and the next claim removes it.

`claim_folder` is a context manager: it holds the folder for the whole
write (`with claim_folder(out, writer) as folder: ...`), an exclusive flock
of the marker's lock file (HOLD, naming the holder; released when the block
ends or the process dies). A second writer, of any command, is refused
while it is held, naming the folder and the holder, and deletes nothing.
With `staged=True` (`latte export`) the block writes into a new sibling
folder that replaces the folder whole when the block ends (the two swapped
in one rename on Linux): a kill leaves the earlier files or the new ones,
never a mix of two writes. The new marker lists the files written
(`files`); the next staged write removes only those, and keeps anything
else found there (a marker without the list, written before it existed:
every file the new write does not replace is kept).

Standard library only: the GPU suite uses it before its packages exist.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: claims are not locked
    fcntl = None

MARKER = ".latte-written-by.json"
HOLD = ".latte-written-by.lock"  # flock'ed by the writer holding the folder (claim_folder), naming it
_STAGE = ".latte-stage-"  # a staged write's sibling folder: .NAME.latte-stage-PID-THREAD
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


class WriteRefused(ValueError):
    """A folder the write rule forbids (the CLI exits 2)."""


@contextlib.contextmanager
def claim_folder(folder: str | os.PathLike, writer: str, *, flag: str = "--out", staged: bool = False):
    """Checks `folder` against the write rule for `writer` (a command such as
    "latte export"), creates it if missing, leaves the marker (from then on
    only `writer` may write there again) and holds it until the block ends:
    `with claim_folder(out, writer) as folder:`. Another writer meanwhile is
    a WriteRefused naming the holder. The same thread claiming a folder it
    holds gets it again. `staged`: the block gets a new sibling folder that
    replaces `folder` when the block ends without an exception (module
    docstring); with one, nothing in `folder` changes."""
    folder = check_folder(folder, writer, flag=flag)
    key, held = str(folder.resolve()), _held_here()
    if key in held and not staged:
        yield folder
        return
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):  # another command may have claimed it since the check: check again
        check_folder(folder, writer, flag=flag)
        hold = _Hold(folder, writer, flag)
        try:
            if written_by(folder) != writer:
                _write_marker(folder, json.dumps({"writer": writer}))
        except BaseException:
            hold.release()
            raise
    held.add(key)
    try:
        if staged:
            with _staged(folder, writer, flag) as stage:
                yield stage
        else:
            yield folder
    finally:
        held.discard(key)
        hold.release()


_HELD = threading.local()


def _held_here() -> set:
    """The folders this thread holds (resolved paths)."""
    if not hasattr(_HELD, "folders"):
        _HELD.folders = set()
    return _HELD.folders


class _Hold:
    """An exclusive, non-blocking flock of FOLDER/HOLD, whose text names the
    holder; a WriteRefused naming the holder when another one has it."""

    def __init__(self, folder: Path, writer: str, flag: str):
        self.path = folder / HOLD
        self.fd = None
        if fcntl is None:  # no flock off POSIX: not held
            return
        for _ in range(100):  # the file may be removed by the holder releasing it between open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise WriteRefused(
                    f"{flag} {folder}: being written by {holder}; one writer at a time: wait until it ends or "
                    "choose another folder (nothing was written)"
                ) from None
            if _same_file(fd, self.path):
                self.fd = fd
                break
            os.close(fd)
        else:
            raise WriteRefused(f"{flag} {folder}: could not hold its {HOLD} (removed again and again)")
        since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        text = json.dumps({"writer": writer, "pid": os.getpid(), "host": socket.gethostname(), "since": since})
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode() + b"\n", 0)

    def release(self) -> None:
        """The lock file removed (when it is still this hold's) and unlocked."""
        if self.fd is None:
            return
        if _same_file(self.fd, self.path):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _holder(fd: int) -> str:
    """The holder a held lock file names, in words."""
    try:
        h = json.loads(os.pread(fd, 4096, 0).decode())
        return f"`{h['writer']}` (pid {h['pid']} on {h['host']}, since {h['since']})"
    except (ValueError, KeyError, TypeError, OSError):
        return "another command (its lock file names none yet)"


@contextlib.contextmanager
def _staged(folder: Path, writer: str, flag: str):
    """A new sibling folder for the block, held; swapped in for `folder`
    when the block ends, removed when it raises (claim_folder, staged)."""
    _remove_stale_stages(folder)
    stage = folder.parent / f".{folder.name}{_STAGE}{os.getpid()}-{threading.get_ident()}"
    stage.mkdir()
    hold, swapped = _Hold(stage, writer, flag), []
    try:
        yield stage
        _swap_in(stage, folder, writer, flag, hold, swapped)
    finally:
        hold.release()
        if not swapped:
            shutil.rmtree(stage, ignore_errors=True)


def _swap_in(stage: Path, folder: Path, writer: str, flag: str, hold: _Hold, swapped: list) -> None:
    """`stage` becomes `folder`: the files the earlier write listed go with
    the old folder, anything else found there is moved into the new one."""
    written = sorted(p.name for p in _entries(stage) if p.name not in (MARKER, HOLD))
    listed = _marker(folder).get("files")
    old = [p.name for p in _entries(folder) if p.name not in (MARKER, HOLD)]
    if isinstance(listed, list):
        keep = [n for n in old if n not in listed]
        clash = [n for n in keep if n in written]
        if clash:
            raise WriteRefused(
                f"{flag} {folder}: {clash[0]} is there, not written by `{writer}`, and this write has its own "
                f"{clash[0]}: move {folder / clash[0]} away and run it again (nothing in {folder} was changed)"
            )
    else:  # written before markers listed files: what the new write does not replace is kept
        keep = [n for n in old if n not in written]
    _write_marker(stage, json.dumps({"writer": writer, "files": written}, indent=1))
    _exchange(stage, folder)
    swapped.append(True)
    hold.path = folder / HOLD
    for name in keep:
        os.rename(stage / name, folder / name)
    shutil.rmtree(stage)


def _exchange(a: Path, b: Path) -> None:
    """Folders a and b swap names: one rename on Linux (renameat2 with
    RENAME_EXCHANGE), else three (a kill between them leaves b's old files
    in a hidden sibling)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2)  # AT_FDCWD, RENAME_EXCHANGE
        if rc == 0:
            return
    except (AttributeError, OSError):  # no renameat2 here
        pass
    spare = a.with_name(a.name + "-old")
    os.rename(b, spare)
    os.rename(a, b)
    os.rename(spare, a)


def _remove_stale_stages(folder: Path) -> None:
    """Sibling stages of staged writes a kill cut (nobody holds them): one cut
    before its swap holds only new files and is removed; one cut after it
    holds the old folder, whose listed files are removed and anything else
    kept, named on stderr."""
    for stage in folder.parent.glob(f".{folder.name}{_STAGE}*"):
        try:
            hold = _Hold(stage, "latte", "stage")
        except (WriteRefused, OSError):
            continue  # a live write's
        try:
            marker = _marker(stage)
            listed = marker.get("files") if marker else [p.name for p in _entries(stage)]
            for name in listed if isinstance(listed, list) else []:
                target = stage / name
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            if isinstance(listed, list):
                (stage / MARKER).unlink(missing_ok=True)
        finally:
            hold.release()
        if any(p.name != MARKER for p in _entries(stage)):
            print(f"{stage}: left by a cut write; holds {_listing(stage)}, kept", file=sys.stderr)
        else:
            shutil.rmtree(stage)


def check_folder(folder: str | os.PathLike, writer: str, *, flag: str = "--out") -> Path:
    """The write rule alone (nothing is created): a WriteRefused naming the
    folder and what it holds, or the folder."""
    folder = _not_protected(Path(folder), flag)
    if folder.is_dir() and _entries(folder):
        owner = written_by(folder)
        if owner != writer:
            raise WriteRefused(
                f"{flag} {folder}: holds {_listing(folder)}"
                + (f", written by `{owner}`" if owner else ", not written by this command (no marker)")
                + f"; `{writer}` writes only into a new, empty or its own folder: choose another folder "
                "(nothing was written)"
            )
    return folder


def claim_files(
    folder: str | os.PathLike,
    writer: str,
    names,
    *,
    owners: tuple[str, ...],
    flag: str = "--out",
    create: bool = True,
) -> Path:
    """The write rule for a folder several commands share (the benchmarks'
    `--out`, `latte eval --out FILE`): `writer` writes only the files `names`
    there, each one new or written by `writer` itself before (the marker's
    `files` records every file's writer). The folder is new, empty or marked
    by one of `owners` (a new one is marked by `owners[0]`); never a
    checkpoint, a run or a model's folder, nor inside one. Anything else is a
    WriteRefused naming the folder or the file, before anything is written.
    Creates the folder, records `names` as `writer`'s and returns the folder
    (`create=False`: checks only, before the work; nothing is written)."""
    folder = _not_protected(Path(folder), flag)
    files = _check_files(folder, writer, names, owners, flag)
    marker = _marker(folder)
    if not create or (all(files.get(n) == writer for n in names) and marker.get("writer") in owners):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):  # another benchmark may have recorded its files since: read and check again
        files = _check_files(folder, writer, names, owners, flag)
        owner = _marker(folder).get("writer") or owners[0]
        record = {"writer": owner, "files": {**files, **dict.fromkeys(names, writer)}}
        _write_marker(folder, json.dumps(record, indent=1, sort_keys=True))
    return folder


def _check_files(folder: Path, writer: str, names, owners: tuple[str, ...], flag: str) -> dict:
    """claim_files' rule for the folder as it is now; its marker's `files`."""
    marker = _marker(folder)
    if folder.is_dir() and _entries(folder) and marker.get("writer") not in owners:
        owner = marker.get("writer")
        raise WriteRefused(
            f"{flag} {folder}: holds {_listing(folder)}"
            + (f", written by `{owner}`" if owner else ", not written by a latte command (no marker)")
            + f"; `{writer}` writes only into a new or empty folder or one written by `{'` or `'.join(owners)}`: "
            "choose another folder (nothing was written)"
        )
    files = marker.get("files") if isinstance(marker.get("files"), dict) else {}
    for name in names:
        if (folder / name).exists() and files.get(name) != writer:
            by = f"written by `{files[name]}`" if name in files else f"not recorded as written by `{writer}`"
            raise WriteRefused(
                f"{flag} {folder}: {name} is there, {by}; `{writer}` replaces only the files it wrote itself: "
                f"choose another folder or move {folder / name} away (nothing was written)"
            )
    return files


_TEMP = f".{MARKER}.tmp-"  # the marker's temp files: a kill may leave one


def _entries(folder: Path) -> list[Path]:
    """The folder's content, without marker temp files a kill left."""
    return [p for p in folder.iterdir() if not p.name.startswith(_TEMP) and p.name != HOLD]


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on `folder` (flock of its descriptor, released on
    close, also when the process dies): one marker writer at a time."""
    if fcntl is None:  # no flock (nor directory descriptors) off POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_marker(folder: Path, text: str) -> None:
    """The marker written whole (under _locked): temp files of earlier,
    killed writers removed, then a temp file renamed over it."""
    for stale in folder.glob(f"{_TEMP}*"):
        stale.unlink(missing_ok=True)
    tmp = folder / f"{_TEMP}{os.getpid()}"
    try:
        tmp.write_text(text + "\n")
        os.replace(tmp, folder / MARKER)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def check_place(folder: str | os.PathLike, *, flag: str = "--out") -> Path:
    """The refusals that need no marker alone: a WriteRefused when `folder`
    is, or lies inside, a checkpoint, a run or a model's folder, or is, or
    lies under, a file; else the folder."""
    return _not_protected(Path(folder), flag)


def _not_protected(folder: Path, flag: str) -> Path:
    """`folder`, unless it is, or lies inside, a protected folder or is, or
    lies under, a file."""
    under = next((p for p in folder.absolute().parents if p.is_file()), None)
    if under is not None:
        raise WriteRefused(f"{flag} {folder}: {under} is a file, not a folder; choose a folder (nothing was written)")
    for place in (folder, *folder.resolve().parents):
        kind = protected_kind(place)
        if kind:
            where = "" if place.resolve() == folder.resolve() else f" (inside {place}, {kind})"
            raise WriteRefused(f"{flag} {folder}: refusing to write into {kind if not where else 'it'}{where}")
    if folder.exists() and not folder.is_dir():
        raise WriteRefused(f"{flag} {folder}: a file, not a folder")
    return folder


def _marker(folder: Path) -> dict:
    try:
        data = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def written_by(folder: Path) -> str | None:
    """The writer the folder's marker names (None without a readable one)."""
    writer = _marker(folder).get("writer")
    return writer if isinstance(writer, str) else None


def protected_kind(folder: Path) -> str | None:
    """What a folder is when no command may write into it (or below it): a
    checkpoint, a run folder or a base model's folder; None otherwise."""
    if not folder.is_dir():
        return None
    if (folder / "manifest.json").is_file():
        return "a checkpoint (it holds manifest.json)"
    if (folder / "train.lock").exists() or any(p.is_dir() for p in folder.glob("step-*")):
        return "a run folder (it holds step folders or train.lock)"
    if (folder / "config.json").is_file() and any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir() if p.is_file()):
        if written_by(folder) == "latte export":  # an export is replaced only by another export
            return None
        return "a model's folder (config.json and weights)"
    return None


def _listing(folder: Path, shown: int = 5) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in _entries(folder))
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} entr{'y' if len(names) == 1 else 'ies'} ({', '.join(names[:shown])}{more})"
