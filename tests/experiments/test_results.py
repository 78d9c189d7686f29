"""The shared experiment machinery: resumable sweeps and result files."""

import json

import pytest

from latte.cli import main
from latte.experiments.results import Sweep, provenance, write_results


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


def test_sweep_rejects_repeated_cells(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        Sweep(tmp_path, [{"a": 1}, {"a": 1}])


def test_write_results_files_and_readme_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- results:demo:start -->\nold\n<!-- results:demo:end -->\ny\n")
    run = provenance("demo", ["--quick"], started=0.0)
    write_results(tmp_path / "out", "demo", [{"mixer": "latte", "accuracy": 0.5}], "| a |\n|---|\n| 1 |", run,
                  readme=readme)
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == [{"mixer": "latte", "accuracy": 0.5}]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["command"] == "latte experiment demo --quick"
    text = readme.read_text()
    assert "old" not in text and "`latte experiment demo --quick`" in text and text.endswith("y\n")
    assert "\n#### demo\n" in text  # the same heading level as in results.md
    write_results(tmp_path / "out", "demo", [], "![curve](curve.png) [doc](https://x.org/a.png)", run, readme=readme)
    text = readme.read_text()  # links to the plots beside results.md work from the README
    assert "![curve](out/curve.png)" in text and "(https://x.org/a.png)" in text
    with pytest.raises(ValueError, match="flat"):
        write_results(tmp_path / "out", "demo", [{"curve": [1, 2]}], "", run)


def test_experiment_command_lists_and_rejects_unknown(capsys):
    assert main(["experiment", "--help"]) == 0
    assert main(["experiment", "no-such-experiment"]) == 2
    assert "experiments:" in capsys.readouterr().err
