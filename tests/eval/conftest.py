"""Fixtures of the evaluation tests."""

import pytest

from tests.helpers import tiny_llama as llama


@pytest.fixture
def tiny_llama():
    """A factory of a tiny random Llama (seed 0) and, as its tokenizer, a
    300-token BPE of the first `documents` of Python's help text: the
    stand-in for SmolLM2 in the lm-eval tests. Needs transformers."""

    def make(*, documents: int, max_positions: int):

        from latte.data import load_documents, train_bpe
        from latte.models.pretrained import transformers_tokenizer

        tok = train_bpe((d.text for d in load_documents("pydoc")[:documents]), vocab_size=300)
        return llama(300, max_positions), transformers_tokenizer(tok)

    return make
