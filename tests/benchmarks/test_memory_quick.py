"""`python -m benchmarks.memory --quick` writes a well-formed record: the
machine (threads, load average), every rule timed without and with memory
in both phases, and the ratio of the two. No assertion looks at a time."""

import pytest
import torch

from benchmarks import memory
from latte.ops.window.memory import MEMORY_RULES
from tests.bench.quick_checks import FAST, check_files, check_machine, check_point


def test_memory_quick(tmp_path, capsys):
    memory.main(FAST + ["--out", str(tmp_path), "--rules", "key_norm,oracle"])
    res = check_files(tmp_path, "memory", capsys)
    check_machine(res)
    m, c = res["machine"], res["config"]
    assert m["loadavg_start"] and m["loadavg_end"]
    assert c["rules"] == ["key_norm", "oracle"] and c["quick"] and c["M"] == memory.QUICK["M"]
    timed = {(r["rule"], r["memory"], r["phase"]): r for r in res["results"] if "memory" in r}
    ratios = {(r["rule"], r["phase"]): r for r in res["results"] if "ratio_with_to_without" in r}
    want = {(rule, phase) for rule in c["rules"] for phase in memory.PHASES}
    assert set(ratios) == want
    assert set(timed) == {(rule, mem, phase) for rule, phase in want for mem in ("none", rule)}
    for (_, _, phase), r in timed.items():
        check_point(r)
        assert r["interleaved"] and r["loadavg_1min"] is not None
        assert (r["tokens_per_s"] is None) == (phase == "decode")
    for (rule, phase), r in ratios.items():
        got = timed[(rule, rule, phase)]["median_ms"] / timed[(rule, "none", phase)]["median_ms"]
        assert r["ratio_with_to_without"] == pytest.approx(got)


def test_memory_rules_flag_refuses_unknown_rule(capsys):
    with pytest.raises(SystemExit) as e:
        memory.parse_args(["--quick", "--rules", "key_norm,nearest"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--rules" in err and "nearest" in err and all(r in err for r in MEMORY_RULES)


def test_memory_quick_times_the_model_and_cpu_ratios(tmp_path, capsys):
    """--model-rules adds the whole model's rows (scope "model"); every row
    carries the thread's CPU time beside the wall time, and each pair its
    CPU-time ratio, which the table reports."""
    memory.main(FAST + ["--out", str(tmp_path), "--rules", "random", "--model-rules", "key_norm"])
    res = check_files(tmp_path, "memory", capsys)
    c = res["config"]
    assert c["model_rules"] == ["key_norm"] and c["model"] == memory.QUICK_MODEL
    timed = {(r["scope"], r["rule"], r["memory"], r["phase"]): r for r in res["results"] if "memory" in r}
    ratios = {(r["scope"], r["rule"], r["phase"]): r for r in res["results"] if "cpu_ratio" in r}
    want = {(scope, rule) for scope, rule in (("layer", "random"), ("model", "key_norm"))}
    assert set(ratios) == {(scope, rule, phase) for scope, rule in want for phase in memory.PHASES}
    for (scope, rule, phase), r in ratios.items():
        got = timed[(scope, rule, rule, phase)]["cpu_median_ms"] / timed[(scope, rule, "none", phase)]["cpu_median_ms"]
        assert r["cpu_ratio"] == pytest.approx(got)
    assert all(r["cpu_median_ms"] >= r["cpu_min_ms"] > 0 for r in timed.values())
    assert "| model | std1 | key_norm |" in (tmp_path / "memory.md").read_text()


def test_memory_model_rules_flag_refuses_the_oracle(capsys):
    with pytest.raises(SystemExit) as e:
        memory.parse_args(["--quick", "--model-rules", "oracle"])
    assert e.value.code == 2
    assert "--model-rules" in capsys.readouterr().err


def test_memory_quick_times_each_kind_of_input(tmp_path, capsys):
    """--inputs times the layer on each kind of input, a pair of rows per
    (kind, rule, phase), and the table gives each pair's verdict on the
    targets; the kinds are what they say (spread keys, spikes, left
    padding passed as the mask)."""
    kinds = list(memory.INPUTS)
    memory.main(
        FAST + ["--out", str(tmp_path), "--rules", "key_norm", "--model-rules", "", "--inputs", ",".join(kinds)]
    )
    res = check_files(tmp_path, "memory", capsys)
    assert res["config"]["inputs"] == kinds
    ratios = {(r["inputs"], r["phase"]) for r in res["results"] if "cpu_ratio" in r}
    assert ratios == {(kind, phase) for kind in kinds for phase in memory.PHASES}
    table = (tmp_path / "memory.md").read_text()
    for kind in kinds:
        assert f"| layer | {kind} | key_norm |" in table
    assert table.count("prefill m") == len(kinds)  # "prefill met" or "prefill missed", once a row
    s = memory.QUICK
    base = memory._inputs(s, "std1")
    assert base[-1] is None
    for kind, std in (("std10", 10.0), ("std40", 40.0)):
        x = memory._inputs(s, kind)
        torch.testing.assert_close(x[1], base[1] * std)  # key logits b
        torch.testing.assert_close(x[4], base[4] * std)  # keys k
        torch.testing.assert_close(x[3], base[3])  # queries unchanged
    spiked = memory._inputs(s, "spike80")
    assert torch.equal(spiked[4][:, 7::16] - base[4][:, 7::16] > 79, torch.ones_like(spiked[4][:, 7::16], dtype=bool))
    mask = memory._inputs(s, "left-padding")[-1]
    assert not mask[0, : s["T"] // 4].any() and mask[0, s["T"] // 4 :].all()


def test_memory_inputs_flag_refuses_unknown_kind(capsys):
    with pytest.raises(SystemExit) as e:
        memory.parse_args(["--quick", "--inputs", "std1,std7"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--inputs" in err and "std7" in err and "left-padding" in err
