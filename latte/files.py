"""Writing and hashing files, for every part of the package: a write that
survives a crash (the checkpoint commit protocol, docs/design.md §7, and every
result file rely on it), the sha256 of a file, and a JSON file written in one
go. The lowest layer: it imports nothing from latte."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Writes `path` so that it holds either the old or the new content, even
    across a crash: temp file in the same directory, fsync, os.replace, then
    fsync the directory so the rename itself is durable."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:  # e.g. disk full: name the file, leave no temp file behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}", str(path)) from e


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in `chunk`-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """`obj` as indented JSON (creating the folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
