"""The three LRA tasks that need downloads, read from the files as published.

Nothing is downloaded: each loader reads a local path and, when the files
are missing, raises FileNotFoundError naming what to get and where to put it.

- Text (IMDb reviews, byte level): the `aclImdb` folder of aclImdb_v1.tar.gz
  (train/{pos,neg}/*.txt, test/{pos,neg}/*.txt; label 1 = pos). The LRA
  evaluated on the test split for validation too; here validation is a fixed
  10% of the training reviews (chosen by a hash of the file name) so the test
  split is never used for choices.
- Retrieval (ACL Anthology Network pairs, byte level, two documents per
  example): the LRA release's `tsv_data/new_aan_pairs.{train,eval,test}.tsv`,
  tab-separated without header or quoting: label (0.0/1.0), id1, id2, text1, text2.
- Image (CIFAR-10 in grey, 1024 pixels): the `cifar-10-batches-py` folder of
  cifar-10-python.tar.gz (data_batch_1..5, test_batch). Grey = round(0.2989 R +
  0.5870 G + 0.1140 B) as tf.image.rgb_to_grayscale; validation = the last
  10% of the training images, as the LRA (train[90%:]).

Byte-level tokens: 0 pad, 1 cls, byte b -> b + 2 (vocabulary 258).
CIFAR pixels: value v -> v, 256 cls (vocabulary 257).
"""

from __future__ import annotations

import csv
import pickle
import sys
from pathlib import Path

import numpy as np

from latte.data.classification import ClassificationData, Sequences
from latte.data.corpus import unit_hash
from latte.data.lra.common import MissingDataError, utf8_lines

BYTE_PAD_ID, BYTE_CLS_ID, BYTE_OFFSET, BYTE_VOCAB_SIZE = 0, 1, 2, 258
PIXEL_CLS_ID, PIXEL_VOCAB_SIZE = 256, 257
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


def encode_bytes(text: str | bytes, max_length: int) -> np.ndarray:
    """UTF-8 bytes shifted past pad and cls, cut to max_length."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return np.frombuffer(raw[:max_length], dtype=np.uint8).astype(np.int64) + BYTE_OFFSET


def _missing(task: str, path: Path, what: str, url: str) -> MissingDataError:
    return MissingDataError(
        f"LRA {task}: {path} not found. This task needs {what}: download {url}, extract it, and pass "
        f"the folder as data.path (latte never downloads data itself)."
    )


# ---------------------------------------------------------------------------------------- text


def load_imdb(path: str | Path, *, max_length: int = 4000, val_fraction: float = 0.1) -> dict[str, ClassificationData]:
    """{"train", "validation", "test"} from an `aclImdb` folder (or its parent)."""
    root = Path(path).expanduser()
    if (root / "aclImdb").is_dir():
        root = root / "aclImdb"
    if not (root / "train").is_dir() or not (root / "test").is_dir():
        raise _missing("text", root, "the IMDb reviews (folder aclImdb with train/ and test/)", IMDB_URL)
    splits = {}
    for split in ("train", "test"):
        files = []
        for label, name in ((0, "neg"), (1, "pos")):
            folder = root / split / name
            if not folder.is_dir():
                raise _missing("text", folder, "the IMDb reviews (aclImdb/<split>/pos and neg)", IMDB_URL)
            files += [(p, label) for p in sorted(folder.glob("*.txt"))]
        if not files:
            raise ValueError(f"LRA text: {root / split} holds no reviews (*.txt under pos/ and neg/)")
        splits[split] = files
    held = [unit_hash(p.name) < val_fraction for p, _ in splits["train"]]
    parts = {
        "train": [f for f, h in zip(splits["train"], held) if not h],
        "validation": [f for f, h in zip(splits["train"], held) if h],
        "test": splits["test"],
    }
    return {
        name: _byte_data([_review(p, max_length) for p, _ in files], [label for _, label in files])
        for name, files in parts.items()
    }


def _review(path: Path, max_length: int) -> np.ndarray:
    ids = encode_bytes(path.read_bytes(), max_length)
    if not len(ids):
        raise ValueError(f"{path}: an empty review; every example needs at least one byte (remove the file)")
    return ids


def _byte_data(seqs, labels, second=None) -> ClassificationData:
    first = Sequences.from_list(seqs, vocab_size=BYTE_VOCAB_SIZE)
    inputs = first if second is None else (first, Sequences.from_list(second, vocab_size=BYTE_VOCAB_SIZE))
    return ClassificationData(
        inputs, labels, num_classes=2, vocab_size=BYTE_VOCAB_SIZE, pad_id=BYTE_PAD_ID, cls_id=None
    )


# ---------------------------------------------------------------------------------------- retrieval

AAN_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "validation": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}


def load_aan(path: str | Path, *, max_length: int = 4000) -> dict[str, ClassificationData]:
    """{"train", "validation", "test"} pairs from the LRA `tsv_data` folder
    (or a folder above it: lra_release/ or lra_release/lra_release/)."""
    root = Path(path).expanduser()
    for sub in ("", "tsv_data", "lra_release/tsv_data", "lra_release/lra_release/tsv_data"):
        if (root / sub / AAN_FILES["train"]).is_file():
            root = root / sub
            break
    out = {}
    for split, name in AAN_FILES.items():
        file = root / name
        if not file.is_file():
            raise _missing("retrieval", file, f"the AAN pairs of the LRA release (tsv_data/{name})", LRA_URL)
        out[split] = _read_aan(file, max_length)
    return out


def _read_aan(file: Path, max_length: int) -> ClassificationData:
    first, second, labels = [], [], []
    csv.field_size_limit(sys.maxsize)  # the documents are whole papers
    rows = csv.reader(utf8_lines(file), delimiter="\t", quoting=csv.QUOTE_NONE)  # non-UTF-8: file and line named
    for line, row in enumerate(rows, start=1):
        if len(row) != 5:
            raise ValueError(
                f"{file}:{line}: expected 5 tab-separated fields (label, id1, id2, text1, text2), got {len(row)}"
            )
        try:
            label = float(row[0])
        except ValueError:
            label = -1.0
        if label not in (0.0, 1.0):
            raise ValueError(f"{file}:{line}: label {row[0]!r} is not 0 or 1")
        empty = [name for name, text in (("text1", row[3]), ("text2", row[4])) if not text]
        if empty:
            raise ValueError(f"{file}:{line}: {' and '.join(empty)} empty; every document needs at least one byte")
        labels.append(int(label))
        first.append(encode_bytes(row[3], max_length))
        second.append(encode_bytes(row[4], max_length))
    if not labels:
        raise ValueError(f"{file}: no examples")
    return _byte_data(first, labels, second)


# ---------------------------------------------------------------------------------------- image

CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR batch holds (dicts, lists, str/bytes, ints
    and numpy arrays); any other global is refused, so a tampered file
    cannot run code."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            if module.startswith("numpy.core.") and hasattr(np, "_core"):  # numpy 2 moved numpy.core
                module = "numpy._core." + module[len("numpy.core.") :]
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}: not part of a CIFAR-10 batch")


def read_cifar_batch(file: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 32, 32, 3], labels int64 [N]) of one CIFAR-10 python batch."""
    file = Path(file)
    with file.open("rb") as f:
        try:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            raise ValueError(f"{file}: not a CIFAR-10 python batch ({e})") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{file}: not a CIFAR-10 python batch (expected a dict, got {type(batch).__name__})")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{file}: 'data' must be a uint8 array [N, 3072] (R, G, B planes of 32x32)")
    labels = _labels(file, labels, len(data))
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def _labels(file: Path, labels, n: int) -> np.ndarray:
    """A batch's 'labels': n integer classes in 0-9 (no silent truncation of floats)."""
    expected = f"{file}: 'labels' must be a list of {n} integer classes in 0-9"
    if not isinstance(labels, (list, tuple, np.ndarray)):
        raise ValueError(f"{expected}, got {'nothing' if labels is None else type(labels).__name__}")
    try:
        values = np.asarray(labels)
    except ValueError:
        raise ValueError(f"{expected}, got a ragged list") from None
    if values.size and values.dtype.kind not in "iu":
        raise ValueError(f"{expected}, got {values.dtype} values such as {values.flat[0].item()!r}")
    values = values.astype(np.int64)
    if values.shape != (n,) or (values.size and (values.min() < 0 or values.max() > 9)):
        raise ValueError(
            f"{expected}, got shape {values.shape}, values {values.min() if values.size else '-'}-"
            f"{values.max() if values.size else '-'}"
        )
    return values


def to_grey(images_rgb: np.ndarray) -> np.ndarray:
    """uint8 [N, H, W, 3] -> uint8 [N, H, W] with the ITU-R 601 weights of tf.image.rgb_to_grayscale."""
    grey = images_rgb.astype(np.float64) @ np.array([0.2989, 0.5870, 0.1140])
    return np.clip(np.round(grey), 0, 255).astype(np.uint8)


def load_cifar10(path: str | Path, *, val_fraction: float = 0.1) -> dict[str, ClassificationData]:
    """{"train", "validation", "test"} from a `cifar-10-batches-py` folder (or its parent)."""
    root = Path(path).expanduser()
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    files = [root / n for n in (*CIFAR_TRAIN, "test_batch")]
    for f in files:
        if not f.is_file():
            raise _missing(
                "image", f, "CIFAR-10 for python (cifar-10-batches-py/data_batch_1..5, test_batch)", CIFAR_URL
            )
    train = [read_cifar_batch(f) for f in files[:-1]]
    x_train = to_grey(np.concatenate([x for x, _ in train]))
    y_train = np.concatenate([y for _, y in train])
    x_test, y_test = read_cifar_batch(files[-1])
    cut = len(x_train) - int(round(val_fraction * len(x_train)))
    return {
        "train": pixel_data(x_train[:cut], y_train[:cut], 10),
        "validation": pixel_data(x_train[cut:], y_train[cut:], 10),
        "test": pixel_data(to_grey(x_test), y_test, 10),
    }


def pixel_data(images: np.ndarray, labels, num_classes: int) -> ClassificationData:
    """Images uint8 [N, H, W] as sequences of H*W pixel values (row by row)."""
    n = len(images)
    flat = np.ascontiguousarray(images.reshape(n, -1))
    offsets = np.arange(n + 1, dtype=np.int64) * flat.shape[1]
    return ClassificationData(
        Sequences(flat.reshape(-1), offsets),
        labels,
        num_classes=num_classes,
        vocab_size=PIXEL_VOCAB_SIZE,
        pad_id=0,
        cls_id=None,
    )
