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
Standard library only: the GPU suite uses it before its packages exist.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: claims are not locked
    fcntl = None

MARKER = ".latte-written-by.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


class WriteRefused(ValueError):
    """A folder the write rule forbids (the CLI exits 2)."""


def claim_folder(folder: str | os.PathLike, writer: str, *, flag: str = "--out") -> Path:
    """Checks `folder` against the write rule for `writer` (a command such as
    "latte export"), creates it if missing and leaves the marker: from then
    on only `writer` may write there again. Returns the folder."""
    folder = check_folder(folder, writer, flag=flag)
    if written_by(folder) == writer:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):  # another command may have claimed it since the check: check again
        check_folder(folder, writer, flag=flag)
        if written_by(folder) != writer:
            _write_marker(folder, json.dumps({"writer": writer}))
    return folder


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
    return [p for p in folder.iterdir() if not p.name.startswith(_TEMP)]


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


def _not_protected(folder: Path, flag: str) -> Path:
    """`folder`, unless it is, or lies inside, a protected folder or is a file."""
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
