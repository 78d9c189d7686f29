"""The write rule for the single benchmarks (latte/guard.py: claim_files;
docs/reliability.md §8): their --out folder is shared by several commands
(benchmarks/, bench-results/, the GPU suite's folder), and each command
creates its own files there or replaces only the ones it wrote itself.
Nothing here looks at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.gpu_suite.state import SUITE_WRITER
from latte.bench import common
from latte.cli import main
from latte.guard import MARKER, WriteRefused, check_folder, claim_files

CHECK = ["bench", "check", "--device", "cpu", "--quick", "--out"]
ROOT = Path(__file__).resolve().parents[2]


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(capsys, argv: list[str], *named: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(n in err for n in named), err


def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "step-00000002").mkdir(parents=True)
    (run / "step-00000002" / "manifest.json").write_text("{}\n")
    return run


@pytest.mark.parametrize("bench", [["check", "--device", "cpu"], ["ops"], ["decode"], ["ops", "--count-ops"]])
def test_a_benchmark_never_writes_into_a_checkpoint_a_run_or_a_foreign_folder(tmp_path, capsys, bench):
    run = _run_folder(tmp_path)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "README.md").write_text("mine\n")
    before = {f: _snapshot(f) for f in (run, foreign)}
    for out, named in (
        (run, "a run folder"),
        (run / "step-00000002", "a checkpoint"),
        (run / "plots", f"inside {run}"),
        (foreign, "holds 1 entry (README.md), not written by a latte command"),
    ):
        _refused(capsys, ["bench", *bench, "--quick", "--out", str(out)], f"--out {out}", named)
    assert {f: _snapshot(f) for f in (run, foreign)} == before and not (run / "plots").exists()


def test_a_benchmark_replaces_only_its_own_files_in_a_shared_folder(tmp_path, capsys):
    shared = tmp_path / "benchmarks"
    claim_files(shared, "latte bench ops", ["ops.json"], owners=common.BENCH_FOLDER_OWNERS)
    (shared / "ops.json").write_text('{"ops": 1}\n')
    (shared / "check-cpu.json").write_text("not the check's\n")  # there, but never recorded as its file
    _refused(capsys, [*CHECK, str(shared)], f"--out {shared}: check-cpu.json is there", "not recorded as written")
    assert (shared / "check-cpu.json").read_text() == "not the check's\n"
    (shared / "check-cpu.json").unlink()
    assert main([*CHECK, str(shared)]) == 0
    first = json.loads((shared / "check-cpu.json").read_text())
    assert main([*CHECK, str(shared)]) == 0  # the same command over its own output
    again = json.loads((shared / "check-cpu.json").read_text())
    assert again["results"] and [r["T"] for r in again["results"]] == [r["T"] for r in first["results"]]
    assert (shared / "ops.json").read_text() == '{"ops": 1}\n'  # another command's file, untouched
    files = json.loads((shared / MARKER).read_text())["files"]
    check = "latte bench check"
    assert files == {"ops.json": "latte bench ops", "check-cpu.json": check, "check-cpu.md": check}
    # another benchmark may not replace the check's files, nor the check the ops'
    with pytest.raises(WriteRefused, match=r"check-cpu.json is there, written by `latte bench check`"):
        claim_files(shared, "latte bench ops", ["check-cpu.json"], owners=common.BENCH_FOLDER_OWNERS)


def test_a_benchmark_runs_in_the_gpu_suites_folder_but_not_in_another_commands(tmp_path, capsys):
    suite, results = tmp_path / "cuda", tmp_path / "results"
    for folder, writer in ((suite, SUITE_WRITER), (results, "latte experiment mqar")):
        folder.mkdir()
        (folder / "README.md").write_text("report\n")
        (folder / MARKER).write_text(json.dumps({"writer": writer}) + "\n")
    assert common.BENCH_FOLDER_OWNERS[1] == SUITE_WRITER
    assert main([*CHECK, str(suite)]) == 0 and (suite / "check-cpu.json").is_file()
    assert json.loads((suite / MARKER).read_text())["writer"] == SUITE_WRITER  # still the suite's folder
    _refused(capsys, [*CHECK, str(results)], f"--out {results}", "written by `latte experiment mqar`")
    assert sorted(p.name for p in results.iterdir()) == [MARKER, "README.md"]


def test_the_committed_benchmarks_folder_is_marked_file_by_file():
    folder = ROOT / "benchmarks" / "results"
    files = json.loads((folder / MARKER).read_text())
    outputs = sorted(
        p.name for p in folder.iterdir() if p.suffix in (".json", ".md", ".png") and p.name not in ("README.md", MARKER)
    )
    assert files["writer"] == common.BENCH_FOLDER and sorted(files["files"]) == outputs
    for name, writer in files["files"].items():
        # checked only (create=False): each file is its own command's to replace, nobody else's
        claim_files(folder, writer, [name], owners=common.BENCH_FOLDER_OWNERS, create=False)
        other = "latte bench decode" if writer != "latte bench decode" else "latte bench ops"
        with pytest.raises(WriteRefused, match=f"{name} is there, written by `{writer}`"):
            claim_files(folder, other, [name], owners=common.BENCH_FOLDER_OWNERS, create=False)
    # the whole-folder writers stay out of it (the suite --out benchmarks)
    for writer in (SUITE_WRITER, "latte export"):
        with pytest.raises(WriteRefused, match="written by `latte bench`"):
            check_folder(folder, writer)


def _racing(monkeypatch) -> None:
    """Two claims that both pass the first check before either takes the lock
    (what two commands started at the same moment do)."""
    import threading

    from latte import guard

    barrier, real = threading.Barrier(2, timeout=10), guard._locked
    monkeypatch.setattr(guard, "_locked", lambda folder: (barrier.wait(), real(folder))[1])


def _both(*claims) -> list:
    import threading

    results = [None] * len(claims)

    def go(i, claim):
        try:
            results[i] = claim()
        except WriteRefused as e:
            results[i] = e

    threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(claims)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return results


def test_of_two_commands_claiming_one_new_folder_at_once_only_one_gets_it(tmp_path, monkeypatch):
    from latte.guard import claim_folder

    _racing(monkeypatch)
    folder = tmp_path / "out"

    def claim(writer):
        with claim_folder(folder, writer) as held:
            return held

    a, b = _both(lambda: claim("latte export"), lambda: claim("latte experiment mqar"))
    assert sorted(type(r).__name__ for r in (a, b)) == ["PosixPath", "WriteRefused"], (a, b)
    winner = "latte export" if isinstance(b, WriteRefused) else "latte experiment mqar"
    assert json.loads((folder / MARKER).read_text()) == {"writer": winner}
    assert [p.name for p in folder.iterdir()] == [MARKER]  # no temp file left


def test_two_benchmarks_recording_their_files_at_once_both_keep_their_record(tmp_path, monkeypatch):
    _racing(monkeypatch)
    folder, owners = tmp_path / "benchmarks", ("latte bench",)
    a, b = _both(
        lambda: claim_files(folder, "latte bench ops", ["ops.json"], owners=owners),
        lambda: claim_files(folder, "latte bench check", ["check.json"], owners=owners),
    )
    assert a == b == folder
    record = json.loads((folder / MARKER).read_text())
    assert record == {
        "writer": "latte bench",
        "files": {"check.json": "latte bench check", "ops.json": "latte bench ops"},
    }


def test_a_marker_write_cut_by_a_kill_neither_blocks_nor_stays_in_the_folder(tmp_path):
    """A kill between the marker's temp file and its rename leaves the temp
    file: the folder is still new to every command, and the next claim
    removes it."""
    from latte.guard import claim_folder

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / f".{MARKER}.tmp-4242").write_text('{"wri')
    check_folder(folder, "latte experiment lra")
    with claim_folder(folder, "latte experiment lra"):
        pass
    assert [p.name for p in folder.iterdir()] == [MARKER]
    shared = tmp_path / "bench"
    shared.mkdir()
    (shared / f".{MARKER}.tmp-4242").write_text('{"wri')
    claim_files(shared, "latte bench ops", ["ops.json"], owners=("latte bench",))
    assert [p.name for p in shared.iterdir()] == [MARKER]


@pytest.mark.parametrize(
    "module, argv",
    [("benchmarks.audit", []), ("benchmarks.train", []), ("latte.bench.decode", []), ("latte.bench.ops", [])],
)
def test_11_a_benchmarks_readme_is_checked_before_it_runs(tmp_path, monkeypatch, module, argv):
    """Case 11: --readme was read only after the benchmark had run (and
    written its files): a missing file or section now stops it first."""
    import importlib

    bench = importlib.import_module(module)

    def never(*args, **kw):
        raise AssertionError("the benchmark ran before its --readme was checked")

    monkeypatch.setattr(bench, "run", never)
    out, readme = tmp_path / "out", tmp_path / "README.md"
    readme.write_text("# results\n\n<!-- bench:other:start -->\n<!-- bench:other:end -->\n")
    for path, said in ((readme, "no <!-- bench:"), (tmp_path / "nope.md", "no such file")):
        with pytest.raises(ValueError, match=f"--readme {path}: {said}"):
            bench.main(["--quick", "--out", str(out), "--readme", str(path), *argv])
    run = _run_folder(tmp_path)
    with pytest.raises(WriteRefused, match="--readme .*run.*a run folder"):
        bench.main(["--quick", "--out", str(out), "--readme", str(run / "README.md"), *argv])
    assert not out.exists() and "markers" not in readme.read_text()


def test_11_a_readme_with_the_section_is_accepted_before_the_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- bench:train-compiled:start -->\n<!-- bench:train-compiled:end -->\n")
    common.check_readme(readme, ["train-compiled"])
    with pytest.raises(ValueError, match="bench:train:start"):
        common.check_readme(readme, ["train"])
