"""Synthetic retrieval documents for conversion up-training (docs/conversion.md
§9): ordinary prose with a few facts planted early and asked for at the end,
hundreds of tokens later, beyond a 128-token window, so that only a state
that carries them (the latents) can predict the answers.

Format (deliberately unlike the needle evaluation's, which plants "The pass
key is NNNNN. Remember it." in essays and asks for a 5-digit number):

    ...prose... (Note: the code word of Maren Holt is amber heron.) ...prose...
    ...
    Recall. The code word of Maren Holt is amber heron. The code word of ...

Keys are invented names, values two words (never digits), three facts per
document, asked for in a shuffled order. The prose is cut from the essays
training may read and the World English Bible (latte.data.heldout,
latte.data.bible), never from evaluation text. Deterministic in `seed`.
"""

from __future__ import annotations

import random

from .bible import load_bible_web
from .corpus import Document, named_source
from .heldout import train_essays

FIRST = ("Maren", "Tobin", "Ilse", "Caspar", "Wren", "Odile", "Bram", "Sefa", "Lior", "Nadia", "Ewan", "Petra")
LAST = ("Holt", "Varga", "Quill", "Ashby", "Moreau", "Lind", "Okafor", "Brandt", "Sorel", "Pike", "Ferro", "Dunmore")
ADJECTIVES = ("amber", "silver", "quiet", "crimson", "hollow", "northern", "velvet", "bitter", "gentle", "copper")
NOUNS = ("heron", "lantern", "orchard", "compass", "harbor", "thistle", "anvil", "meadow", "falcon", "ledger")


def _sentences(texts: list[str]) -> list[str]:
    out = []
    for text in texts:
        for part in text.replace("\n", " ").split(". "):
            part = " ".join(part.split())
            if 20 <= len(part) <= 300:
                out.append(part.rstrip(".") + ".")
    return out


@named_source("retrieval")
def load_retrieval(count: int = 300, *, seed: int = 0, facts: int = 3, sentences: int = 32) -> list[Document]:
    """`count` documents of about `sentences` prose sentences (~700-900
    SmolLM2 tokens) with `facts` planted in the first half and recalled at
    the end."""
    pool = _sentences([d.text for d in train_essays()] + [d.text for d in load_bible_web()])
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        start = rng.randrange(len(pool) - sentences)
        prose = pool[start : start + sentences]
        names = rng.sample([f"{a} {b}" for a in FIRST for b in LAST], facts)
        values = [f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}" for _ in names]
        spots = sorted(rng.sample(range(1, sentences // 2), facts))
        for k, (spot, name, value) in enumerate(zip(spots, names, values)):
            prose.insert(spot + k, f"(Note: the code word of {name} is {value}.)")
        order = rng.sample(range(facts), facts)
        recall = " ".join(f"The code word of {names[j]} is {values[j]}." for j in order)
        docs.append(Document(f"retrieval-{seed}-{i:05d}", " ".join(prose) + "\n\nRecall. " + recall))
    return docs
