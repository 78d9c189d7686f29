"""The retirement rule of experiments/README.md ("Retiring results"):
results/ holds only live folders, each retired one is a line of
results/archive.md naming the commit that holds its files, and no page
cites a retired folder as if it were still there."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
MAX_LIVE = 16  # experiments/README.md, "Retiring results"
# names after results/ that are no committed folder: the index files, placeholders, and the
# folder of the GPU suite's --quick run (experiments/gpu_suite/stages.py QUICK_RESULTS, never committed)
NOT_FOLDERS = {"README.md", "archive.md", "NAME", "PLAN", "quick"}
ROW = re.compile(r"^\| ([\w.-]+) \| (.+) \| ([0-9a-f]{7,40}) \|$", re.M)
CITED = re.compile(r"(?<![\w/-])results/([\w-]+(?:\.md)?)")


def archived() -> dict[str, str]:
    """Name -> commit, from results/archive.md's table."""
    rows = ROW.findall((RESULTS / "archive.md").read_text(encoding="utf-8"))
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), "a name archived twice"
    return {name: commit for name, _, commit in rows}


def live() -> set[str]:
    return {p.name for p in RESULTS.iterdir() if p.is_dir()}


def test_results_holds_only_live_folders_and_the_archive_the_rest():
    folders, gone = live(), archived()
    assert len(folders) <= MAX_LIVE, f"{len(folders)} folders in results/: retire some (experiments/README.md)"
    assert gone, "results/archive.md lists no retired folder"
    assert not folders & set(gone), f"archived but still in results/: {sorted(folders & set(gone))}"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs the git history")
def test_each_archived_line_names_a_commit_that_holds_its_results():
    for name, commit in archived().items():
        found = subprocess.run(
            ["git", "cat-file", "-e", f"{commit}:results/{name}/results.json"], cwd=ROOT, capture_output=True
        )
        assert found.returncode == 0, f"results/archive.md: {commit} holds no results/{name}/results.json"


def stale_citations(page: Path, folders: set[str], gone: set[str], base: Path = ROOT) -> list[str]:
    """Each `results/NAME` of a paragraph of `page` that is neither a live
    folder nor an archived one beside a mention of results/archive.md."""
    out = []
    for paragraph in page.read_text(encoding="utf-8").split("\n\n"):
        for name in CITED.findall(paragraph):
            if name in folders or name in NOT_FOLDERS:
                continue
            if name not in gone or "archive.md" not in paragraph:
                out.append(f"{page.relative_to(base)}: results/{name}")
    return out


def test_pages_cite_live_results_or_the_archive():
    pages = [ROOT / "README.md", ROOT / "experiments" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    folders, gone = live(), set(archived())
    found = [c for page in pages for c in stale_citations(page, folders, gone)]
    assert not found, "cited but not in results/ (retired: name results/archive.md beside it):\n" + "\n".join(found)


def test_a_stale_citation_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "see results/old-study/ here\n\nresults/old-study in results/archive.md\n\nresults/nope and results/live\n"
    )
    assert stale_citations(page, {"live"}, {"old-study"}, tmp_path) == [
        "page.md: results/old-study",
        "page.md: results/nope",
    ]
