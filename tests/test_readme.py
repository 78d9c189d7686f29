"""The READMEs say what the committed files say: the generated tables match
tools/readme_tables.py's output, every relative link resolves, the README
stays short, and CI runs the README's test command line for line."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def load_tool():
    spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "tools" / "readme_tables.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool  # its dataclass looks its module up there
    spec.loader.exec_module(tool)
    return tool


def test_generated_tables_match_the_committed_results():
    assert load_tool().run(ROOT, write=False) == []


def test_the_check_fails_when_a_result_or_an_index_drifts(tmp_path):
    tool = load_tool()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for name in ("results", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    assert tool.run(tmp_path, write=False) == []

    lm = tmp_path / "results" / "lm_variants" / "results.json"
    records = json.loads(lm.read_text())
    next(r for r in records if r["variant"] == "macchiato")["val_ppl"] += 10.0
    lm.write_text(json.dumps(records))
    (tmp_path / "benchmarks" / "results" / "decode.md").write_text("# latte bench decode\n\nnew numbers\n")
    (tmp_path / "results" / "new").mkdir()
    (tmp_path / "results" / "new" / "results.md").write_text("#### new\n")
    found = tool.run(tmp_path, write=False)
    assert any(p.startswith("README.md: the headline table differs") for p in found), found
    assert any(p.startswith("benchmarks/README.md differs") for p in found), found
    assert any(p.startswith("results/new: no section in results/README.md") for p in found), found

    shutil.rmtree(tmp_path / "results" / "new")
    assert tool.run(tmp_path, write=True) == []  # regenerating fixes what can be regenerated
    assert "new numbers" in (tmp_path / "benchmarks" / "README.md").read_text()
    assert tool.run(tmp_path, write=False) == []


def test_an_empty_section_holds_a_place_and_a_filled_one_needs_its_files(tmp_path):
    tool = load_tool()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for name in ("results", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    index = tmp_path / "results" / "README.md"
    index.write_text(index.read_text() + "\n<!-- results:later:start -->\n<!-- results:later:end -->\n")
    assert tool.run(tmp_path, write=False) == []  # not written yet: a placeholder
    index.write_text(index.read_text().replace("later:start -->\n", "later:start -->\nold table\n"))
    found = tool.run(tmp_path, write=False)
    assert any("section results:later has no results/later files" in p for p in found), found


def test_a_plans_stage_folder_is_the_section_plan_dash_stage(tmp_path):
    """results/PLAN/STAGE/ (experiments/lm_variants/plans.py: stage_outputs) fills section PLAN-STAGE,
    and the index links into the subfolder."""
    tool = load_tool()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for name in ("results", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    top = shutil.ignore_patterns("extrapolation")  # lm_variants' own files, not its stages' folders
    shutil.copytree(ROOT / "results" / "lm_variants", tmp_path / "results" / "plan" / "stage", ignore=top)
    shutil.copytree(ROOT / "results" / "lm_variants", tmp_path / "results" / "plan", dirs_exist_ok=True, ignore=top)
    assert tool.results_folders(tmp_path)["plan-stage"] == "plan/stage"
    found = tool.run(tmp_path, write=False)
    assert any("results/plan-stage: no section" in p for p in found), found
    index = tmp_path / "results" / "README.md"
    for n in ("plan", "plan-stage"):
        index.write_text(index.read_text() + f"\n<!-- results:{n}:start -->\nold\n<!-- results:{n}:end -->\n")
    assert tool.run(tmp_path, write=True) == [] and tool.run(tmp_path, write=False) == []
    text = index.read_text()
    assert "| [plan-stage](plan/stage/results.md) |" in text and "(plan/stage/val_ppl.png)" in text


def test_a_latte_eval_folder_is_indexed_from_its_one_results_file(tmp_path):
    """A folder `latte eval --out` wrote holds its provenance and records in
    results.json (no run.json): the index reads the machine and counts the
    records from there."""
    tool = load_tool()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for name in ("results", "benchmarks"):
        shutil.copytree(ROOT / name, tmp_path / name)
    folder = tmp_path / "results" / "plan" / "evaluated"
    folder.mkdir(parents=True)
    machine = {"time_utc": "2026-11-28T15:00:00Z", "cpu_model": "Some CPU", "threads": 1}
    records = [{"suite": "retrieval", "model": "converted"}, {"suite": "retrieval", "model": "original"}]
    (folder / "results.json").write_text(
        json.dumps({"command": "latte eval M", "machine": machine, "records": records})
    )
    (folder / "results.md").write_text("# latte eval: M\n\n## retrieval\n\ntable\n")
    index = tmp_path / "results" / "README.md"
    index.write_text(
        index.read_text() + "\n<!-- results:plan-evaluated:start -->\nold\n<!-- results:plan-evaluated:end -->\n"
    )
    assert tool.run(tmp_path, write=True) == [] and tool.run(tmp_path, write=False) == []
    assert (
        "| [plan-evaluated](plan/evaluated/results.md) | 2026-11-28 15:00 | Some CPU, 1 | 2 | - |" in index.read_text()
    )


def test_a_headline_row_names_a_missing_record(tmp_path):
    tool = load_tool()
    files = tool.Files(ROOT)
    try:
        files.one(tool.DECODE, "median_ms", mixer="latte", context=3)
    except ValueError as e:
        assert "benchmarks/results/decode.json" in str(e) and "context" in str(e)
    else:
        raise AssertionError("no error for a record that does not exist")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def link_problems(path: Path, base: Path = ROOT) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    anchors = {_slug(h) for h in re.findall(r"^#{1,6}\s+(.+)$", text, re.M)}
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        if not file:
            if anchor not in anchors:
                out.append(f"{path.relative_to(base)}: no heading for #{anchor}")
        elif not (path.parent / file).exists():
            out.append(f"{path.relative_to(base)}: {target} does not exist")
    return out


def test_every_relative_link_resolves():
    pages = [ROOT / "README.md", ROOT / "results" / "README.md", ROOT / "benchmarks" / "README.md"]
    pages += sorted((ROOT / "docs").glob("*.md"))
    found = [p for page in pages for p in link_problems(page)]
    assert found == []
    assert len(LINK.findall((ROOT / "README.md").read_text())) > 20  # the check reads the README's links


def test_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n[ok](#top) [gone](nope.md) [bad](#nowhere) [web](https://x.org)\n```\n[code](x.md)\n```\n")
    assert link_problems(page, tmp_path) == ["page.md: nope.md does not exist", "page.md: no heading for #nowhere"]


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 280


def headline_rows(text: str) -> list[list[str]]:
    """The cells of the headline table's rows (header and rule left out)."""
    table = text.split("<!-- headline:start -->\n", 1)[1].split("<!-- headline:end -->", 1)[0]
    lines = [x for x in table.splitlines() if x.startswith("|")]
    return [[c.strip() for c in x.strip().strip("|").split(" | ")] for x in lines[2:]]


def test_the_headline_table_is_glanceable():
    """At most 8 rows of claim | number | link, no cell over 120 characters;
    the nuance lives in "Status and limits" (tools/readme_tables.py refuses
    to generate anything longer)."""
    text = (ROOT / "README.md").read_text()
    assert "| claim | number | link |" in text
    rows = headline_rows(text)
    assert 1 <= len(rows) <= 8
    for row in rows:
        assert len(row) == 3 and re.fullmatch(r"\[[^\]]+\]\([^)]+\)", row[2]), row
        assert max(len(c) for c in row) <= 120, row
    assert headline_rows("<!-- headline:start -->\n| a | b | c |\n|---|\n| x | y | z |\n<!-- headline:end -->") == [
        ["x", "y", "z"]
    ]


def test_a_headline_cell_too_long_is_refused(monkeypatch):
    tool = load_tool()
    row = tool.ROWS[0]
    monkeypatch.setattr(tool, "ROWS", [tool.Row("x" * 121, row.figure, row.source)])
    with pytest.raises(ValueError, match="121 characters; a cell holds at most 120"):
        tool.headline(tool.Files(ROOT))
    monkeypatch.setattr(tool, "ROWS", [row] * 9)
    with pytest.raises(ValueError, match="9 headline rows; the README shows at most 8"):
        tool.headline(tool.Files(ROOT))


READING_PATH = (
    "latte/ops/reference.py",
    "latte/ops/latte/minimal.py",
    "latte/ops/latte/causal.py",
    "latte/ops/macchiato.py",
    "latte/layers/macchiato_attention.py",
    "latte/models/causal_lm.py",
    "latte/train/loop.py",
)


def test_read_the_code_walks_from_the_reference_to_the_training_loop():
    """A "Read the code" section links the files of Latte-Macchiato (the
    default mixer) in reading order, from the float64 definition through the
    readable chunked form and the fast path to the training loop, each with a
    line on what it adds."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Read the code\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. \[`([^`]+)`\]\(([^)]+)\): (.+?)(?=^\d+\. |\Z)", section, re.M | re.S)
    assert tuple(path for path, _, _ in items) == READING_PATH
    for path, link, what in items:
        assert link == path and (ROOT / path).is_file() and len(what) > 20


def test_ci_runs_the_readmes_test_command_line_for_line():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Tests and CI\n\n```bash\n(.+?)\n```", readme, re.S).group(1)
    prefix = "python3 -m venv .venv && . .venv/bin/activate && "
    assert block.startswith(prefix)
    ci = (ROOT / ".ci" / "run").read_text()
    lines = ci.split("keep these lines identical to the README) ---\n", 1)[1].split("\ndeactivate\n", 1)[0]
    assert " && ".join(lines.splitlines()) == block[len(prefix) :]


@pytest.mark.slow  # transformers' import dominates: ~5 s quiet, ~15 s on a loaded 2-core machine
def test_the_readmes_python_examples_run(tmp_path, monkeypatch):
    """The quick start's code blocks, in order, in one namespace (the model example saves into the cwd)."""
    blocks = re.findall(r"```python\n(.+?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    assert (tmp_path / "my-model" / "model.safetensors").is_file()
    assert namespace["y"].shape == (2, 1000, 4, 32)
