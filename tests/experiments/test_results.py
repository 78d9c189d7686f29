"""The shared experiment machinery: resumable sweeps and result files."""

import json

import pytest

from experiments.common.results import Sweep, provenance, write_results


def test_sweep_resumes_and_never_redoes_a_finished_cell(tmp_path):
    cells = [{"mixer": m, "seq_len": t} for m in ("latte", "softmax") for t in (64, 128)]
    calls = []

    def fn(cell):
        calls.append(cell)
        if len(calls) == 3:
            raise KeyboardInterrupt  # killed mid-sweep
        return {"accuracy": cell["seq_len"] / 1000}

    with pytest.raises(KeyboardInterrupt):
        Sweep(tmp_path, cells).run(fn)
    assert len(Sweep(tmp_path, cells).records()) == 2
    calls.clear()
    records = Sweep(tmp_path, cells).run(lambda c: {"accuracy": c["seq_len"] / 1000})
    assert [(r["mixer"], r["seq_len"]) for r in records] == [(c["mixer"], c["seq_len"]) for c in cells]
    assert records[3]["accuracy"] == 0.128


def test_sweep_skips_a_cell_a_parallel_worker_finished_meanwhile(tmp_path):
    cells = [{"i": 0}, {"i": 1}]
    other = Sweep(tmp_path, cells)

    def fn(cell):  # while this worker trains cell 0, another finishes cell 1
        Sweep(tmp_path, cells[1:]).run(lambda c: {"by": "other"})
        return {"by": "this"}

    records = other.run(fn)
    assert [r["by"] for r in records] == ["this", "other"]


def test_an_incomplete_record_is_reported_then_run_again(tmp_path):
    cells = [{"i": 0}, {"i": 1}]
    Sweep(tmp_path, cells).run(lambda c: {"acc": 0.5, "incomplete": c["i"] == 1})
    sweep = Sweep(tmp_path, cells)
    assert [r["i"] for r in sweep.records()] == [0, 1] and sweep.pending() == [{"i": 1}]
    calls = []
    sweep.run(lambda c: calls.append(c) or {"acc": 0.9})
    assert calls == [{"i": 1}] and sweep.records()[1]["acc"] == 0.9 and not sweep.pending()


def test_sweep_stops_before_a_cell_when_asked(tmp_path):
    sweep = Sweep(tmp_path, [{"i": 0}, {"i": 1}])
    sweep.run(lambda c: {"acc": 1.0}, stop=lambda: len(sweep.records()) == 1)
    assert sweep.pending() == [{"i": 1}]


def test_sweep_rejects_repeated_cells(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        Sweep(tmp_path, [{"a": 1}, {"a": 1}])


def test_write_results_files_and_readme_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- results:demo:start -->\nold\n<!-- results:demo:end -->\ny\n")
    run = provenance("demo", ["--quick"], started=0.0)
    write_results(
        tmp_path / "out", "demo", [{"mixer": "latte", "accuracy": 0.5}], "| a |\n|---|\n| 1 |", run, readme=readme
    )
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == [{"mixer": "latte", "accuracy": 0.5}]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["command"] == "python -m experiments.demo --quick"
    text = readme.read_text()
    assert "old" not in text and "`python -m experiments.demo --quick`" in text and text.endswith("y\n")
    assert "\n#### demo\n" in text  # the same heading level as in results.md
    write_results(
        tmp_path / "out", "demo", [{"a": 1}], "![curve](curve.png) [doc](https://x.org/a.png)", run, readme=readme
    )
    text = readme.read_text()  # links to the plots beside results.md work from the README
    assert "![curve](out/curve.png)" in text and "(https://x.org/a.png)" in text
    with pytest.raises(ValueError, match="flat"):
        write_results(tmp_path / "out", "demo", [{"curve": [1, 2]}], "", run)


def test_a_report_only_header_does_not_pass_its_seconds_off_as_the_runs(tmp_path):
    for argv, said in (
        (["--quick"], "; wall time 0 s;"),
        (["--report-only"], "wall time of this report-only invocation 0 s"),
    ):
        run = dict(provenance("demo", argv, started=0.0), wall_s=0.2)
        write_results(tmp_path / "out", "demo", [{"a": 1}], "text", run)
        header = (tmp_path / "out" / "results.md").read_text().split("\n\n")[2]
        assert said in header, header


def test_every_study_runs_with_python_dash_m():
    """experiments.COMMANDS names, for each study, a module `python -m` runs
    (a package's __main__ or a module of its own) whose main is MODULES'."""
    import importlib.util

    from experiments import COMMANDS, MODULES

    assert set(COMMANDS) == set(MODULES)
    for name, command in COMMANDS.items():
        spec = importlib.util.find_spec(command)
        runs = spec.submodule_search_locations is None or importlib.util.find_spec(f"{command}.__main__")
        assert runs, f"{name}: python -m {command} has nothing to run"
        assert callable(importlib.import_module(MODULES[name]).main), name


def test_images_are_linked_from_results_md_and_the_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:demo:start -->\n<!-- results:demo:end -->\n")
    run = provenance("demo", [], started=0.0)
    write_results(tmp_path / "results" / "demo", "demo", [{"a": 1}], "text", run, readme=readme, images=["plot.png"])
    assert "![plot](plot.png)" in (tmp_path / "results" / "demo" / "results.md").read_text()
    text = readme.read_text()
    assert "![plot](results/demo/plot.png)" in text and "#### demo" in text  # headings sit below the section's


# ---------------------------------------------------------------- issue 23: protocols and damaged cell files


def test_a_cell_records_its_protocol_and_another_protocol_is_refused_naming_both(tmp_path):
    cells = [{"i": 0}, {"i": 1}]
    Sweep(tmp_path, cells, protocol={"examples": 128, "fillers": "zeros"}).run(lambda c: {"acc": 0.5})
    stored = json.loads((tmp_path / "cells" / "i=0.json").read_text())
    assert stored["protocol"] == {"examples": 128, "fillers": "zeros"}
    same = Sweep(tmp_path, cells, protocol={"examples": 128, "fillers": "zeros"})
    assert same.pending() == [] and all("protocol" not in r for r in same.records())
    other = Sweep(tmp_path, cells, protocol={"examples": 64, "fillers": "random"})
    for call in (other.pending, other.records, lambda: other.run(lambda c: {"acc": 0.9})):
        with pytest.raises(ValueError, match=r"i=0.json: this cell ran under another protocol") as e:
            call()
        assert "examples: 128 then, 64 now; fillers: 'zeros' then, 'random' now" in str(e.value)
        assert "(1 more cell files" in str(e.value)
    assert json.loads((tmp_path / "cells" / "i=1.json").read_text()) == {
        "i": 1,
        "acc": 0.5,
        **{"protocol": stored["protocol"]},
    }


def test_a_cell_written_before_protocols_is_refused_not_read_as_its_own_json_states(tmp_path):
    """A cell file without a recorded protocol (issue 41): its inputs cannot be
    proven the same, so it is refused under any protocol, naming each field
    it does not record; the file is left as it was."""
    (tmp_path / "cells").mkdir()
    text = json.dumps({"i": 0, "acc": 0.5, "examples": 128})
    (tmp_path / "cells" / "i=0.json").write_text(text)
    with pytest.raises(ValueError, match="examples: <not recorded> then, 128 now; batch_size: <not recorded>"):
        Sweep(tmp_path, [{"i": 0}], protocol={"examples": 128, "batch_size": 32}).pending()
    assert (tmp_path / "cells" / "i=0.json").read_text() == text


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"i": 0, "acc": 0.', "not valid JSON"),
        ("\x00\x01garbage", "not valid JSON"),
        ("[1, 2]", "a JSON list, expected a JSON dict"),
        ('{"i": 0}', r"not a finished cell of this sweep \(no acc\)"),
        ('{"i": 5, "acc": 0.5}', r"holds another cell \(i: 5 in the file, 0 expected\)"),
    ],
    ids=["truncated", "garbage", "a-list", "no-result-field", "another-cell"],
)
def test_a_damaged_cell_file_is_named_not_a_traceback(tmp_path, content, message):
    (tmp_path / "cells").mkdir()
    path = tmp_path / "cells" / "i=0.json"
    path.write_text(content)
    sweep = Sweep(tmp_path, [{"i": 0}], fields=("acc",))
    for call in (sweep.pending, sweep.records):
        with pytest.raises(ValueError, match=message) as e:
            call()
        assert str(path) in str(e.value)
    assert path.read_text() == content  # never overwritten


def test_nothing_to_write_leaves_results_and_readme_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- results:demo:start -->\nkept\n<!-- results:demo:end -->\n")
    with pytest.raises(ValueError, match="no records to write"):
        write_results(tmp_path / "out", "demo", [], "", provenance("demo", [], 0.0), readme=readme)
    assert "kept" in readme.read_text() and not (tmp_path / "out").exists()
