"""Issue 23 on the studies (`python -m experiments.NAME`): nothing stale published (a cell run under
another protocol is refused, naming both), nothing overwritten (a report of
an empty or mistyped work folder replaces no README section), and every bad
argument named (exit 2, one line naming the flag, the value and what is
allowed, before anything runs)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from experiments.common.cells import run_protocol
from experiments.common.results import cell_key
from experiments.lm_variants import study as LV
from experiments.lra import study as lra
from experiments.mqar import sweep as M
from tests.experiments.studies import study

README = "# r\n\n<!-- results:NAME:start -->\npublished\n<!-- results:NAME:end -->\n"


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ---------------------------------------------------------------- item 1: a cell carries its protocol


@pytest.mark.slow
def test_mqar_rerun_with_another_protocol_is_refused_before_training(tmp_path, capsys):
    """The issue's case: --quick, then the same --work with random fillers,
    3 epochs and 64 examples; then a cell in today's format (no recorded
    protocol, as the background queue writes them) is accepted under its own."""
    work, out = tmp_path / "work", tmp_path / "out"
    base = ["mqar", "--quick", "--mixers", "softmax", "--work", str(work), "--out", str(out)]
    assert study(base) == 0
    published = (out / "results.md").read_text()
    before = sorted(p.name for p in (work / "cells").iterdir())
    capsys.readouterr()
    assert study([*base, "--random-fillers", "--epochs", "3", "--train-examples", "64"]) == 2
    err = _err(capsys)
    assert "ran under another protocol or other inputs (train_examples: 128 then, 64 now; fillers: 'zeros' then," in err
    assert "--work folder" in err and err.count("\n") == 1
    assert sorted(p.name for p in (work / "cells").iterdir()) == before  # nothing trained or written
    assert (out / "results.md").read_text() == published
    # the same without --report-only's help: a report over another protocol is refused too
    assert study([*base, "--random-fillers", "--report-only"]) == 2
    # a cell file as written before protocols were recorded: refused, never silently reused (issue 41)
    [path] = (work / "cells").iterdir()
    record = json.loads(path.read_text())
    del record["protocol"]
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert study(base) == 2 and "under a protocol it does not record (written before cells recorded" in _err(capsys)
    assert (out / "results.md").read_text() == published


def _lm_train_cell(runs: Path, variant: str, seed: int, sets: list[str], *, legacy: bool = False) -> None:
    """A finished lm-variants training cell as today's sweep writes it (its
    protocol recorded), or as written before protocols were (`legacy`)."""
    args = LV.train_args(variant, seed, runs / variant / f"seed-{seed}", 1, sets)
    record = {
        "variant": variant,
        "seed": seed,
        "mixer": LV.VARIANTS[variant][1],
        "qk_mixer": LV.VARIANTS[variant][2],
        "val_ppl": 50.0,
        "val_loss": 3.9,
        "unigram_ppl": 300.0,
        "tokens_per_s": 500.0,
        "wall_s": 60.0,
        "steps": 300,
        "tokens_seen": 1228800,
        "train_tokens": 1000000,
        "parameters": 1000,
        "val_tokens": 50000,
        "resumed": False,
        "loadavg_start": 1.0,
        "loadavg_end": 1.0,
        "command": "latte " + " ".join(args),
        "process_s": 61.0,
    }
    if not legacy:
        record["protocol"] = LV.train_protocol({"variant": variant, "seed": seed}, sets)
    cells = runs / ".cells" / "train" / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    (cells / f"{cell_key({'variant': variant, 'seed': seed})}.json").write_text(json.dumps(record))


def test_lm_variants_set_change_is_refused_and_todays_cells_are_accepted(tmp_path, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results"
    _lm_train_cell(runs, "softmax", 0, ["train.steps=300"])
    argv = ["lm-variants", "--variants", "softmax", "--seeds", "0", "--stages", "train"]
    argv += ["--runs", str(runs), "--results", str(results), "--report-only"]
    assert study([*argv, "--set", "train.steps=300"]) == 0  # the protocol its command states
    assert "| softmax |" in (results / "lm_variants" / "results.md").read_text()
    capsys.readouterr()
    assert study([*argv, "--set", "train.steps=100"]) == 2
    assert "resolved.train.steps: 300 then, 100 now" in _err(capsys)
    assert study([*argv, "--set", "train.stepz=100"]) == 2  # an invalid override, even with every cell done
    assert "--set train.stepz=100: not a valid override of mixers/softmax" in _err(capsys)
    _lm_train_cell(runs, "softmax", 0, ["train.steps=300"], legacy=True)  # no protocol: never reused (issue 41)
    assert study([*argv, "--set", "train.steps=300"]) == 2
    assert "a protocol it does not record (written before cells recorded their protocol" in _err(capsys)


def test_lra_override_change_is_refused_and_todays_cells_are_accepted(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    cell = {"part": "train", "task": "listops", "mixer": "latte"}
    argv = ["--tasks", "listops", "--mixers", "latte", "--parts", "train", "--work", str(work), "--out", str(out)]
    config, overrides = lra.train_overrides("listops", "latte", work, ["train.steps=500"])
    record = {
        **cell,
        "budget": "full",
        **dict.fromkeys(lra.TRAIN_FIELDS, 1),
        "task": "listops",
        "mixer": "latte",
        "lra_transformer": 0.3637,
        "train_label_counts": "1 1",
        "test_label_counts": "1 1",
        "command": shlex.join(["latte", "train", "--config", config, *(f"--{o}" for o in overrides)]),
        "protocol": run_protocol(config, overrides),
    }
    (work / "cells").mkdir(parents=True)
    (work / "cells" / f"{cell_key(cell)}.json").write_text(json.dumps(record))
    assert study(["lra", *argv, "--report-only", "--override", "train.steps=500"]) == 0
    capsys.readouterr()
    assert study(["lra", *argv, "--report-only", "--override", "train.steps=700"]) == 2
    err = _err(capsys)
    assert "sets: 'model.mixer=latte train.steps=500' then, 'model.mixer=latte train.steps=700' now" in err
    assert "resolved.train.steps: 500 then, 700 now" in err
    assert study(["lra", *argv, "--override", "model.dimm=3"]) == 2
    assert "--override model.dimm=3: not valid for lra/listops" in _err(capsys)


# ---------------------------------------------------------------- item 2: no stub over a published section


@pytest.mark.parametrize(
    "name, argv",
    [
        ("lra", ["lra", "--report-only", "--work", "WORK", "--out", "OUT"]),
        ("mqar", ["mqar", "--report-only", "--work", "WORK", "--out", "OUT/mqar"]),
        (
            "lm_variants",
            ["lm-variants", "--report-only", "--stages", "train", "--runs", "WORK", "--results", "OUT"],
        ),
    ],
    ids=["lra", "mqar", "lm-variants"],
)
def test_report_of_an_empty_or_mistyped_work_folder_replaces_nothing(tmp_path, capsys, name, argv):
    readme = tmp_path / "README.md"
    text = README.replace("NAME", name)
    readme.write_text(text)
    for work in (tmp_path / "empty", tmp_path / "no-such-folder"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        args = [str(work) if a == "WORK" else a.replace("OUT", str(tmp_path / "out")) for a in argv]
        assert study([*args, "--readme", str(readme)]) == 2
        err = _err(capsys)
        assert "no finished cells" in err and str(work) in err
        assert readme.read_text() == text and not (tmp_path / "out").exists()


def test_a_readme_without_the_section_is_refused_before_any_work(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# nothing here\n")
    assert study(["mqar", "--quick", "--work", str(tmp_path / "w"), "--readme", str(readme)]) == 2
    assert "--readme" in _err(capsys) and not (tmp_path / "w").exists()
    assert study(["lra", "--quick", "--readme", str(tmp_path / "nope.md")]) == 2
    assert "nope.md: no such file" in _err(capsys)


# ---------------------------------------------------------------- items 3, 13: bad arguments named


@pytest.mark.parametrize(
    "argv, named",
    [
        (["mqar", "--dims", "abc"], "argument --dims: expected comma-separated integers >= 2, got 'abc'"),
        (["mqar", "--dims", "63"], "--dims 63: each width must be a multiple of the 2 heads"),
        (["mqar", "--settings", "64x"], "argument --settings: expected comma-separated T x pairs like 64x4"),
        (["mqar", "--settings", "0x0"], "argument --settings: expected comma-separated T x pairs"),
        (["mqar", "--settings", "8x4"], "seq_len=8: too short for num_kv_pairs=4"),
        (["mqar", "--lrs", "-1"], "argument --lrs: expected comma-separated learning rates > 0, got '-1'"),
        (["mqar", "--lrs", "nan"], "argument --lrs: expected comma-separated learning rates > 0"),
        (["mqar", "--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
        (["mqar", "--epochs", "0"], "argument --epochs: expected an integer >= 1, got 0"),
        (["mqar", "--train-examples", "0"], "argument --train-examples: expected an integer >= 1, got 0"),
        (["mqar", "--seeds", "x"], "argument --seeds: expected comma-separated integers >= 0, got 'x'"),
        (["mqar", "--mixers", "gpt"], "argument --mixers: unknown 'gpt'"),
        (["mqar", "--latent-multiples", "0"], "argument --latent-multiples: expected comma-separated multiples > 0"),
        (["mqar", "--shard", "2/2"], "argument --shard: expected K/N with 0 <= K < N"),
        (["mqar", "--deadline", "18h45"], "--deadline '18h45': expected a UTC time"),
        (["lm-variants", "--seeds", "x"], "argument --seeds: expected comma-separated integers >= 0, got 'x'"),
        (["lm-variants", "--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
        (["lm-variants", "--lengths", "0"], "argument --lengths: expected comma-separated integers >= 1"),
        (["lm-variants", "--stages", "train,"], "argument --stages: expected a comma-separated list"),
        (["lm-variants", "--set", "steps"], "--set 'steps': expected SECTION.FIELD=VALUE"),
        (["lra", "--override", "oops"], "--override 'oops': expected SECTION.FIELD=VALUE"),
        (["lra", "--parts", "generators", "--tasks", "listops-short"], "no cells (the control listops-short"),
        (["convert", "--contexts", "0"], "argument --contexts: expected comma-separated integers >= 2, got '0'"),
        (["convert", "--documents", "0"], "argument --documents: expected an integer >= 1, got 0"),
        (["convert", "--threads", "0"], "argument --threads: expected an integer >= 1, got 0"),
        (["convert", "--stages", "eval,typo"], "argument --stages: unknown 'typo'"),
        (["convert", "--models", "nope"], "--models 'nope': expected a comma-separated subset of original,"),
        (["convert-sinks", "--sinks", "-1"], "argument --sinks: expected comma-separated integers >= 0"),
        (["convert-sinks", "--contexts", "abc"], "argument --contexts: expected comma-separated integers >= 2"),
        (["convert-sinks", "--window", "0"], "argument --window: expected an integer >= 1, got 0"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_experiment_arguments_exit_2_naming_flag_value_and_what_is_allowed(tmp_path, capsys, argv, named):
    work = ["--runs" if argv[0] in ("lm-variants", "convert", "convert-sinks") else "--work", str(tmp_path / "w")]
    assert study([*argv, *work]) == 2
    err = _err(capsys)
    assert named in err
    assert not (tmp_path / "w").exists()  # refused before anything ran or was written


def test_quick_keeps_options_given_explicitly():
    from experiments.convert import study as convert
    from experiments.sinks import study as convert_sinks

    a = convert.parse_args(["--quick", "--contexts", "32,96", "--documents", "3", "--threads", "2"])
    assert (a.contexts, a.documents, a.threads, a.needle_contexts) == ("32,96", 3, 2, "96,160")
    assert convert.parse_args([]).contexts == ",".join(map(str, convert.CONTEXTS))
    s = convert_sinks.parse_args(["--quick", "--sinks", "0,1", "--window", "16"])
    assert (s.sinks, s.window, s.contexts) == ("0,1", 16, "32,64")
    b, settings, *_ = M._plan(M.parse_args(["--quick", "--epochs", "2", "--train-examples", "40"]))
    assert b.epochs == 2 and b.train_examples == {16: 40} and settings == M.QUICK_SETTINGS
