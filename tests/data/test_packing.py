import json
import os

import numpy as np
import pytest

from latte.data import Document, check_token_ids, pack_documents, token_dtype


@pytest.fixture()
def docs(pydoc_docs):
    return pydoc_docs[20:30]


class CountingTokenizer:
    """Wraps a Tokenizer and counts encode_batch calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.vocab_size, self.eos_id = inner.vocab_size, inner.eos_id

    def fingerprint(self):
        return self.inner.fingerprint()

    def encode_batch(self, texts):
        self.calls += 1
        return self.inner.encode_batch(texts)


def test_memmap_equals_direct_encoding(docs, small_tokenizer, tmp_path):
    tokens = pack_documents(docs, small_tokenizer, cache_dir=tmp_path)
    expected = []
    for d in docs:
        expected += small_tokenizer.encode(d.text) + [small_tokenizer.eos_id]
    assert isinstance(tokens, np.memmap)
    assert tokens.dtype == np.uint16
    np.testing.assert_array_equal(tokens, np.array(expected))
    assert int((tokens == small_tokenizer.eos_id).sum()) == len(docs)
    with pytest.raises(ValueError):  # read-only
        tokens[0] = 1


def test_cache_is_reused_not_retokenized(docs, small_tokenizer, tmp_path):
    tok = CountingTokenizer(small_tokenizer)
    first = pack_documents(docs, tok, cache_dir=tmp_path)
    assert tok.calls == 1
    (bin_path,) = tmp_path.glob("*.bin")
    mtime = bin_path.stat().st_mtime_ns
    second = pack_documents(docs, tok, cache_dir=tmp_path)
    assert tok.calls == 1 and bin_path.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(first, second)
    meta = json.loads(bin_path.with_suffix(".json").read_text())
    assert meta["count"] == len(first) and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == 512
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [bin_path.name, bin_path.with_suffix(".json").name]
    )  # no temporary files left behind


def test_changed_text_or_name_gives_new_cache(docs, small_tokenizer, tmp_path):
    tok = CountingTokenizer(small_tokenizer)
    pack_documents(docs, tok, cache_dir=tmp_path)
    edited = [Document(docs[0].name, docs[0].text + "!")] + list(docs[1:])
    renamed = [Document("renamed", docs[0].text)] + list(docs[1:])
    pack_documents(edited, tok, cache_dir=tmp_path)
    pack_documents(renamed, tok, cache_dir=tmp_path)
    assert tok.calls == 3
    assert len(list(tmp_path.glob("*.bin"))) == 3


def test_incomplete_cache_is_rebuilt(docs, small_tokenizer, tmp_path):
    tok = CountingTokenizer(small_tokenizer)
    good = np.array(pack_documents(docs, tok, cache_dir=tmp_path))
    (bin_path,) = tmp_path.glob("*.bin")
    bin_path.with_suffix(".json").unlink()  # as if killed before the sidecar
    np.testing.assert_array_equal(pack_documents(docs, tok, cache_dir=tmp_path), good)
    assert tok.calls == 2
    with open(bin_path, "r+b") as f:  # truncated data file
        f.truncate(10)
    np.testing.assert_array_equal(pack_documents(docs, tok, cache_dir=tmp_path), good)
    assert tok.calls == 3


class BigVocabTokenizer:
    """Fake tokenizer whose ids need more than 16 bits."""

    vocab_size, eos_id = 70_000, 69_999

    def fingerprint(self):
        return b"big"

    def encode_batch(self, texts):
        return [[65_536 + len(t), 3] for t in texts]


def test_dtype_choice(tmp_path):
    assert token_dtype(512) == np.uint16
    assert token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    tokens = pack_documents([Document("a", "xy"), Document("b", "z")], BigVocabTokenizer(), cache_dir=tmp_path)
    assert tokens.dtype == np.uint32
    assert tokens.tolist() == [65_538, 3, 69_999, 65_537, 3, 69_999]


def test_check_token_ids_message():
    check_token_ids(np.array([0, 5, 9]), 10, where="train.bin")
    with pytest.raises(ValueError, match=r"train\.bin: token id 12 \(max id 12.*vocab_size=10"):
        check_token_ids(np.array([0, 12, 3]), 10, where="train.bin")
    with pytest.raises(ValueError, match="token id -1"):
        check_token_ids(np.array([-1, 2]), 10, where="x")


def test_empty_docs_rejected(small_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="docs is empty"):
        pack_documents([], small_tokenizer, cache_dir=tmp_path)
    assert not os.listdir(tmp_path)
