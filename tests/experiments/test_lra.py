"""`python -m experiments.lra --quick`: every part runs (generator speed, the six
trainings through `latte train`, curves, example images, result files) and
a second call resumes from the finished cells instead of retraining."""

import json
import shlex

import pytest

from experiments.common.cells import run_protocol
from experiments.common.results import cell_key
from experiments.lra import study as lra


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


def test_lra_protocol_runs_quick_and_tests_the_checkpoint_chosen_on_validation(tmp_path):
    """--budget lra: the LRA protocol's overrides (96,000 expressions, 5,000 x 32, a
    checkpoint at every whole-split validation, all kept), Latte at the paper's size as
    its own row, the test split scored at the best validation's checkpoint, its own
    README section; --quick's sizes and the user's overrides win, so this takes seconds."""
    out, work, readme = tmp_path / "out", tmp_path / "work", tmp_path / "README.md"
    readme.write_text("<!-- results:lra-protocol:start -->\nold\n<!-- results:lra-protocol:end -->\n")
    argv = ["--quick", "--budget", "lra", "--tasks", "listops", "--mixers", "latte", "latte-paper"]
    argv += ["--parts", "train", "--out", str(out), "--work", str(work), "--readme", str(readme), "--override"]
    argv += ["train.steps=4", "train.eval_every=2", "train.save_every=2", "optim.warmup_steps=0"]
    assert lra.main(argv) == 0
    records = {r["mixer"]: r for r in json.loads((out / "results.json").read_text())}
    assert set(records) == {"latte", "latte-paper"}
    protocol = "--data.train_examples=96000 --train.steps=5000 --optim.warmup_steps=312 --train.eval_every=250"
    protocol += " --train.global_batch_size=32 --train.eval_batches=0 --train.save_every=250 --train.keep=25"
    for r in records.values():
        assert r["budget"] == "lra" and protocol in r["command"] and r["examples"] == 4 * 4
        curve = dict(p.split(":") for p in r["val_curve"].split())
        assert list(curve) == ["8", "16"]  # steps 2 and 4 at batch 4, each on the whole validation split
        best = max(float(a) for a in curve.values())
        assert r["val_accuracy"] == best and float(curve[str(r["selected_examples"])]) == best
        assert r["selected_step"] * 4 == r["selected_examples"] and 0 <= r["test_accuracy"] <= 1
        assert r["final_test_accuracy"] >= 0 and r["threads"] >= 1 and r["run_wall_s"] > 0
    assert "--model.dim=128 --model.num_layers=6 --model.latents_per_head=10" in records["latte-paper"]["command"]
    md = (out / "results.md").read_text()
    assert "The LRA protocol" in md and "checkpoint chosen on validation" in md and "| 16 |" in md
    assert "old" not in readme.read_text() and "| listops | latte-paper |" in readme.read_text()
    # --report-only: a run still going is listed with its progress, read from its logs, not as a result
    going = work / "listops-softmax"
    going.mkdir()
    (going / "metrics.csv").write_text("step,loss\n1,2.3\n3,2.2\n")
    (going / "val.csv").write_text("step,val_accuracy,val_examples\n2,0.5,4\n")
    assert lra.main([*argv[:5], "pathfinder", argv[5], "softmax", *argv[6:], "--report-only"]) == 0
    md = (out / "results.md").read_text()
    assert "Missing cells" in md and "listops/softmax/train" in md and "| listops | softmax |" not in md
    assert "pathfinder/latte/train" in md and "pathfinder/latte-paper" not in md  # sized for ListOps alone
    assert not (out / "pathfinder_examples.png").exists()  # no Pathfinder result to show images beside
    assert f"- listops/softmax (`{going}`): step 3 of 4 (12 of 16 examples) logged" in md
    assert "so far: 8: 0.500 (4 examples)." in md
    with pytest.raises(ValueError, match="no cells"):  # latte-paper is sized for ListOps alone
        lra.main(["--budget", "lra", "--tasks", "pathfinder", "--mixers", "latte-paper", "--parts", "train"])


def test_the_checkpoint_is_chosen_on_whole_split_validations_that_have_one(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "val.csv").write_text(
        "step,val_accuracy,val_examples\n2,0.50,4\n4,0.25,4\n6,0.75,2\n8,0.90,4\n4,0.50,4\n"
    )  # 6: a partial validation; 8: no checkpoint; 4 twice (a resumed run): the later row counts
    for step in (2, 4, 6):
        (run / f"step-{step:08d}").mkdir()
    scored = []

    def score(step_dir):
        scored.append(step_dir.name)
        return {"accuracy": 0.5}, {"accuracy": 0.4, "balanced_accuracy": 0.3, "macro_f1": 0.2}

    monkeypatch.setattr(lra, "score_checkpoint", score)
    summary = {"split_examples": {"validation": 4}, "examples_seen": 32, "step": 8}
    summary |= {"val_accuracy": 0.9, "test_accuracy": 0.1}
    r = lra.chosen_on_validation(run, summary)
    assert scored == ["step-00000002"] and r["selected_step"] == 2 and r["selected_examples"] == 8
    assert r["test_accuracy"] == 0.4 and r["final_test_accuracy"] == 0.1
    assert r["val_curve"] == "8:0.5000 16:0.5000 32:0.9000"
    monkeypatch.setattr(lra, "score_checkpoint", lambda d: ({"accuracy": 0.0}, {}))
    with pytest.raises(RuntimeError, match="does not hold the weights that were validated"):
        lra.chosen_on_validation(run, summary)
    (run / "val.csv").write_text("step,val_accuracy,val_examples\n8,0.9,4\n")
    with pytest.raises(RuntimeError, match="no validation of the whole split"):
        lra.chosen_on_validation(run, summary)


def test_lra_verdict_says_which_side_of_the_interval():
    """level with the LRA Transformer only within the test split's interval; otherwise above or below it, outside."""
    base = {"budget": "lra", "task": "pathfinder", "mixer": "m", "examples": 288_000, "selected_examples": 96_000}
    base |= {"majority_baseline": 0.492, "lra_transformer": 0.714, "test_examples": 2000}
    lines = lra._lra_verdict([base | {"test_accuracy": a} for a in (0.492, 0.71, 0.80)]).splitlines()
    assert lines[0].endswith("below it, outside that interval.")
    assert lines[1].endswith("level with it within that interval.")
    assert lines[2].endswith("above it, outside that interval.")
