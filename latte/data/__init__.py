"""Text data: corpora, tokenizer, token packing and resumable rank-aware
loading; synthetic tasks (MQAR associative recall).

Typical use:
    docs = load_documents("shakespeare")
    train_docs, val_docs = split_documents(docs, val_fraction=0.1)
    tok = train_bpe(d.text for d in train_docs)
    train = TokenWindows(pack_documents(train_docs, tok, cache_dir=cache), seq_len)
    loader = SampleLoader(train, global_batch_size=64, rank=rank, world_size=world)
"""

# imported for their effect: the named sources "bible-web", "essays" and
# "retrieval" register themselves with load_documents (corpus.NAMED_SOURCES)
from latte.data import bible, heldout, retrieval  # noqa: F401
from latte.data.corpus import Document, load_documents, split_documents
from latte.data.heldout import eval_essays, eval_plays
from latte.data.loader import (
    SampleLoader,
    TokenWindows,
    iter_eval_batches,
    unigram_perplexity,
)
from latte.data.mqar import IGNORE_INDEX, MQARData, check_mqar_args, mqar, mqar_splits
from latte.data.packing import check_token_ids, pack_documents, token_dtype
from latte.data.tokenizer import EOS_TOKEN, Tokenizer, load_tokenizer, train_bpe

__all__ = [
    "Document",
    "EOS_TOKEN",
    "IGNORE_INDEX",
    "MQARData",
    "SampleLoader",
    "TokenWindows",
    "Tokenizer",
    "check_mqar_args",
    "check_token_ids",
    "eval_essays",
    "eval_plays",
    "iter_eval_batches",
    "load_documents",
    "load_tokenizer",
    "mqar",
    "mqar_splits",
    "pack_documents",
    "split_documents",
    "token_dtype",
    "train_bpe",
    "unigram_perplexity",
]
