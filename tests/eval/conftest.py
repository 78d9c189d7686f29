"""Fixtures of the evaluation tests."""

import pytest
import torch


@pytest.fixture
def tiny_llama():
    """A factory of a tiny random Llama (seed 0) and, as its tokenizer, a
    300-token BPE of the first `documents` of Python's help text: the
    stand-in for SmolLM2 in the lm-eval tests. Needs transformers."""

    def make(*, documents: int, max_positions: int):
        import transformers

        from latte.data import load_documents, train_bpe
        from latte.models.pretrained import transformers_tokenizer

        tok = train_bpe((d.text for d in load_documents("pydoc")[:documents]), vocab_size=300)
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
        )
        return transformers.LlamaForCausalLM(cfg), transformers_tokenizer(tok)

    return make
