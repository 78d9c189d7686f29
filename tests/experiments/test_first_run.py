"""`python -m experiments.gpu_suite --first-run` (issue 42, item 6) without a GPU: its dry
run checks every command, its deadline and stage names are its own."""

import pytest

from experiments.gpu_suite import stages as suite


def test_first_run_dry_run_checks_every_command(capsys, tmp_path):
    assert suite.main(["--first-run", "--dry-run", "--wheels", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "5 stages, budget 500 s per invocation" in out
    for s in suite.first_run():
        assert f"[ok] {s.name}" in out
    assert "42 points, T 4096..65536, batch x T 65536" in out  # 3 T x 2 modes x 7 providers
    assert "dry run: every command checked" in out


def test_first_run_fits_its_deadline_and_keeps_triton_kernels():
    todo = suite.selected(suite.parse_args(["--first-run"]))
    assert [s.name for s in todo] == [s.name for s in suite.first_run()]
    assert sum(s.est_s for s in todo) <= suite.FIRST_RUN_BUDGET_S - 25  # the runner keeps 25 s to pack
    for s in todo:
        assert dict(s.env)["TRITON_CACHE_DIR"] in s.outputs  # packed with the results: a second call starts warm


def test_first_run_options():
    assert suite.parse_args(["--first-run"]).budget_s == suite.FIRST_RUN_BUDGET_S
    assert suite.parse_args(["--first-run", "--budget-s", "300"]).budget_s == 300
    assert suite.parse_args([]).budget_s == suite.DEFAULT_BUDGET_S
    assert [s.name for s in suite.selected(suite.parse_args(["--first-run", "--stages", "first-ops"]))] == ["first-ops"]
    with pytest.raises(SystemExit):
        suite.parse_args(["--first-run", "--stages", "ops-bf16"])
