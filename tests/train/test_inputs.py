"""Issue 59: a run is keyed by its inputs, not only by its config
(latte/train/inputs.py). A run records the path, size, mtime and sha256 of
every input it read; resuming on a changed input is refused naming it,
unless accepted; a run older than the record resumes with a warning; a
run folder is never a folder of other files (case 3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from latte.cli import _split_train_args, main
from latte.config_io import save_yaml
from latte.train.distributed import DistEnv
from latte.train.inputs import RECORD, InputsChanged, read_record
from latte.train.loop import train
from latte.train.rundir import prepare_run_dir
from latte.train.runs import check_run_inputs, open_run
from latte.train.setup import setup


@pytest.fixture
def own_corpus(corpus, tmp_path) -> Path:
    """A copy of the session corpus that a test may change."""
    return Path(shutil.copytree(corpus, tmp_path / "corpus"))


def _start(cfg):
    """setup() as `latte train` runs it (resume, data, inputs check), then
    the lock and the logs released without training."""
    run = setup(cfg, DistEnv())
    run.logger.close()
    run.lock.release()
    return run


def _trained(make_config, corpus: Path, run_dir: Path, **more):
    """A run of 2 steps (a checkpoint at step 2) and the config that resumes it."""
    base = {"data.source": str(corpus), "train.save_every": 2, **more}
    train(make_config(run_dir=run_dir, **{**base, "train.steps": 2}))
    return make_config(run_dir=run_dir, **{**base, "train.steps": 4})


def test_a_run_records_the_path_size_mtime_and_sha256_of_every_input(make_config, own_corpus, tmp_path):
    _trained(make_config, own_corpus, tmp_path / "run")
    inputs = read_record(tmp_path / "run")["inputs"]
    doc = own_corpus / "doc03.txt"
    entry = inputs[f"data.source:{doc.resolve()}"]
    assert entry["size"] == doc.stat().st_size and entry["mtime_ns"] == doc.stat().st_mtime_ns
    assert len(entry["sha256"]) == 64 and entry["path"] == str(doc.resolve())
    assert len([n for n in inputs if n.startswith("data.source:")]) == 10
    assert {"cache:train", "cache:validation"} <= inputs.keys()  # the packed token files read


def test_a_changed_corpus_file_is_refused_naming_it_then_accepted_with_the_flag(
    make_config, own_corpus, tmp_path, capsys
):
    run = tmp_path / "run"
    resume = _trained(make_config, own_corpus, run)
    doc = own_corpus / "doc03.txt"
    old_size = doc.stat().st_size
    doc.write_text(doc.read_text() + "\nan edit after the run started\n")
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.is_file() and p.name != "train.lock"}
    with pytest.raises(InputsChanged) as e:
        train(resume)
    text = str(e.value)
    assert f"data.source:{doc.resolve()}: recorded {doc.resolve()}, {old_size} bytes" in text
    assert f"now {doc.resolve()}, {doc.stat().st_size} bytes" in text and "sha256" in text
    assert "--accept-changed-inputs" in text and "--resume never" in text and "nothing was written" in text
    after = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.is_file() and p.name != "train.lock"}
    assert after == before  # config.yaml, the tokenizer and the record too
    assert sorted(p.name for p in run.glob("step-*")) == ["step-00000002"]

    save_yaml(resume, tmp_path / "resume.yaml")
    assert main(["train", "--config", str(tmp_path / "resume.yaml")]) == 2  # the CLI: exit 2, naming the file
    assert f"data.source:{doc.resolve()}: recorded" in capsys.readouterr().err

    resume.train.accept_changed_inputs = True
    assert train(resume)["step"] == 4
    record = read_record(run)
    assert record["inputs"][f"data.source:{doc.resolve()}"]["size"] == doc.stat().st_size
    [accepted] = record["accepted"]
    assert accepted["step"] == 2 and any(str(doc.resolve()) in c for c in accepted["changes"])
    resume.train.accept_changed_inputs = False
    assert train(resume)["step"] == 4  # the new values are the record now: no refusal


def test_a_removed_or_added_corpus_file_is_a_change(make_config, own_corpus, tmp_path):
    resume = _trained(make_config, own_corpus, tmp_path / "run")
    (own_corpus / "doc10.txt").write_text((own_corpus / "doc00.txt").read_text())
    with pytest.raises(InputsChanged, match=r"doc10\.txt: recorded nothing; now "):
        _start(resume)
    (own_corpus / "doc10.txt").unlink()
    (own_corpus / "doc09.txt").unlink()
    with pytest.raises(InputsChanged, match=r"doc09\.txt: recorded .*; now not read"):
        _start(resume)


def test_size_and_mtime_decide_unless_verify_inputs_compares_every_sha256(make_config, own_corpus, tmp_path):
    first = _trained(make_config, own_corpus, tmp_path / "first")
    tok = Path(shutil.copy(tmp_path / "first" / "tokenizer.json", tmp_path / "tok.json"))
    run = tmp_path / "run"
    resume = _trained(make_config, own_corpus, run, **{"data.tokenizer": str(tok)})
    assert read_record(run)["inputs"]["data.tokenizer"]["path"] == str(tok.resolve()) and first
    doc = own_corpus / "doc05.txt"
    doc.touch()  # a new mtime, the same bytes: sha256 decides, no change
    _start(resume)
    assert read_record(run)["inputs"][f"data.source:{doc.resolve()}"]["mtime_ns"] == doc.stat().st_mtime_ns
    st, data = tok.stat(), bytearray(tok.read_bytes())
    data[len(data) // 2] ^= 1  # another byte, the same size, then the same mtime
    tok.write_bytes(bytes(data))
    os.utime(tok, ns=(st.st_atime_ns, st.st_mtime_ns))
    _start(resume)  # size and mtime as recorded: not hashed (resuming reads the checkpoint's copy)
    resume.train.verify_inputs = True
    with pytest.raises(InputsChanged, match=r"data.tokenizer: recorded .* sha256 [0-9a-f]{64}; now .* sha256 "):
        _start(resume)


def test_a_run_that_predates_the_record_resumes_with_a_warning_and_records_from_then_on(
    make_config, own_corpus, tmp_path, caplog
):
    run = tmp_path / "run"
    resume = _trained(make_config, own_corpus, run)
    (run / RECORD).unlink()
    (own_corpus / "doc01.txt").write_text("changed before anything recorded it\n" * 40)
    with caplog.at_level("WARNING", logger="latte.train"):
        assert train(resume)["step"] == 4
    assert "inputs not recorded" in caplog.text
    assert read_record(run)["inputs"][f"data.source:{(own_corpus / 'doc01.txt').resolve()}"]["size"] == 1440
    (own_corpus / "doc01.txt").write_text("and changed again\n")
    with pytest.raises(InputsChanged, match="doc01.txt"):
        train(resume)


def test_a_damaged_record_is_named(make_config, own_corpus, tmp_path):
    run = tmp_path / "run"
    resume = _trained(make_config, own_corpus, run)
    (run / RECORD).write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=rf"{RECORD}: not a record of a run's inputs"):
        _start(resume)
    resume.train.accept_changed_inputs = True
    _start(resume)
    assert json.loads((run / RECORD).read_text())["format"] == "latte-run-inputs"


def test_3_run_dir_refuses_a_folder_of_other_files_and_deletes_nothing(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "letter.txt").write_text("mine\n")
    (docs / "photos").mkdir()
    with pytest.raises(
        ValueError, match=r"train.run_dir=.*docs': holds 2 entries \(letter.txt, photos/\) and is not a run"
    ):
        prepare_run_dir(docs)
    assert sorted(p.name for p in docs.iterdir()) == ["letter.txt", "photos"]  # no train.lock either
    empty, new = tmp_path / "empty", tmp_path / "new"
    empty.mkdir()
    for folder in (empty, new, empty):  # new, empty and its own run folder (train.lock) are fine
        prepare_run_dir(folder).release()


def test_the_flags_of_one_start_set_their_fields_and_are_never_compared_on_resume(make_config, tmp_path, caplog):
    _, overrides = _split_train_args(["--verify-inputs", "--resume", "never", "--accept-changed-inputs"])
    assert overrides == [
        "--train.verify_inputs=true",
        "--train.resume=never",
        "--train.accept_changed_inputs=true",
    ]
    cfg = make_config(run_dir=tmp_path / "run", **{"train.steps": 2, "train.save_every": 2})
    train(cfg)
    cfg.train.verify_inputs = cfg.train.accept_changed_inputs = True
    with caplog.at_level("WARNING", logger="latte.train"):
        _start(cfg)
    assert "changed config" not in caplog.text


def test_evaluating_a_run_checks_its_recorded_inputs(make_config, own_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    _trained(make_config, own_corpus, run)
    trained = open_run(run)
    check_run_inputs(trained)  # the same corpus: fine
    (own_corpus / "doc02.txt").write_text("other validation text\n")
    with pytest.raises(InputsChanged, match=r"(?s)doc02\.txt: recorded .*; now .*evaluating now would score"):
        check_run_inputs(trained)
    (run / RECORD).unlink()
    with caplog.at_level("WARNING", logger="latte.train"):
        check_run_inputs(trained)
    assert "inputs not recorded" in caplog.text
