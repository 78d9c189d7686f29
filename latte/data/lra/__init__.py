"""Long Range Arena data (Tay et al. 2021), the five classification tasks.

    splits, info = load_task("listops", sizes={"train": 20000, "validation": 1000, "test": 1000})
    splits["train"]           # ClassificationData; batches of input_ids / attention_mask / labels

- listops, pathfinder: generated here (seeded, cached on disk, in parallel
  over cores; see listops.py, pathfinder.py). ListOps also reads the LRA
  release's TSV files when a path is given.
- text (IMDb bytes), retrieval (AAN pairs), image (CIFAR-10 grey): read from
  local copies of the published files (files.py); nothing is downloaded.

`info` holds what a model needs (vocab_size, num_classes, cls_id, the
longest input) and what produced the data (settings, label counts, speed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from latte.data.classification import ClassificationData
from latte.data.lra import files, listops, pathfinder
from latte.data.lra.common import SPLITS, MissingDataError, cached_splits, default_workers
from latte.data.lra.listops import ListOpsSpec
from latte.data.lra.pathfinder import PathfinderSpec

TASKS = ("listops", "pathfinder", "text", "retrieval", "image")
GENERATED = ("listops", "pathfinder")
# (num_classes, vocab_size, cls_id) of each task's token ids
VOCAB = {
    "listops": (listops.NUM_CLASSES, listops.VOCAB_SIZE, listops.CLS_ID),
    "pathfinder": (pathfinder.NUM_CLASSES, pathfinder.VOCAB_SIZE, pathfinder.CLS_ID),
    "text": (2, files.BYTE_VOCAB_SIZE, files.BYTE_CLS_ID),
    "retrieval": (2, files.BYTE_VOCAB_SIZE, files.BYTE_CLS_ID),
    "image": (10, files.PIXEL_VOCAB_SIZE, files.PIXEL_CLS_ID),
}


def load_task(
    task: str,
    *,
    path: str | None = None,
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    cache_dir: str | Path = "runs/.cache",
    num_workers: int | None = None,
    max_length: int = 4000,
    listops_spec: ListOpsSpec = ListOpsSpec(),
    pathfinder_spec: PathfinderSpec = PathfinderSpec(),
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, ClassificationData], dict]:
    """(splits {"train", "validation", "test"}, info) of one LRA task.

    sizes: examples per split of a generated task. path: the local files of
    text / retrieval / image (or of the LRA ListOps release). max_length: bytes
    kept per document (text, retrieval). num_workers: generator processes
    (None: every usable core)."""
    if task not in TASKS:
        raise ValueError(f"task={task!r}: expected one of {', '.join(TASKS)}")
    report: dict = {}
    if task in GENERATED and path is None:
        spec = listops_spec if task == "listops" else pathfinder_spec
        splits, report = _generated(task, sizes, seed, spec, cache_dir, num_workers or default_workers(), log)
    else:
        splits = _published(task, path, max_length)
    num_classes, vocab_size, cls_id = VOCAB[task]
    info = {
        "task": task,
        "num_classes": num_classes,
        "vocab_size": vocab_size,
        "cls_id": cls_id,
        "pair": splits["train"].is_pair,
        "max_length": max(d.max_length() for d in splits.values()),
        "examples": {s: len(splits[s]) for s in SPLITS},
        "label_counts": {s: splits[s].label_counts().tolist() for s in SPLITS},
        "source": path or "generated",
        "generator": report,
    }
    return splits, info


def _generated(task, sizes, seed, spec, cache_dir, workers, log) -> tuple[dict[str, ClassificationData], dict]:
    """(splits, the generator's report) of ListOps or Pathfinder, generated
    once per settings and cached."""
    missing = [s for s in SPLITS if not isinstance((sizes or {}).get(s), int) or sizes[s] < 1]
    if missing:
        raise ValueError(f"task={task!r} is generated: sizes needs a positive count for {missing} (got {sizes})")
    gen = listops.generate_listops if task == "listops" else pathfinder.generate_pathfinder
    settings = {"sizes": {s: sizes[s] for s in SPLITS}, "seed": seed, "spec": dataclasses.asdict(spec)}
    return cached_splits(
        cache_dir,
        task,
        settings,
        lambda: gen(settings["sizes"], seed=seed, spec=spec, num_workers=workers),
        log=log,
    )


def _published(task: str, path: str | None, max_length: int) -> dict[str, ClassificationData]:
    """The splits of a task read from its published files at `path`."""
    if path is None:
        raise ValueError(
            f"task={task!r} reads published files: set data.path to a local copy ({_WHAT[task]}); nothing is downloaded"
        )
    if task == "listops":
        return _listops_release(Path(path).expanduser())
    if task == "pathfinder":
        raise ValueError(
            "task='pathfinder': reading the released Pathfinder PNGs is not supported; "
            "leave data.path unset to generate the images (same process, seeded)"
        )
    if task == "text":
        return files.load_imdb(path, max_length=max_length)
    if task == "retrieval":
        return files.load_aan(path, max_length=max_length)
    return files.load_cifar10(path)


_WHAT = {"text": files.IMDB_URL, "retrieval": files.LRA_URL + " (tsv_data)", "image": files.CIFAR_URL}
LISTOPS_FILES = {"train": "basic_train.tsv", "validation": "basic_val.tsv", "test": "basic_test.tsv"}


def _listops_release(root: Path) -> dict[str, ClassificationData]:
    """The LRA release's lra_release/listops-1000/basic_{train,val,test}.tsv."""
    out = {}
    for split, name in LISTOPS_FILES.items():
        file = root / name
        if not file.is_file():
            raise MissingDataError(
                f"LRA listops: {file} not found; data.path should be the listops-1000 folder "
                f"of {files.LRA_URL}, or leave it unset to generate the data"
            )
        seqs, labels = listops.read_lra_tsv(file)
        out[split] = listops.to_data(seqs, labels)
    return out


__all__ = ["GENERATED", "ListOpsSpec", "PathfinderSpec", "TASKS", "VOCAB", "load_task"]
