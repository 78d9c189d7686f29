"""latte bench check keeps a row for every path that fails, and writes its
files after every shape (issue 42: a failed reference left no row at all)."""

import json

import pytest

from latte.bench import cuda_check


def test_a_failing_reference_and_path_are_rows_and_files_follow_each_shape(tmp_path, monkeypatch):
    calls = {"ref": 0}
    real_reference = cuda_check._reference

    def reference(*args):
        calls["ref"] += 1
        if calls["ref"] == 1:
            raise RuntimeError("expected self and mask to be on the same device")
        return real_reference(*args)

    monkeypatch.setattr(cuda_check, "_reference", reference)
    res = cuda_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    rows = res["results"]
    assert len(rows) == len(cuda_check.DISTS) * len(cuda_check.PATHS)  # every path of every shape is a row
    first = rows[: len(cuda_check.PATHS)]
    assert all(r["skipped"] and r["reason"].startswith("reference failed: RuntimeError: expected self") for r in first)
    later = rows[len(cuda_check.PATHS) :]  # the reference runs again: torch measured, fla a row saying why not
    assert all(not r.get("skipped") and r["forward"] < 1e-4 for r in later if r["path"] == "torch")
    assert all(r["skipped"] and r["reason"].startswith("unavailable: ValueError") for r in later if r["path"] == "fla")
    on_disk = json.loads((tmp_path / "check-cpu.json").read_text())
    assert len(on_disk["results"]) == len(rows)


def test_files_are_written_after_every_shape(tmp_path, monkeypatch):
    """A run killed during its second shape still has the first one's rows on disk."""
    real_case = cuda_check.check_case
    done = []

    def case(T, dist, args, seed=0):
        if done:
            on_disk = json.loads((tmp_path / "check-cpu.json").read_text())
            assert len(on_disk["results"]) == len(done) * len(cuda_check.PATHS)
            raise KeyboardInterrupt  # the machine goes away mid-run
        done.append(dist)
        return real_case(T, dist, args, seed)

    monkeypatch.setattr(cuda_check, "check_case", case)
    with pytest.raises(KeyboardInterrupt):
        cuda_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    on_disk = json.loads((tmp_path / "check-cpu.json").read_text())
    assert [r["dist"] for r in on_disk["results"]] == [cuda_check.DISTS[0]] * len(cuda_check.PATHS)
