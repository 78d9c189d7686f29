"""`python -m benchmarks.hf_decode --quick` writes a well-formed record: the
machine (threads, load average), both paths timed for every model, their
ratio, and that the static step's greedy tokens are transformers' loop's.
No assertion looks at a time."""

import pytest

pytest.importorskip("transformers")

from benchmarks import hf_decode  # noqa: E402
from tests.bench.quick_checks import FAST, check_files, check_machine, check_point  # noqa: E402


def test_hf_decode_quick(tmp_path, capsys):
    hf_decode.main(FAST + ["--out", str(tmp_path)])
    res = check_files(tmp_path, "hf_decode", capsys)
    check_machine(res)
    m, c = res["machine"], res["config"]
    assert m["loadavg_start"] and m["loadavg_end"] and c["quick"] and c["models"] == list(hf_decode.MODELS)
    timed = {(r["model"], r["path"]): r for r in res["results"] if "path" in r}
    both = {r["model"]: r for r in res["results"] if "static_over_transformers" in r}
    assert set(timed) == {(name, p) for name in hf_decode.MODELS for p in hf_decode.PATHS}
    assert set(both) == set(hf_decode.MODELS)
    for r in timed.values():
        check_point(r["generate_ms"])
        check_point(r["one_token_ms"])
        per = (r["generate_ms"]["median_ms"] - r["one_token_ms"]["median_ms"]) / (c["new"] - 1)
        assert r["ms_per_token"] == pytest.approx(per)
    for name, r in both.items():
        assert r["same_tokens"] is True
        got = timed[(name, "static")]["ms_per_token"] / timed[(name, "transformers")]["ms_per_token"]
        assert r["static_over_transformers"] == pytest.approx(got)
    table = (tmp_path / "hf_decode.md").read_text()
    assert all(name in table for name in hf_decode.MODELS) and "transformers' loop ms/token" in table
