"""Shared fixtures for the data tests: a small BPE trained once per session."""

import pytest

from latte.data import load_documents, train_bpe


@pytest.fixture(scope="session")
def pydoc_docs():
    return load_documents("pydoc")


@pytest.fixture(scope="session")
def small_tokenizer(pydoc_docs):
    """512-token byte-level BPE on ~100K characters of Python's help text."""
    return train_bpe([d.text for d in pydoc_docs[:20]], vocab_size=512)
