"""Point every citation of the old design notes at the project's own docs/.

Code and tests used to cite four notes that are not part of the repository
(the math, style, evaluation and reliability notes) by their upper-case file
names, sometimes with a machine path in front. This rewrites each such
citation in place to the page and section of docs/ that now holds the same
content, e.g. "<math note> 3.2" -> "docs/math.md §3.2", "<style note> habit 5"
-> "docs/design.md habit 5", and prints every change as `path:line: old -> new`.

    python tools/rewrite_citations.py            # latte/, tests/ and README.md
    python tools/rewrite_citations.py --check    # report only; exit 1 if anything would change
    python tools/rewrite_citations.py PATH ...   # other files or folders

Running it twice changes nothing the second time (the targets are lower-case
docs/ paths, which no rule matches). tests/test_citations.py checks the result.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATHS = ("latte", "tests", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".json", ".sh", ""}
SKIP_DIRS = {"__pycache__", ".git", ".pytest_cache", "runs"}

# The old note names, each with the docs/ page that replaces it. Written in
# pieces so that this file is not itself a citation of them.
MATH, STYLE, EVAL, RELIABILITY = ("MATH", "STYLE", "EVAL", "RELIABILITY")
TARGET = {MATH: "docs/math.md", STYLE: "docs/design.md", EVAL: "docs/evaluation.md", RELIABILITY: "docs/reliability.md"}
# An optional path in front of a name (the notes lived in a folder named
# "spec" inside a "shared" folder beside the checkout).
PREFIX = r"(?:[\w./~-]*shared/" + "spec/)?"
NUMBER = r"\d+(?:\.\d+)?"
NUMBERS = rf"{NUMBER}(?:(?:, |,|-| and ){NUMBER})*"


def _note(name: str) -> str:
    """Regex for the old note `name` (with an optional path in front)."""
    return rf"(?<![\w/]){PREFIX}{name}\.md\b"


def _sections(numbers: str) -> str:
    """'2, 3, 5' -> '§2, §3, §5'; '1-2' (a range) -> '§1, §2'."""
    out = []
    for part in re.split(r", |,| and ", numbers):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if lo.isdigit() and hi.isdigit() and int(lo) < int(hi):
                out += [str(n) for n in range(int(lo), int(hi) + 1)]
                continue
        out.append(part)
    return ", ".join(f"§{n}" for n in out)


def _numbered(name: str):
    """'<note> 3.2', '<note> section 5', '<note>\\n  sections 1-2' -> target §N."""
    pattern = re.compile(rf"{_note(name)}(\s+)(?:sections?\s+)?({NUMBERS})(?![\w.]*\w)")
    return pattern, lambda m: f"{TARGET[name]}{m.group(1)}{_sections(m.group(2))}"


# Reliability citations named a part of the note in words; each becomes the
# section of docs/reliability.md holding it. Order matters: specific first.
_REL = _note(RELIABILITY)
RELIABILITY_PHRASES = [
    (rf'{_REL},\s+"Exact resume"', "docs/reliability.md §2"),
    (rf'{_REL},\s+"Distributed"', "docs/reliability.md §4"),
    (rf"{_REL}\s+pitfall", "docs/reliability.md §4"),
    (rf"{_REL}\s+failure table", "docs/reliability.md §5"),
    (rf"{_REL}:\s+per-rank RNG", "docs/reliability.md §1, §2: per-rank RNG"),
    (rf"(Non-finite values\s+\(){_REL}\)", r"\1docs/reliability.md §3)"),
    (rf"(saved with the weights\s+\(){_REL}\)", r"\1docs/reliability.md §2)"),
    (rf"(Exact resume depends on this order\s+\(){_REL}\)", r"\1docs/reliability.md §2)"),
    (rf"(failure case of\s+){_REL}", r"\1docs/reliability.md §5"),
    (rf"(process faults\s+\(){_REL}\)", r"\1docs/reliability.md §5)"),
    (rf"(\(design:\s+){_REL}\)", r"\1docs/reliability.md §1)"),
]

RULES = [
    _numbered(MATH),
    _numbered(EVAL),
    (re.compile(rf"{_note(EVAL)}(\s+)shapes\b"), r"docs/evaluation.md §1\1shapes"),  # the op benchmark's shapes
    (re.compile(rf"{_note(STYLE)}(\s+)(habits?\s)"), lambda m: f"{TARGET[STYLE]}{m.group(1)}{m.group(2)}"),
    *[(re.compile(p), r) for p, r in RELIABILITY_PHRASES],
    # anything else: the page without a section
    *[(re.compile(_note(name)), TARGET[name]) for name in TARGET],
]


def rewrite_text(text: str) -> str:
    for pattern, repl in RULES:
        text = pattern.sub(repl, text)
    return text


def changed_lines(old: str, new: str) -> list[tuple[int, str, str]]:
    """(line number, old line, new line) for each line that differs. A rule
    that joins lines is not possible (replacements keep the whitespace), so
    the line counts match."""
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b), "a rewrite changed the number of lines"
    return [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]


def text_files(paths: list[Path]):
    for path in paths:
        if path.is_file():
            yield path
            continue
        for p in sorted(path.rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_DIRS.intersection(p.parts):
                yield p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help=f"files or folders (default: {' '.join(DEFAULT_PATHS)})")
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if anything would change")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or [ROOT / p for p in DEFAULT_PATHS]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    changes = 0
    for path in text_files(paths):
        try:
            old = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a text file
        new = rewrite_text(old)
        if new == old:
            continue
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for line, a, b in changed_lines(old, new):
            print(f"{shown}:{line}: {a.strip()}\n    -> {b.strip()}")
            changes += 1
        if not args.check:
            path.write_text(new, encoding="utf-8")
    verb = "would change" if args.check else "changed"
    print(f"{verb} {changes} line(s)", file=sys.stderr)
    return 1 if args.check and changes else 0


if __name__ == "__main__":
    sys.exit(main())
