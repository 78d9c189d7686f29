"""The repository stands alone: code, tests and docs cite only documents that
are in it, every cited section exists, and no path outside the repository
appears (docs/README.md, "Citing these pages from code")."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Paths that point outside a checkout of the repository (machine paths, the
# shared notes the project was bootstrapped from). Split so that this file
# does not match itself.
OUTSIDE = [
    re.compile(p)
    for p in (
        re.escape("/wo" + "rk/"),
        re.escape("../sha" + "red"),
        "shared/" + "spec",
        "shared/" + "seeds",
        re.escape("/ho" + "me/"),
        re.escape("/Us" + "ers/"),
    )
]
# Upper-case document names (like README.md): each must be a file of the repository.
DOC_NAME = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]*(?:-[A-Z0-9_]+)*\.md)\b")
PLACEHOLDERS = {"NAME.md"}  # "NAME.json, NAME.md and NAME.png": a file-name pattern, not a citation
DOCS_CITATION = re.compile(r"docs/([\w-]+\.md)((?:\s*(?:,|and)?\s*§\s*\d+(?:\.\d+)*)*)")
HABITS = re.compile(r"docs/design\.md,?\s+habits?\s+(\d+(?:\s*(?:,|and|-)\s*\d+)*)")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def sections(doc: Path) -> set[str]:
    """Numbers of the numbered headings of a docs/ page ("3", "3.2", ...)."""
    return set(HEADING.findall(doc.read_text(encoding="utf-8")))


def habits() -> set[str]:
    """Numbers of the code habits listed at the end of docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    part = text.split("\n## Code habits\n", 1)[1]
    return set(re.findall(r"^(\d+)\.\s", part, re.M))


def problems_in(text: str, where: str) -> list[str]:
    out = []
    for pattern in OUTSIDE:
        for m in pattern.finditer(text):
            out.append(f"{where}: path outside the repository: {m.group(0)!r}")
    for m in DOC_NAME.finditer(text):
        name = m.group(1)
        if name not in PLACEHOLDERS and not (ROOT / name).is_file() and not (ROOT / "docs" / name).is_file():
            out.append(f"{where}: cites {name}, which is not in the repository")
    for m in DOCS_CITATION.finditer(text):
        doc = ROOT / "docs" / m.group(1)
        if not doc.is_file():
            out.append(f"{where}: cites docs/{m.group(1)}, which does not exist")
            continue
        cited = re.findall(r"§\s*(\d+(?:\.\d+)*)", m.group(2))
        missing = sorted(set(cited) - sections(doc))
        if missing:
            out.append(f"{where}: cites docs/{m.group(1)} §{', §'.join(missing)}: no such section")
    for m in HABITS.finditer(text):
        cited = set(re.findall(r"\d+", m.group(1)))
        if cited - habits():
            out.append(f"{where}: cites docs/design.md habit(s) {sorted(cited - habits())}: no such habit")
    return out


# Code locations named in the docs: `latte/ops/latte/causal.py: latte_causal`,
# `tests/ops/test_causal.py::test_name`, and further `test_name`s after a test file.
LOCATION = re.compile(
    r"((?:latte|tests|tools|experiments|benchmarks)/[\w/.-]+\.(?:py|yaml))(?:(?:::|:\s+`?)(\w+))?|`(test_\w+)`"
)


def location_problems(text: str, where: str) -> list[str]:
    """Every file, function and test a page names must exist, so the docs
    cannot keep pointing at code that moved."""
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        current = None  # the test file that bare `test_...` names on this line belong to
        for m in LOCATION.finditer(line):
            path, name, test = m.groups()
            if path:
                current = ROOT / path
                if not current.is_file():
                    out.append(f"{where}:{line_no}: names {path}, which does not exist")
                    current = None
                elif name and not re.search(rf"\b{name}\b", current.read_text(encoding="utf-8")):
                    out.append(f"{where}:{line_no}: {path} has no {name}")
            elif current is not None and f"def {test}" not in current.read_text(encoding="utf-8"):
                out.append(f"{where}:{line_no}: {current.relative_to(ROOT)} has no {test}")
    return out


def load_tool():
    spec = importlib.util.spec_from_file_location("rewrite_citations", ROOT / "tools" / "rewrite_citations.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def problems(*roots: Path, base: Path = ROOT) -> list[str]:
    """Every problem in the text files under `roots` (the files the rewrite tool reads)."""
    out = []
    for path in load_tool().text_files(list(roots)):
        out += problems_in(path.read_text(encoding="utf-8"), str(path.relative_to(base)))
    return out


def test_docs_readme_and_tools_cite_only_what_exists():
    assert (ROOT / "docs" / "README.md").is_file()
    assert problems(ROOT / "docs", ROOT / "README.md", ROOT / "tools") == []


def test_code_locations_named_in_the_docs_exist():
    found = []
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        found += location_problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == []
    assert location_problems(
        "`latte/ops/latte/causal.py: latte_causal`, `tests/ops/test_causal.py::nope`, "
        "`test_forward_matches_reference`, `test_nope`, latte/gone.py",
        "x",
    ) == [
        "x:1: tests/ops/test_causal.py has no nope",
        "x:1: tests/ops/test_causal.py has no test_nope",
        "x:1: names latte/gone.py, which does not exist",
    ]


def test_code_and_tests_cite_only_documents_in_the_repo():
    assert problems(ROOT / "latte", ROOT / "tests", ROOT / "experiments") == []


def test_docs_results_and_readme_cite_only_documents_in_the_repo():
    roots = [ROOT / name for name in ("README.md", "docs", "results", "benchmarks", ".ci")]
    assert problems(*[r for r in roots if r.exists()]) == []


def test_the_checker_finds_what_it_must():
    old = "MATH" + ".md"
    bad_section, bad_page, bad_habit = "docs/math.md" + " §9.9", "docs/" + "nope.md", "docs/design.md" + " habit 99"
    found = problems_in(f"see {old} 3.2, {bad_section}, {bad_page}, {bad_habit}, {'/wo' + 'rk/'}x", "here")
    assert len(found) == 5, found
    assert problems_in("docs/math.md §3.2, §3.3 and docs/design.md habits 5, 6; NAME.md; README.md", "ok") == []


def test_rewrite_maps_every_form_and_is_idempotent():
    tool = load_tool()
    m, s, e, r = ("MATH" + ".md", "STYLE" + ".md", "EVAL" + ".md", "RELIABILITY" + ".md")
    spec = "shared/" + "spec/"
    cases = {
        f"(the mathematics, {m}).": "(the mathematics, docs/math.md).",
        f"(see {m} 3.2)": "(see docs/math.md §3.2)",
        f"({m} 2, 3, 5)": "(docs/math.md §2, §3, §5)",
        f"({m} 4, the l = 0 state)": "(docs/math.md §4, the l = 0 state)",
        f"# recipe ({m} section 6):": "# recipe (docs/math.md §6):",
        f"protocols in {e} sections 1-2)": "protocols in docs/evaluation.md §1, §2)",
        f"conv_rglru, {e}\n    section 1)": "conv_rglru, docs/evaluation.md\n    §1)",
        f"conv_rglru, {e}\n    shapes)": "conv_rglru, docs/evaluation.md §1\n    shapes)",
        f"({s} habits 5, 6).": "(docs/design.md habits 5, 6).",
        f"table ({s}\nhabit 11; x)": "table (docs/design.md\nhabit 11; x)",
        f'({r}, "Exact resume")': "(docs/reliability.md §2)",
        f'one or many ({r}, "Distributed"):': "one or many (docs/reliability.md §4):",
        f"({r} pitfall)": "(docs/reliability.md §4)",
        f"refusals ({r} failure table)": "refusals (docs/reliability.md §5)",
        f"anything ({r}: per-rank RNG, weights_only)": (
            "anything (docs/reliability.md §1, §2: per-rank RNG, weights_only)"
        ),
        f"Non-finite values ({r}): when": "Non-finite values (docs/reliability.md §3): when",
        f"(design: {'/wo' + 'rk/'}{spec}{r}).": "(design: docs/reliability.md §1).",
        f"(design: ../{spec}{r}).": "(design: docs/reliability.md §1).",
        f"some new text ({r})": "some new text (docs/reliability.md)",
    }
    for old, new in cases.items():
        assert tool.rewrite_text(old) == new, old
        assert tool.rewrite_text(new) == new, new  # idempotent


def test_rewriting_a_copy_of_the_tree_leaves_no_dangling_citation(tmp_path):
    """What the lead's run of tools/rewrite_citations.py will produce: run it
    on a copy of latte/ and tests/ and check the copy (sections included)."""
    tool = load_tool()
    for name in ("latte", "tests"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    assert tool.main([str(tmp_path / "latte"), str(tmp_path / "tests")]) == 0
    assert problems(tmp_path / "latte", tmp_path / "tests", base=tmp_path) == []
    assert tool.main(["--check", str(tmp_path / "latte"), str(tmp_path / "tests")]) == 0  # nothing left to do
