"""Issue 41: one reuse rule for every sweep (experiments/common/cells.py), one
write rule for every writer outside a run folder (latte/guard.py). The
numbers in the test names are the rows of the issue's table."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.common import cells as C
from experiments.common.results import write_results, writer_of
from experiments.convert.stages import checks
from experiments.convert.study import check_same_base
from experiments.gpu_suite import runner, stages
from experiments.lm_variants import study as LV
from latte.cli import main
from latte.config_io import save_yaml
from latte.guard import MARKER, WriteRefused, claim_folder
from latte.train.config import shipped_configs
from latte.train.task import load_run_config
from tests.experiments.studies import study


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _model_folder(path: Path) -> dict:
    path.mkdir(parents=True)
    files = {"config.json": '{"model_type": "llama"}\n', "model.safetensors": "weights"}
    for name, text in files.items():
        (path / name).write_text(text)
    return files


# ---------------------------------------------------------------- the write rule (latte/guard.py)


def _claimed(folder, writer: str):
    """claim_folder's claim alone (the folder held and released at once)."""
    with claim_folder(folder, writer) as held:
        return held


def test_1_export_into_a_base_model_folder_or_a_foreign_folder_exits_2_and_changes_nothing(tmp_path, capsys):
    base = tmp_path / "base"
    files = _model_folder(base)
    other = tmp_path / "dir"
    other.mkdir()
    (other / "README.md").write_text("mine\n")
    (other / "config.json").write_text("{}\n")
    for dest, named in ((base, "a model's folder"), (other, "holds 2 entries (README.md, config.json)")):
        assert main(["export", str(tmp_path / "run"), str(dest)]) == 2
        err = _err(capsys)
        assert f"OUT {dest}" in err and named in err
    assert {n: (base / n).read_text() for n in files} == files and not (base / MARKER).exists()
    assert sorted(p.name for p in other.iterdir()) == ["README.md", "config.json"]
    assert (other / "config.json").read_text() == "{}\n"


def test_the_guard_accepts_new_empty_and_its_own_folders_only(tmp_path):
    new, empty = tmp_path / "a" / "new", tmp_path / "empty"
    empty.mkdir()
    for folder in (new, empty):
        _claimed(folder, "latte export")
        (folder / "model.safetensors").write_text("x")
        (folder / "config.json").write_text("{}")
        _claimed(folder, "latte export")  # an earlier export is replaced by the next one
        with pytest.raises(WriteRefused, match=r"written by `latte export`"):
            _claimed(folder, "latte experiment mqar")
    run = tmp_path / "run"
    (run / "step-00000001").mkdir(parents=True)
    (run / "step-00000001" / "manifest.json").write_text("{}")
    for dest, kind in ((run, "a run folder"), (run / "step-00000001", "a checkpoint"), (run / "x", "a run folder")):
        with pytest.raises(WriteRefused, match=kind):
            _claimed(dest, "latte export")
    assert not (run / "x").exists()


def test_experiment_results_go_only_into_their_own_folder(tmp_path):
    rec, run = [{"a": 1}], {"command": "python -m experiments.mqar --quick", "machine": {}, "wall_s": 1.0}
    assert writer_of(run["command"]) == writer_of("latte experiment mqar --quick") == "latte experiment mqar"
    write_results(tmp_path / "mqar", "mqar", rec, "t", run)
    write_results(tmp_path / "mqar", "mqar", rec, "t", run)  # its own, again
    (tmp_path / "README.md").write_text("project\n")
    for out in (tmp_path, tmp_path / "mqar"):
        other = {**run, "command": "python -m experiments.lra --quick"}
        with pytest.raises(WriteRefused):
            write_results(out, "lra", rec, "t", other)
    assert (tmp_path / "README.md").read_text() == "project\n"


def test_every_published_results_folder_is_marked_by_the_command_that_wrote_it():
    root = Path(__file__).resolve().parents[2] / "results"
    for folder in (p for p in root.iterdir() if (p / "run.json").is_file()):
        command = json.loads((folder / "run.json").read_text())["command"]
        assert writer_of(command) == json.loads((folder / MARKER).read_text())["writer"], folder


@pytest.mark.parametrize("where", ["results", "dot"])
def test_6_suite_report_only_never_replaces_a_foreign_readme(tmp_path, monkeypatch, capsys, where):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "README.md").write_text("1,607 lines\n")
    (folder / "mqar").mkdir()
    monkeypatch.chdir(folder)
    out = "." if where == "dot" else str(folder)
    assert stages.main(["--report-only", "--out", out]) == 2
    assert "holds no suite.json" in _err(capsys)
    (folder / "suite.json").write_text('{"stages": {}, "invocations": []}')  # even with a suite's record
    assert stages.main(["--report-only", "--out", out]) == 2
    assert "not written by this command (no marker)" in _err(capsys)
    assert (folder / "README.md").read_text() == "1,607 lines\n"


def test_8_suite_pack_into_the_project_root_exits_2_before_anything_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "README.md").write_text("the project's README\n")
    monkeypatch.chdir(tmp_path)
    assert stages.main(["--pack", ".", "--out", str(tmp_path / "suite"), "--stages", "check"]) == 2
    assert "--pack .: holds 1 entry (README.md)" in _err(capsys)
    assert (tmp_path / "README.md").read_text() == "the project's README\n" and not (tmp_path / "suite").exists()


@pytest.mark.parametrize(
    "content, message", [('{"stages": {"check": {', "not valid JSON"), ("[1, 2]", "not a suite record")]
)
def test_9_a_damaged_suite_json_is_named_exit_2(tmp_path, capsys, content, message):
    _claimed(tmp_path, runner.SUITE_WRITER)
    (tmp_path / "suite.json").write_text(content)
    assert stages.main(["--report-only", "--out", str(tmp_path)]) == 2
    err = _err(capsys)
    assert str(tmp_path / "suite.json") in err and message in err
    assert (tmp_path / "suite.json").read_text() == content and not (tmp_path / "README.md").exists()


def test_10_report_only_of_a_missing_suite_folder_exits_2_naming_it(tmp_path, capsys):
    assert stages.main(["--report-only", "--out", str(tmp_path / "missing")]) == 2
    assert f"--out {tmp_path / 'missing'}: no such folder" in _err(capsys)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_11_a_budget_that_is_not_a_finite_positive_number_is_refused(value, capsys):
    with pytest.raises(SystemExit) as e:
        stages.main(["--dry-run", "--budget-s", value])
    assert e.value.code == 2 and "--budget-s: expected a finite number of seconds > 0" in capsys.readouterr().err


def test_7_a_quick_suite_writes_apart_and_its_records_are_never_reused_by_the_full_one():
    quick, full = stages.parse_args(["--quick"]), stages.parse_args([])
    assert (quick.out, quick.work) != (full.out, full.work)
    for s in stages.stages(quick.out, quick.work, quick=True):
        assert not any(o.startswith("results/") and not o.startswith("results/quick/") for o in s.outputs), s.name
    by_name = {s.name: s for s in stages.stages(full.out, full.work)}
    for s in stages.stages(quick.out, quick.work, quick=True):
        record = {"status": "ok", "wall_s": 1.0, "protocol": runner.stage_protocol(s, True)}
        assert runner._should_run(s, record, [], quick=True) is not None  # the quick suite's own: done
        assert runner._should_run(by_name[s.name], record, [], quick=False) is None  # the full one runs it
        assert runner._should_run(by_name[s.name], {"status": "ok"}, [], quick=False) is None  # no protocol


# ---------------------------------------------------------------- the reuse rule (experiments/common/cells.py)


def test_a_cell_is_reused_only_when_protocol_and_inputs_match_exactly(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("a")
    proto = lambda c: {"steps": 2, "inputs": {"data": C.input_digest(data)}}  # noqa: E731
    C.Sweep(tmp_path, [{"i": 0}], protocol=proto).run(lambda c: {"acc": 0.5})
    assert C.Sweep(tmp_path, [{"i": 0}], protocol=proto).pending() == []
    data.write_text("b")  # the same path, another content
    with pytest.raises(C.ProtocolMismatch, match=r"i=0.json: .*inputs.data: '[0-9a-f]{64}' then, '[0-9a-f]{64}' now"):
        C.Sweep(tmp_path, [{"i": 0}], protocol=proto).pending()
    wider = lambda c: {**proto(c), "fillers": "zeros"}  # noqa: E731  a field the cell does not record
    data.write_text("a")
    with pytest.raises(C.ProtocolMismatch, match=r"fillers: <not recorded> then, 'zeros' now"):
        C.Sweep(tmp_path, [{"i": 0}], protocol=wider).pending()


def test_only_path_fields_are_inputs_not_names_that_match_a_folder(tmp_path, monkeypatch):
    """A name (model.mixer=latte) is never hashed as an input, even beside a
    folder of that name; a path field naming a file is, and a change of that
    file changes the protocol."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latte").mkdir()
    (tmp_path / "latte" / "code.py").write_text("x = 1\n")
    (tmp_path / "corpus.txt").write_text("some text\n")
    flat = {"model.mixer": "latte", "task": "lm", "data.source": "corpus.txt", "data.tokenizer": "bpe"}
    inputs = C.config_inputs(flat)
    assert set(inputs) == {"data.source"} and inputs["data.source"] == C.input_digest("corpus.txt")
    (tmp_path / "latte" / "code.py").write_text("x = 2\n")  # the package changes: no protocol does
    assert C.config_inputs(flat) == inputs
    (tmp_path / "corpus.txt").write_text("other text\n")  # the data changes: the protocol does
    assert C.config_inputs(flat)["data.source"] != inputs["data.source"]


def test_a_legacy_cell_without_a_protocol_is_refused_not_reused(tmp_path):
    (tmp_path / "cells").mkdir()
    path = tmp_path / "cells" / "i=0.json"
    path.write_text(json.dumps({"i": 0, "acc": 0.5, "examples": 128}))
    with pytest.raises(C.ProtocolMismatch, match=r"examples: <not recorded> then, 128 now") as e:
        C.Sweep(tmp_path, [{"i": 0}], protocol={"examples": 128}).records()
    assert str(path) in str(e.value) and "move the cell files away to recompute them" in str(e.value)


@pytest.mark.parametrize(
    "record, field",
    [
        ({"model": "original", "task": "arc_easy", "acc": "high", "wall_s": 1.0, "load": 0.1}, "acc"),
        ({"model": "original", "task": "arc_easy", "acc": 1.5, "wall_s": 1.0, "load": 0.1}, "acc"),
        ({"model": "original", "task": "arc_easy", "accuracy": "NaN", "wall_s": 1.0, "load": 0.1}, "accuracy"),
        ({"model": "original", "task": "arc_easy", "tokens_per_s": None, "wall_s": 1.0, "load": 0.1}, "tokens_per_s"),
        ({"model": "original", "task": "arc_easy", "steps": 2.5, "wall_s": 1.0, "load": 0.1}, "steps"),
        ({"model": "original", "task": "arc_easy", "wall_s": -1.0, "load": 0.1}, "wall_s"),
    ],
    ids=["acc-string", "acc-above-1", "accuracy-NaN-string", "tokens-per-s-null", "steps-float", "negative-seconds"],
)
def test_12_a_cell_field_of_the_wrong_type_or_range_is_refused_naming_the_file(tmp_path, record, field):
    cell = {"model": "original", "task": "arc_easy"}
    path = tmp_path / "cells" / f"{C.cell_key(cell)}.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"field {field!r} is .*expected") as e:
        C.Sweep(tmp_path, [cell], fields=("wall_s", "load")).records()
    assert str(path) in str(e.value)
    with pytest.raises(ValueError, match="expected a finite number"):  # and nothing bad is ever written
        C.Sweep(tmp_path / "new", [cell]).run(lambda c: {"tokens_per_s": float("nan")})
    assert not (tmp_path / "new" / "cells").exists()


def _fake_run(folder: Path, manifest: str) -> Path:
    step = folder / "step-00000002"
    step.mkdir(parents=True, exist_ok=True)
    (step / "manifest.json").write_text(manifest)
    return folder


def test_2_convert_cells_record_the_converted_checkpoint_and_refuse_another_at_the_same_path(tmp_path):
    """The tasks cells of one converted run are refused once another run is
    converted at the same path (they were keyed by path and step name only)."""
    run = _fake_run(tmp_path / "run", '{"step": 2, "files": {"model.safetensors": "aaa"}}')
    a = SimpleNamespace(config="tiny", set=["train.steps=2", "optim.warmup_steps=1"], runs=str(tmp_path))
    a.inputs = {"base": {"model.safetensors": "b" * 64}, "converted": C.input_digest(run)}
    cells = [{"model": "converted", "task": "arc_easy", "source": f"{run}/step-00000002"}]
    C.Sweep(tmp_path / "cells-tasks", cells, **checks(a, ("wall_s", "load"))).run(
        lambda c: {"acc": 0.25, "wall_s": 1.0, "load": 0.1}
    )
    shutil.rmtree(run)  # deleted, converted again at the same path: another model
    _fake_run(tmp_path / "run", '{"step": 2, "files": {"model.safetensors": "ccc"}}')
    a.inputs = {**a.inputs, "converted": C.input_digest(run)}
    with pytest.raises(C.ProtocolMismatch, match=r"inputs.converted: '[0-9a-f]+' then, '[0-9a-f]+' now"):
        C.Sweep(tmp_path / "cells-tasks", cells, **checks(a, ("wall_s", "load"))).records()
    a.inputs = {**a.inputs, "base": {"model.safetensors": "d" * 64}}
    with pytest.raises(C.ProtocolMismatch, match=r"inputs.base.model.safetensors"):
        C.Sweep(tmp_path / "cells-tasks", cells, **checks(a, ("wall_s", "load"))).records()


def test_4_a_converted_model_of_another_base_is_refused_naming_the_files():
    a = SimpleNamespace(config="convert/smollm2", inputs={"base": {"config.json": "1", "model.safetensors": "2"}})

    def subject(sha):
        model = SimpleNamespace(config=SimpleNamespace(base_weights=None if sha is None else {"sha256": sha}))
        return SimpleNamespace(model=model, source=Path("RUN"), run=None)

    with pytest.raises(ValueError, match=r"--converted RUN: converted from another base .* differs for model.safet"):
        check_same_base(a, subject({"config.json": "1", "model.safetensors": "9"}))
    with pytest.raises(ValueError, match="records no base model"):
        check_same_base(a, subject(None))


def test_3_a_run_folder_of_another_configuration_is_set_aside_never_resumed(tmp_path, capsys):
    run = tmp_path / "softmax" / "seed-0"
    run.mkdir(parents=True)
    sets = ["train.steps=4", "optim.warmup_steps=1", "train.run_dir=elsewhere", "train.num_threads=3"]
    save_yaml(load_run_config("mixers/softmax", [f"--{s}" for s in sets]), run / "config.yaml")
    (run / "metrics.csv").write_text("step,loss\n1,5.0\n")
    # where and how fast do not count: the same run
    assert C.set_aside_changed_run(run, "mixers/softmax", ["train.steps=4", "optim.warmup_steps=1"]) is None
    moved = C.set_aside_changed_run(run, "mixers/softmax", ["train.steps=4", "optim.warmup_steps=1", "optim.lr=0.1"])
    assert moved == tmp_path / "softmax" / "seed-0.set-aside-1" and not run.exists()
    assert (moved / "metrics.csv").read_text() == "step,loss\n1,5.0\n"  # nothing deleted
    err = capsys.readouterr().err
    assert "optim.lr:" in err and "never resumed under the new one: set aside as" in err


@pytest.mark.parametrize("name", shipped_configs())
def test_a_run_folder_of_the_same_configuration_is_never_set_aside(tmp_path, name):
    """config.yaml as the trainer writes it, read back, equals the resolved
    config for every shipped config (else every resume would start over)."""
    run = tmp_path / "run"
    run.mkdir()
    save_yaml(load_run_config(name, ["--train.num_threads=2"]), run / "config.yaml")
    assert C.set_aside_changed_run(run, name, []) is None and (run / "config.yaml").is_file()


# ---------------------------------------------------------------- lm-variants end to end: kills and changes


def _lm(tmp_path: Path, runs: str) -> list[str]:
    return ["--quick", "--variants", "softmax", "--seeds", "0", "--stages", "train", "--runs", str(tmp_path / runs)]


def _train_record(results: Path) -> dict:
    [r] = json.loads((results / "lm_variants" / "results.json").read_text())
    return r


MEASURED = ("wall_s", "loadavg_start", "loadavg_end", "process_s", "resumed", "tokens_per_s")


@pytest.mark.slow
def test_5_and_kill_9_lm_variants_killed_anywhere_gives_the_uninterrupted_results(tmp_path, capsys, monkeypatch):
    """A reference run; a run whose training is killed with SIGKILL right after
    its step-1 checkpoint (LATTE_FAULTS), then the same command; a kill between
    the run's end and its cell write (the cell file deleted), then the same
    command: the same results as the reference, every field that is not a
    measurement of time equal, and no null throughput (row 5)."""
    sets = ["--set", "train.save_every=1"]
    ref_argv = [*_lm(tmp_path, "ref"), "--results", str(tmp_path / "ref-results"), *sets]
    assert LV.main(ref_argv) == 0
    ref = _train_record(tmp_path / "ref-results")
    argv = [*_lm(tmp_path, "runs"), "--results", str(tmp_path / "results"), *sets]
    monkeypatch.setenv("LATTE_FAULTS", "kill_after_save=1")
    with pytest.raises(RuntimeError, match="exited -9"):
        LV.main(argv)
    monkeypatch.delenv("LATTE_FAULTS")
    assert not (tmp_path / "results").exists()  # nothing published by the killed command
    assert LV.main(argv) == 0
    same = lambda r: {k: v for k, v in r.items() if k not in MEASURED and k != "command"}  # noqa: E731
    first = _train_record(tmp_path / "results")
    assert same(first) == same(ref) and first["resumed"] is True
    summary = (tmp_path / "runs" / "softmax" / "seed-0" / "summary.json").read_text()
    [cell] = (tmp_path / "runs" / ".cells" / "train" / "cells").glob("*.json")
    cell.unlink()  # row 5: killed between the run's end and the cell write
    assert LV.main(argv) == 0
    again = _train_record(tmp_path / "results")
    assert same(again) == same(ref) and again["tokens_per_s"] == first["tokens_per_s"] > 0
    assert (tmp_path / "runs" / "softmax" / "seed-0" / "summary.json").read_text() == summary  # not trained again
    assert LV.main([*argv, "--report-only"]) == 0


@pytest.mark.slow
def test_3_lm_variants_another_set_is_refused_then_started_over_with_the_old_run_set_aside(tmp_path, capsys):
    argv = [*_lm(tmp_path, "runs"), "--results", str(tmp_path / "results")]
    assert LV.main(argv) == 0
    before = _train_record(tmp_path / "results")
    published = (tmp_path / "results" / "lm_variants" / "results.json").read_text()
    capsys.readouterr()
    changed = [*argv, "--set", "optim.lr=0.1", "--set", "train.steps=4"]
    assert study(["lm-variants", *changed]) == 2
    err = _err(capsys)
    assert "resolved.optim.lr" in err and "move the cell files away to recompute them" in err
    assert (tmp_path / "results" / "lm_variants" / "results.json").read_text() == published
    shutil.move(tmp_path / "runs" / ".cells", tmp_path / "old-cells")  # what the message says
    assert LV.main(changed) == 0
    after = _train_record(tmp_path / "results")
    assert after["steps"] == 4 and after["resumed"] is False and after["val_ppl"] != before["val_ppl"]
    assert (tmp_path / "runs" / "softmax" / "seed-0.set-aside-1" / "summary.json").is_file()
    config = (tmp_path / "runs" / "softmax" / "seed-0" / "config.yaml").read_text()
    assert "lr: 0.1" in config
    assert os.path.exists(tmp_path / "old-cells")


TIMES = ("seconds", "loadavg_start", "loadavg_end", "ms_per_step", "cpu_ms_per_step")


def _mqar_results(out: Path) -> list[dict]:
    records = json.loads((out / "results.json").read_text())
    return [{k: v for k, v in r.items() if not k.startswith(TIMES)} for r in records]


class _Killed(BaseException):
    """What a kill -9 leaves in process: nothing after this point runs."""


def test_mqar_sweep_killed_at_any_point_gives_the_uninterrupted_results(tmp_path, monkeypatch):
    """A kill inside the second cell (its file never written), one halfway
    through a cell file's atomic write (a partial temp file left) and one
    after the last cell before the report: the same command then publishes
    the results of an uninterrupted run (every field but time measurements)."""
    from experiments.mqar import study as MS
    from experiments.mqar import sweep as M

    def argv(name: str) -> list[str]:
        where = ["--work", str(tmp_path / name / "work"), "--out", str(tmp_path / name / "out")]
        return ["--quick", "--mixers", "softmax,linear,swa-16", *where]

    assert MS.main(argv("ref")) == 0
    reference = _mqar_results(tmp_path / "ref" / "out")
    real, calls = M.train_cell, []

    def dies_in_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise _Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "train_cell", dies_in_second)
    with pytest.raises(_Killed):
        MS.main(argv("run"))
    monkeypatch.setattr(M, "train_cell", real)
    cells = tmp_path / "run" / "work" / "cells"
    assert len(list(cells.glob("*.json"))) == 1 and not (tmp_path / "run" / "out" / "results.json").exists()
    (cells / ".half-written.json.tmp-4242").write_text('{"seq_len": 16, "accur')  # a write cut by the kill
    monkeypatch.setattr(M, "report", lambda *a, **k: (_ for _ in ()).throw(_Killed()))  # killed before the report
    with pytest.raises(_Killed):
        MS.main(argv("run"))
    monkeypatch.undo()
    assert len(list(cells.glob("*.json"))) == 3
    assert MS.main(argv("run")) == 0
    assert _mqar_results(tmp_path / "run" / "out") == reference


LRA_TIMES = (
    "wall_s",
    "run_wall_s",
    "loadavg_1min",
    "loadavg_start",
    "resumed_from_step",
    "train_examples_per_s",
    "command",
)


def _lra_results(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in LRA_TIMES} for r in json.loads((out / "results.json").read_text())]


@pytest.mark.slow
def test_lra_sweep_killed_at_any_point_gives_the_uninterrupted_results(tmp_path, monkeypatch):
    """A real SIGKILL of the sweep's process right after the first run's
    step-1 checkpoint (LATTE_FAULTS); then kills simulated in process: after
    the second run ended but before its cell file was written, halfway
    through a cell file's write, before the report. The same command then
    publishes the results of an uninterrupted run (every field but time
    measurements), and no finished run is resumed for 0 steps."""
    from experiments.lra import study as lra

    def argv(name: str) -> list[str]:
        where = ["--work", str(tmp_path / name / "work"), "--out", str(tmp_path / name / "out")]
        tiny = ["--override", "train.steps=2", "optim.warmup_steps=0", "train.eval_every=0", "train.save_every=1"]
        return ["--quick", "--tasks", "listops", "--mixers", "latte", "softmax", "--parts", "train", *where, *tiny]

    assert lra.main(argv("ref")) == 0
    reference = _lra_results(tmp_path / "ref" / "out")
    assert len(reference) == 2
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LATTE_FAULTS": "kill_after_save=1", "PYTHONPATH": str(root)}
    killed = subprocess.run(
        [sys.executable, "-m", "experiments.lra", *argv("run")], cwd=root, env=env, capture_output=True
    )
    work, out = tmp_path / "run" / "work", tmp_path / "run" / "out"
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert (work / "listops-latte" / "step-00000001").is_dir() and not (
        work / "listops-latte" / "step-00000002"
    ).exists()
    assert not (work / "cells").exists() and not out.exists()
    real, calls = lra.run_training, []

    def dies_after_second_run(*args, **kwargs):
        record = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            raise _Killed  # the run ended, its cell file is never written
        return record

    monkeypatch.setattr(lra, "run_training", dies_after_second_run)
    with pytest.raises(_Killed):
        lra.main(argv("run"))
    monkeypatch.setattr(lra, "run_training", real)
    assert len(list((work / "cells").glob("*.json"))) == 1 and (work / "listops-softmax" / "summary.json").is_file()
    (work / "cells" / ".half-written.json.tmp-4242").write_text('{"task": "listops", "test_acc')  # a cut write
    monkeypatch.setattr(lra, "write_results", lambda *a, **k: (_ for _ in ()).throw(_Killed()))
    with pytest.raises(_Killed):
        lra.main(argv("run"))
    monkeypatch.undo()
    assert len(list((work / "cells").glob("*.json"))) == 2 and not (out / "results.json").exists()
    assert lra.main(argv("run")) == 0
    records = json.loads((out / "results.json").read_text())
    assert _lra_results(out) == reference
    assert all(r["train_examples_per_s"] > 0 for r in records)  # the finished run was read, not resumed


CONVERT_TIMES = ("eval_wall_s", "train_wall_s", "cell_wall_s", "load_start", "load_end")


CONVERT_MEASURED = (*CONVERT_TIMES, "wall_s", "max_load", "decode_ms_per_token")


@pytest.mark.slow
def test_convert_sweep_killed_at_any_point_gives_the_uninterrupted_results(tmp_path, monkeypatch):
    """`python -m experiments.convert --quick --stages eval`: the stand-in's
    `latte convert` process killed with SIGKILL after its step-1 checkpoint;
    then, in process, a kill inside the fourth ppl cell, a cell file's write
    cut halfway and a kill before the report. The same command then
    publishes the results of an uninterrupted run."""
    from experiments.convert import study as CV
    from latte.eval import runner as R
    from latte.eval import suites as S

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def argv(name: str) -> list[str]:
        where = ["--runs", str(tmp_path / name / "runs"), "--out", str(tmp_path / name / "out")]
        return ["--quick", "--stages", "eval", "--set", "train.save_every=1", *where]

    def results(name: str) -> list[dict]:
        records = json.loads((tmp_path / name / "out" / "convert" / "results.json").read_text())["records"]
        return [{k: v for k, v in r.items() if k not in CONVERT_MEASURED} for r in records]

    assert CV.main(argv("ref")) == 0
    reference = results("ref")
    out = tmp_path / "run" / "out"
    monkeypatch.setenv("LATTE_FAULTS", "kill_after_save=1")
    with pytest.raises(RuntimeError, match="exited -9"):
        CV.main(argv("run"))
    monkeypatch.delenv("LATTE_FAULTS")
    assert not out.exists()
    real, calls = S.document_decode, []

    def dies_in_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise _Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(S, "document_decode", dies_in_the_fourth)
    with pytest.raises(_Killed):
        CV.main(argv("run"))
    monkeypatch.setattr(S, "document_decode", real)
    cells = out / "convert" / "cells-ppl" / "cells"
    assert len(list(cells.glob("*.json"))) == 3
    (cells / ".half-written.json.tmp-4242").write_text('{"document": "a", "nl')  # a cut write
    monkeypatch.setattr(R, "write_report", lambda *a, **k: (_ for _ in ()).throw(_Killed()))
    with pytest.raises(_Killed):
        CV.main(argv("run"))
    monkeypatch.undo()
    assert not (out / "convert" / "results.json").exists()
    assert CV.main(argv("run")) == 0
    assert results("run") == reference


@pytest.mark.parametrize("kind", ["model", "checkpoint", "results", "export"])
def test_training_never_writes_into_a_model_a_checkpoint_or_another_commands_folder(tmp_path, capsys, kind):
    """`latte train --train.run_dir DIR` into a base model's folder, a
    checkpoint or a folder a command writes (results/mqar: its step folders
    would make the published folder a run folder no report may write again)
    exits 2 and leaves DIR as it was."""
    folder = tmp_path / "dir"
    if kind == "export":
        _claimed(folder, "latte export")
        for name, text in (("config.json", "{}"), ("model.safetensors", "weights")):
            (folder / name).write_text(text)
    elif kind == "model":
        _model_folder(folder)
    elif kind == "checkpoint":
        _fake_run(tmp_path / "run", "{}")
        folder = tmp_path / "run" / "step-00000002"
    else:
        write_results(folder, "mqar", [{"a": 1}], "t", {"command": "latte experiment mqar", "machine": {}, "wall_s": 1})
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    argv = ["train", "--config", "tiny", f"--train.run_dir={folder}", "--train.steps=1", "--optim.warmup_steps=0"]
    assert main(argv) == 2
    err = _err(capsys)
    assert f"train.run_dir='{folder}'" in err and "choose a new train.run_dir" in err
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("value", ['"long"', "NaN", "-1"])
def test_a_suite_record_with_a_bad_wall_time_is_refused_naming_the_file(tmp_path, capsys, value):
    """Row 12's class in the suite's records: a stage's wall time the runner
    formats (`ok earlier (N s)`) is checked when suite.json is read."""
    _claimed(tmp_path, runner.SUITE_WRITER)
    text = '{"stages": {"check": {"status": "ok", "wall_s": ' + value + '}}, "invocations": []}'
    (tmp_path / "suite.json").write_text(text)
    assert stages.main(["--report-only", "--out", str(tmp_path)]) == 2
    err = _err(capsys)
    assert str(tmp_path / "suite.json") in err and "field 'wall_s'" in err
    assert (tmp_path / "suite.json").read_text() == text and not (tmp_path / "README.md").exists()


def test_a_run_saved_with_the_deprecated_num_latents_is_the_same_run_not_set_aside(tmp_path):
    """A config.yaml written before `latents_per_head` (model.num_latents,
    the total over heads) is read as the trainer reads it: the same run,
    resumed; a different total is still another run."""
    import warnings

    import yaml

    run = tmp_path / "run"
    run.mkdir()
    save_yaml(load_run_config("tiny", ["--train.num_threads=2"]), run / "config.yaml")
    data = yaml.safe_load((run / "config.yaml").read_text())
    per_head = data["model"].pop("latents_per_head")
    data["model"]["num_latents"] = per_head * data["model"]["num_heads"]
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert C.set_aside_changed_run(run, "tiny", []) is None and (run / "config.yaml").is_file()
        moved = C.set_aside_changed_run(run, "tiny", [f"model.latents_per_head={per_head * 2}"])
    assert moved is not None and not run.exists()
