"""`latte experiment lra --quick`: every part runs (generator speed, the six
trainings through `latte train`, curves, example images, result files) and
a second call resumes from the finished cells instead of retraining."""

import json
import shlex

import pytest

from experiments.common.cells import run_protocol
from experiments.common.results import cell_key
from experiments.lra import lra


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
        assert r["resumed_from_step"] == 0  # fresh runs
        assert r["examples"] == 2 * 4 and r["lra_transformer"] == lra.LRA_TRANSFORMER.get(r["task"])
        config = "listops" if r["task"] == "listops-short" else r["task"]
        assert r["command"].startswith(f"latte train --config lra/{config} --model.mixer={r['mixer']}")
    gens = [r for r in records if r["part"] == "generator"]
    assert {g["task"] for g in gens} == {"listops", "pathfinder"}
    assert all(g["per_s_per_core"] > 0 and g["per_cpu_s"] > 0 for g in gens)
    for png in ("curves.png", "pathfinder_examples.png"):
        assert (out / png).stat().st_size > 1000
    md = (out / "results.md").read_text()
    assert "python -m experiments.lra --quick" in md and "LRA Transformer" in md and "majority class" in md
    assert "old" not in readme.read_text() and "| listops | latte |" in readme.read_text()
    # finished cells are not run again
    capsys.readouterr()
    assert lra.main(argv) == 0
    assert "11 of 11 cells already done" in capsys.readouterr().err


def test_reduced_budget_is_marked_and_shows_full_budget_cells(tmp_path):
    """--budget reduced cuts the LRA tasks (not the control) and says so; full-budget
    cells finished in --full-work are shown beside them, marked `full`."""
    out, work, full = tmp_path / "out", tmp_path / "work", tmp_path / "full"
    full_cell = {"part": "train", "task": "listops", "mixer": "latte"}
    full_record = {
        **full_cell,
        "test_accuracy": 0.2,
        "test_balanced_accuracy": 0.1,
        "test_macro_f1": 0.1,
        "val_accuracy": 0.2,
        "majority_baseline": 0.2,
        "lra_transformer": 0.3637,
        "steps": 1600,
        "batch": 16,
        "examples": 25600,
        "train_examples": 32000,
        "test_examples": 2000,
        "parameters": 1000,
        "wall_s": 10.0,
        "train_examples_per_s": 1.0,
        "train_label_counts": "1 1",
        "test_label_counts": "1 1",
        "loadavg_1min": 1.0,
    }
    # the user's overrides win over the budget's steps, so the test stays seconds long
    argv = [
        "--quick",
        "--budget",
        "reduced",
        "--out",
        str(out),
        "--work",
        str(work),
        "--full-work",
        str(full),
        "--tasks",
        "listops",
        "listops-short",
        "--mixers",
        "latte",
        "--parts",
        "train",
        "--override",
        "train.steps=2",
        "optim.warmup_steps=0",
        "train.eval_every=0",
        "train.save_every=0",
    ]
    # the full-budget cell ran this command's protocol at the full budget (recorded in its file)
    overrides = lra.cell_overrides(full_cell, lra.parse_args(argv), work, budget="full")
    config, overrides = lra.train_overrides("listops", "latte", full, overrides)
    full_record["command"] = shlex.join(["latte", "train", "--config", config, *(f"--{o}" for o in overrides)])
    full_record["protocol"] = run_protocol(config, overrides)
    (full / "cells").mkdir(parents=True)
    (full / "cells" / f"{cell_key(full_cell)}.json").write_text(json.dumps(full_record))
    assert lra.main(argv) == 0
    records = json.loads((out / "results.json").read_text())
    by = {(r["task"], r["budget"]): r for r in records}
    assert set(by) == {("listops", "reduced"), ("listops-short", "full"), ("listops", "full")}
    assert "--train.steps=200 --optim.warmup_steps=25" in by["listops", "reduced"]["command"]
    assert "--train.steps=200" not in by["listops-short", "full"]["command"]
    assert by["listops", "reduced"]["examples"] == 2 * 4 and by["listops", "full"]["examples"] == 25600
    md = (out / "results.md").read_text()
    assert "Reduced CPU budget" in md and "| listops | latte | reduced |" in md and "| listops | latte | full |" in md
    # --report-only writes what is finished, runs nothing, and names what is missing
    report = [*argv, "--report-only"]
    report.insert(report.index("--mixers") + 2, "softmax")
    assert lra.main(report) == 0
    md = (out / "results.md").read_text()
    assert "Missing cells" in md and "listops/softmax/train" in md and "| listops | softmax |" not in md
    assert not (work / "listops-softmax").exists()
