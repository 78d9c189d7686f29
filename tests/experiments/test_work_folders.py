"""Issue 59, cases 10 and 12: the experiments' work folders (mqar and lra
--work, the sweeps' --runs) go through the write rule of --out before any
work (experiments/common/results.py: claim_work), in the GPU suite's dry run
too, and the suite's dry run checks its own --out and --pack as the real run
does. Every refusal names the flag and the folder and changes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments.common.results import claim_work
from experiments.gpu_suite import dryrun
from experiments.gpu_suite import stages as suite
from experiments.gpu_suite.stages import Stage
from experiments.lm_variants import study as LV
from experiments.lra import study as lra
from experiments.mqar import study as MS
from experiments.mqar import sweep as M
from latte.guard import MARKER, WriteRefused


def _files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _folders(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Folders no --work may be: a corpus (its hash would change), a model,
    a run and a checkpoint; (folder, what the refusal says)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("some text\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    run = tmp_path / "run"
    (run / "step-00000002").mkdir(parents=True)
    (run / "step-00000002" / "manifest.json").write_text("{}")
    return {
        "corpus": (corpus, "holds 1 entry (doc.txt), not written by this command"),
        "model": (model, "a model's folder"),
        "run": (run, "a run folder"),
        "inside a run": (run / "work", "inside"),
        "checkpoint": (run / "step-00000002", "a checkpoint"),
    }


def _never(*args, **kw):
    raise AssertionError("work started before the folder was checked")


@pytest.mark.parametrize("kind", ["corpus", "model", "run", "inside a run", "checkpoint"])
def test_10_mqar_work_is_checked_like_out_before_any_work(tmp_path, monkeypatch, kind):
    """Case 10: `mqar --work` wrote cells/ and progress/ into any folder."""
    folder, said = _folders(tmp_path)[kind]
    before = _files(tmp_path)
    monkeypatch.setattr(M, "train_cell", _never)
    for extra in ([], ["--report-only"]):
        argv = ["--quick", "--mixers", "softmax", "--work", str(folder), "--out", str(tmp_path / "out"), *extra]
        with pytest.raises(WriteRefused, match=f"--work {re.escape(str(folder))}.*{re.escape(said)}"):
            MS.main(argv)
    assert _files(tmp_path) == before and not (tmp_path / "out").exists() and not (tmp_path / "run" / "work").exists()


def test_10_lra_work_and_lm_variants_runs_are_checked_before_any_work(tmp_path, monkeypatch):
    corpus, said = _folders(tmp_path)["corpus"]
    before = _files(tmp_path)
    monkeypatch.setattr(lra, "run_training", _never)
    monkeypatch.setattr(LV, "run_latte", _never)
    with pytest.raises(WriteRefused, match=re.escape(f"--work {corpus}: {said}")):
        lra.main(["--quick", "--tasks", "listops", "--mixers", "softmax", "--work", str(corpus), "--out", "o"])
    argv = ["--quick", "--variants", "softmax", "--seeds", "0", "--stages", "train", "--runs", str(corpus)]
    with pytest.raises(WriteRefused, match=re.escape(f"--runs {corpus}: {said}")):
        LV.main([*argv, "--results", str(tmp_path / "results"), "--threads", "1"])
    assert _files(tmp_path) == before


def test_10_a_work_folder_is_new_empty_an_experiments_or_one_holding_cells(tmp_path):
    new = tmp_path / "new"
    assert claim_work(new, "mqar") == new and not new.exists()  # checked only
    claim_work(new, "mqar", create=True)
    assert json.loads((new / MARKER).read_text()) == {"writer": "latte experiment mqar"}
    (new / "cells").mkdir()
    claim_work(new, "convert")  # the convert experiments share their work folders
    legacy = tmp_path / "legacy"  # written before work folders were marked: its cells name it
    (legacy / ".cells" / "train" / "cells").mkdir(parents=True)
    (legacy / "softmax").mkdir()
    claim_work(legacy, "lm-variants", "--runs", create=True)
    assert not (legacy / MARKER).exists()
    with pytest.raises(WriteRefused, match="a run folder"):  # a run folder with cells is still a run folder
        (legacy / "train.lock").write_text("")
        claim_work(legacy, "lm-variants", "--runs")


def test_10_the_suites_dry_run_checks_an_experiments_work_folder(tmp_path):
    corpus, said = _folders(tmp_path)["corpus"]
    argv = ("-m", "experiments.lra", "--quick", "--tasks", "listops", "--mixers", "softmax")
    problems, _ = dryrun.check_stage(Stage("x", (*argv, "--work", str(corpus), "--out", str(tmp_path / "o")), 1, 1))
    assert any(f"--work {corpus}: {said}" in p for p in problems), problems
    lm = ("-m", "experiments.lm_variants", "--quick", "--variants", "softmax", "--stages", "train")
    problems, _ = dryrun.check_stage(Stage("x", (*lm, "--runs", str(corpus), "--results", str(tmp_path)), 1, 1))
    assert any(f"--runs {corpus}: {said}" in p for p in problems), problems


@pytest.mark.parametrize("flag", ["--out", "--pack"])
def test_12_the_suites_dry_run_refuses_an_out_or_pack_the_real_run_refuses(tmp_path, capsys, flag):
    """Case 12: `python -m experiments.gpu_suite --dry-run` said "every command checked"
    for a folder the real run then refused."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    argv = ["--dry-run", "--stages", "check", "--wheels", str(tmp_path), flag, str(folder)]
    assert suite.main(argv) == 2
    out = capsys.readouterr().out
    assert "every command checked" not in out and f"{flag} {folder}: holds 1 entry (notes.txt)" in out
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
