"""Issue 59, case 1: a finished run folder trained on old data was reused
under the new data's hash, because the sweeps' set-aside compared only
config.yaml. `set_aside_changed_run` (experiments/common/cells.py) compares
the run's recorded inputs (latte/train/inputs.py) as well."""

from __future__ import annotations

import json
import os
import shutil

from experiments.common import cells as C
from latte.config_io import build, save_yaml
from latte.train.config import LMRunConfig
from latte.train.inputs import RECORD
from latte.train.loop import train
from tests.train.runs import tiny_config_dict, write_corpus


def _finished_run(tmp_path, **train_fields):
    """A tiny run trained to its end (2 steps), its config file and the sets
    a sweep gives; the corpus is the test's own."""
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "runs" / "softmax" / "seed-0"
    data = tiny_config_dict(corpus, run, tmp_path / "cache")
    data["train"].update(steps=2, save_every=2, **train_fields)
    config = tmp_path / "tiny.yaml"
    save_yaml(build(LMRunConfig, data, where="test"), config)
    train(build(LMRunConfig, data, where="test"))
    sets = ["train.num_threads=1"]
    assert C.finished_summary(run, 2) is not None
    return corpus, run, str(config), sets


def test_1_a_finished_run_on_changed_data_is_set_aside_not_reused_under_the_new_hash(tmp_path, capsys):
    corpus, run, config, sets = _finished_run(tmp_path)
    assert C.set_aside_changed_run(run, config, sets) is None  # the same config and inputs: reused
    os.utime(corpus / "doc04.txt")  # touched, the same bytes: still the same inputs
    assert C.set_aside_changed_run(run, config, sets) is None
    doc = corpus / "doc04.txt"
    doc.write_text(doc.read_text() + "\nnew text\n")
    moved = C.set_aside_changed_run(run, config, sets)
    assert moved == run.with_name("seed-0.set-aside-1") and not run.exists()
    assert C.finished_summary(moved, 2) is not None and (moved / RECORD).is_file()  # nothing deleted
    err = capsys.readouterr().err
    assert f"inputs.data.source:{doc.resolve()}" in err and "never resumed under the new one" in err


def test_1_a_finished_run_that_records_no_inputs_is_set_aside(tmp_path, capsys):
    _, run, config, sets = _finished_run(tmp_path)
    (run / RECORD).unlink()  # trained before runs recorded their inputs
    moved = C.set_aside_changed_run(run, config, sets)
    assert moved == run.with_name("seed-0.set-aside-1")
    assert "inputs: <not recorded>" in capsys.readouterr().err
    run.mkdir()  # a run folder holding only its config (killed before reading its data): nothing to reuse
    shutil.copy(moved / "config.yaml", run / "config.yaml")
    assert C.set_aside_changed_run(run, config, sets) is None


def test_1_a_run_that_accepted_changed_inputs_is_set_aside(tmp_path, capsys):
    corpus, run, config, sets = _finished_run(tmp_path)
    record = json.loads((run / RECORD).read_text())
    record["accepted"] = [{"time": "2026-01-01T00:00:00Z", "step": 1, "changes": ["data.source:...: ..."]}]
    (run / RECORD).write_text(json.dumps(record))
    assert C.set_aside_changed_run(run, config, sets) is not None
    assert "changed inputs accepted when resuming at step 1" in capsys.readouterr().err
