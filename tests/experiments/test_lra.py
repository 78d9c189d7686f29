"""`latte experiment lra --quick`: every part runs (generator speed, the six
trainings through `latte train`, curves, example images, result files) and
a second call resumes from the finished cells instead of retraining."""

import json

import pytest

from latte.experiments import lra


@pytest.mark.slow
def test_quick_experiment_writes_results_and_resumes(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- results:lra:start -->\nold\n<!-- results:lra:end -->\n")
    argv = ["--quick", "--out", str(out), "--work", str(work), "--readme", str(readme)]
    assert lra.main(argv) == 0
    records = json.loads((out / "results.json").read_text())
    runs = [r for r in records if r["part"] == "train"]
    assert {(r["task"], r["mixer"]) for r in runs} == {(t, m) for t in lra.TASKS for m in lra.MIXERS}
    for r in runs:
        for key in ("task", "mixer", "test_accuracy", "majority_baseline", "examples", "wall_s"):
            assert key in r, key
        assert r["examples"] == 2 * 4 and r["lra_transformer"] == lra.LRA_TRANSFORMER.get(r["task"])
        config = "listops" if r["task"] == "listops-short" else r["task"]
        assert r["command"].startswith(f"latte train --config lra/{config} --model.mixer={r['mixer']}")
    gens = [r for r in records if r["part"] == "generator"]
    assert {g["task"] for g in gens} == {"listops", "pathfinder"} and all(g["per_s_per_core"] > 0 for g in gens)
    for png in ("curves.png", "pathfinder_examples.png"):
        assert (out / png).stat().st_size > 1000
    md = (out / "results.md").read_text()
    assert "latte experiment lra --quick" in md and "LRA Transformer" in md and "majority class" in md
    assert "old" not in readme.read_text() and "| listops | latte |" in readme.read_text()
    # finished cells are not run again
    capsys.readouterr()
    assert lra.main(argv) == 0
    assert "11 of 11 cells already done" in capsys.readouterr().err
