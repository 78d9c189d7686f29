"""What the generated tasks share: shards run over cores, and a disk cache.

Determinism. A generated data set is a stream of shards; shard i is drawn
from a generator seeded by (seed, i) alone, and shards are consumed in index
order. The result therefore depends on the seed and the sizes, never on the
number of worker processes. Splits are cut from the stream in the order
test, validation, train, so asking for a larger training set keeps the same
test and validation examples.

Cache. The splits are saved under `cache_dir/<name>-<hash of the settings>/`
(flat .npy arrays, see `ClassificationData.save`) with `meta.json`, written to
a temporary folder first and renamed into place, so a killed run leaves no
half-written cache and concurrent runs cannot read one.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from latte.data.classification import ClassificationData
from latte.files import atomic_write

SPLITS = ("train", "validation", "test")
CACHE_VERSION = 1  # bump when a generator or the file layout changes


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_shards(fn: Callable, args: Iterator[tuple], num_workers: int) -> Iterator:
    """fn(*a) for each a of `args`, results in order. With num_workers > 1 the
    shards run in fresh ("spawn") processes, at most 2 x num_workers ahead of
    the consumer, so an unbounded `args` stops when the consumer does.

    Workers are forked where the platform can (fast; the shard functions use
    numpy and Python only, never torch), else spawned (then `fn` must be
    importable and the caller's main module guarded by __name__ == "__main__")."""
    if num_workers <= 1:
        for a in args:
            yield fn(*a)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(num_workers, mp_context=ctx) as pool:
        pending = []
        try:
            for a in args:
                pending.append(pool.submit(fn, *a))
                if len(pending) >= 2 * num_workers:
                    yield pending.pop(0).result()
            while pending:
                yield pending.pop(0).result()
        finally:
            for f in pending:
                f.cancel()


def settings_key(name: str, settings: dict) -> str:
    """A short stable hash of everything that determines the generated data."""
    text = json.dumps({"name": name, "version": CACHE_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_splits(
    cache_dir: str | Path,
    name: str,
    settings: dict,
    build: Callable[[], tuple[dict[str, ClassificationData], dict]],
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, ClassificationData], dict]:
    """The splits for `settings`, from the cache or built (and cached) by
    `build() -> (splits, report)`. Returns (splits, meta) where meta holds the
    settings and the build report (timings, label counts)."""
    folder = Path(cache_dir).expanduser() / f"{name}-{settings_key(name, settings)}"
    if (folder / "meta.json").is_file():
        meta = json.loads((folder / "meta.json").read_text())
        return {s: ClassificationData.load(folder, s) for s in SPLITS}, meta
    t0 = time.perf_counter()
    splits, report = build()
    meta = {
        "name": name,
        "settings": settings,
        "build_s": round(time.perf_counter() - t0, 2),
        **report,
        "label_counts": {s: splits[s].label_counts().tolist() for s in SPLITS},
    }
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for s in SPLITS:
            splits[s].save(tmp, s)
        atomic_write(tmp / "meta.json", json.dumps(meta, indent=1) + "\n")
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished the same build first: use its copy
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if log is not None:
        log(f"{name}: generated and cached in {folder} ({meta['build_s']:.1f} s)")
    return {s: ClassificationData.load(folder, s) for s in SPLITS}, meta


class MissingDataError(FileNotFoundError, ValueError):
    """Input files a task needs are not where data.path says: a user error
    (`latte train` exits 2), still a FileNotFoundError for callers."""


def utf8_lines(path: Path) -> Iterator[str]:
    """The lines of a text file; a byte that is not UTF-8 is a ValueError
    naming the file, the line and the column (not a bare decode error)."""
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                    "the file must be UTF-8 text"
                ) from None


def split_stream(items: list, sizes: dict[str, int]) -> dict[str, list]:
    """Cut test, then validation, then train from the front of `items`."""
    out, start = {}, 0
    for s in ("test", "validation", "train"):
        out[s] = items[start : start + sizes[s]]
        start += sizes[s]
    return out
