"""What every `--quick` benchmark run must write: machine info, every point
timed or skipped with a reason, the three files (tests/bench, tests/benchmarks)."""

import importlib.util
import json

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
FAST = ["--quick", "--threads", "1", "--warmup", "0"]


def check_machine(res, threads=1):
    m = res["machine"]
    for key in ("platform", "cpu_model", "cpu_count", "torch", "threads", "loadavg_end"):
        assert key in m
    assert m["threads"] == res["config"]["threads"] == threads
    assert res["config"]["dtype"] == "float32"


def check_point(r):
    if r.get("skipped"):
        assert isinstance(r["reason"], str) and r["reason"]
    else:
        assert r["median_ms"] >= r["min_ms"] > 0
        assert r.get("repeats", r.get("tokens")) >= 5


def check_files(tmp_path, name, capsys):
    res = json.loads((tmp_path / f"{name}.json").read_text())
    assert (tmp_path / f"{name}.md").read_text().startswith(f"# latte bench {name}")
    if HAS_MPL:
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    else:
        captured = capsys.readouterr()
        assert "matplotlib is not installed" in captured.out + captured.err
    return res
