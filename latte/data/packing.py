"""Tokenize documents once into one flat token file, cached on disk.

The result is a read-only `np.memmap`, so a corpus larger than memory costs
nothing to open and every rank of a distributed run shares the page cache.
The cache file is named by a sha256 of the tokenizer and of every document
(name and text), so any change to either makes a new file, never a stale hit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from latte.data.corpus import Document

_CACHE_VERSION = b"latte-pack-v1"  # bump when the file layout changes
_DOCS_PER_BATCH = 256  # bounds memory: ids of one batch are held at a time


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (half the disk and page cache), else uint32."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r}: must be >= 1")
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size={vocab_size}: must be <= 2**32")


def check_token_ids(tokens, vocab_size: int, *, where: str) -> None:
    """Refuse token ids outside [0, vocab_size): an embedding lookup would fail
    much later with a less helpful message (or silently on some devices)."""
    tokens = np.asarray(tokens)
    if tokens.size == 0:
        return
    hi, lo = int(tokens.max()), int(tokens.min())
    if hi >= vocab_size or lo < 0:
        bad = hi if hi >= vocab_size else lo
        raise ValueError(
            f"{where}: token id {bad} (max id {hi}, min id {lo}) is outside "
            f"[0, vocab_size={vocab_size}); was the data tokenized with a "
            "different tokenizer?"
        )


def _cache_key(docs: Sequence[Document], tokenizer) -> str:
    h = hashlib.sha256(_CACHE_VERSION)
    fp = tokenizer.fingerprint()
    h.update(len(fp).to_bytes(8, "little") + fp)
    for doc in docs:  # length-prefixed so ("ab","c") != ("a","bc")
        for part in (doc.name.encode("utf-8"), doc.text.encode("utf-8")):
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _read_cache(bin_path: Path, meta_path: Path):
    """The cached memmap, or None when absent or inconsistent (then rebuilt)."""
    if not (bin_path.is_file() and meta_path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        dtype, count = np.dtype(meta["dtype"]), int(meta["count"])
    except (ValueError, KeyError, TypeError):
        return None
    if bin_path.stat().st_size != count * dtype.itemsize:
        return None
    if count == 0:  # np.memmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(bin_path, dtype=dtype, mode="r", shape=(count,))


def _write_tokens(docs, tokenizer, dtype: np.dtype, tmp_path: Path) -> int:
    """Stream ids to `tmp_path`, eos after every document; returns the count."""
    count = 0
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    with open(tmp_path, "wb") as f:
        for start in range(0, len(docs), _DOCS_PER_BATCH):
            batch = docs[start : start + _DOCS_PER_BATCH]
            for ids in tokenizer.encode_batch([d.text for d in batch]):
                arr = np.asarray(ids, dtype=np.int64)
                check_token_ids(arr, tokenizer.vocab_size, where="tokenizer output")
                arr.astype(dtype).tofile(f)
                eos.tofile(f)
                count += len(arr) + 1
        f.flush()
        os.fsync(f.fileno())
    return count


def pack_documents(docs: Sequence[Document], tokenizer, *, cache_dir: str | Path) -> np.ndarray:
    """All documents tokenized and concatenated, `eos` after each one.

    Written once to `cache_dir/<sha256>.bin` plus a `.json` sidecar (dtype,
    count, vocab_size) and reused on later calls. Both files are written to
    a temporary name and moved into place with `os.replace`, the sidecar
    last, so a run killed mid-write leaves no cache that looks valid.
    Returns a read-only memmap (uint16 for vocab_size <= 65536, else uint32).
    """
    docs = list(docs)
    if not docs:
        raise ValueError("docs is empty: nothing to pack")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = _cache_key(docs, tokenizer)
    bin_path, meta_path = cache_dir / f"{key}.bin", cache_dir / f"{key}.json"
    cached = _read_cache(bin_path, meta_path)
    if cached is not None:
        return cached
    dtype = token_dtype(tokenizer.vocab_size)
    suffix = f".tmp{os.getpid()}"
    tmp_bin = bin_path.with_name(bin_path.name + suffix)
    tmp_meta = meta_path.with_name(meta_path.name + suffix)
    try:
        count = _write_tokens(docs, tokenizer, dtype, tmp_bin)
        os.replace(tmp_bin, bin_path)
        meta = {
            "dtype": dtype.name,
            "count": count,
            "vocab_size": tokenizer.vocab_size,
            "num_documents": len(docs),
            "eos_id": tokenizer.eos_id,
        }
        tmp_meta.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp_meta, meta_path)
    finally:
        for tmp in (tmp_bin, tmp_meta):
            tmp.unlink(missing_ok=True)
    cached = _read_cache(bin_path, meta_path)
    assert cached is not None, f"{bin_path}: cache unreadable right after writing"
    return cached
