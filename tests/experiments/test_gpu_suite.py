"""`python -m experiments.gpu_suite` without a GPU: the dry run checks every stage's real
command, the runner keeps its budgets and records and resumes, the wheels
install, and the report turns JSON into the targets table (docs/gpu.md §5)."""

import json
import os
import sys
import tarfile
import zipfile

import pytest
import torch

from experiments.gpu_suite import dryrun, machine, report, runner, targets
from experiments.gpu_suite import stages as suite
from experiments.gpu_suite.stages import Stage
from latte import cli
from latte.bench import cuda_check


def test_dry_run_checks_every_stage(capsys):
    assert suite.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for s in suite.stages():
        assert f"] {s.name}" in out
    assert "132 points, T 1024..131072, batch x T 131072" in out  # the bf16 CUDA sweep
    assert "64 points, T 1024..131072, batch x T 131072" in out  # fp32: no macchiato
    assert "3 runs, 5000 steps x 32" in out  # ListOps at the LRA budget
    assert "seq 512, 300 steps x 16" in out
    assert "dry run: every command checked" in out


@pytest.mark.parametrize(
    "argv, problem",
    [
        (("-m", "latte", "bench", "ops", "--device", "cuda", "--dtype", "bf16"), "invalid choice"),
        (("-m", "latte", "bench", "decode", "--device", "cuda", "--contexts", "4096,1024"), "--contexts"),
        (("-m", "latte", "bench", "opz"), "unknown benchmark"),
        (("-m", "experiments.lm_variants", "--set", "model.windw_size=128"), "windw_size"),
        (("-m", "experiments.lra", "--override", "train.steps=-5"), "steps"),
        (("-m", "pytest", "tests/gpuu"), "no such test folder"),
    ],
)
def test_dry_run_names_a_typo(argv, problem, tmp_path):
    problems, _ = dryrun.check_stage(Stage("x", argv, 1, 1))
    assert problems and problem in " ".join(problems)
    args = suite.parse_args(["--dry-run", "--wheels", str(tmp_path)])
    assert dryrun.dry_run([Stage("x", argv, 1, 1)], args, quiet=True) == 2


def test_suite_options_are_checked():
    for bad in (["--stages", "opps"], ["--redo", "x"], ["--budget-s", "0"]):
        with pytest.raises(SystemExit):
            suite.parse_args(bad)
    args = suite.parse_args(["--stages", "lra,tests", "--skip", "tests"])
    assert [s.name for s in suite.selected(args)] == ["lra"]
    args = suite.parse_args(["--no-optional"])
    assert not any(s.optional for s in suite.selected(args))


def _fake_probe(env):
    return {"packages": {d: {"found": True} for d, *_ in machine.REQUIREMENTS}, "cuda_available": True}


def test_runner_budgets_records_resume_and_pack(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "probe", _fake_probe)
    monkeypatch.setattr(runner, "PACK_MARGIN_S", 0.0)
    monkeypatch.setattr(runner, "TERM_GRACE_S", 2.0)
    (tmp_path / "runs" / "w").mkdir(parents=True)
    (tmp_path / "runs" / "w" / "ckpt").write_text("x")
    py = lambda code: ("-c", code)  # noqa: E731
    todo = [
        Stage("ok", py("print('measured')"), 60, 0.1, outputs=("runs/w",)),
        Stage("slow", py("import time; time.sleep(60)"), 1.5, 0.1),  # its own limit: timeout
        Stage("bad", py("import sys; sys.exit(3)"), 60, 0.1),
        Stage("huge", py("pass"), 60, 10_000),  # never fits: deferred, no record
        Stage("long", py("import time; time.sleep(60)"), 600, 0.1, resumable=True),  # the budget ends it: cut
    ]
    args = suite.parse_args(["--out", "o", "--pack", "pack", "--site", "site", "--wheels", "w", "--budget-s", "6"])
    assert runner.run(todo, args, [], validate=False) == 0
    state = json.loads((tmp_path / "o" / "suite.json").read_text())
    got = {k: v["status"] for k, v in state["stages"].items()}
    assert got == {"ok": "ok", "slow": "timeout", "bad": "failed", "long": "cut"}
    assert state["stages"]["bad"]["rc"] == 3 and "measured" in (tmp_path / "o" / "logs" / "ok.log").read_text()
    with tarfile.open(tmp_path / "pack" / "gpu-suite.tar.gz") as tar:
        names = tar.getnames()
    assert "o/suite.json" in names and "o/README.md" in names and "runs/w/ckpt" in names
    assert "| long | cut | " in (tmp_path / "pack" / "README.md").read_text()
    # again: only the cut stage runs (and --redo'ne ones)
    args = suite.parse_args(
        ["--out", "o", "--site", "site", "--wheels", "w", "--budget-s", "20", "--redo", "ok"],
        names=[s.name for s in todo],
    )
    todo[-1] = Stage("long", py("pass"), 600, 0.1, resumable=True)
    assert runner.run(todo, args, [], validate=False) == 0
    state = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert state["invocations"][-1]["ran"] == ["ok", "long"] and state["stages"]["long"]["status"] == "ok"


def test_records_name_no_machine_path(tmp_path, monkeypatch):
    """suite.json keeps its argv and the logs their tracebacks without the
    machine's paths: inside the checkout relative, elsewhere replaced."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "probe", _fake_probe)
    monkeypatch.setattr(runner, "PACK_MARGIN_S", 0.0)
    here = str(tmp_path.resolve())
    assert runner.portable("/somewhere/else/out", tmp_path) == runner.OUTSIDE
    assert runner.portable(f"--out={here}/o", tmp_path) == "--out=o" and runner.portable("o", tmp_path) == "o"
    code = "import os, torch; print(os.path.join(os.getcwd(), 'latte', 'ops', 'x.py'), torch.__file__)"
    args = suite.parse_args(["--out", "o", "--site", "site", "--wheels", "w", "--budget-s", "30"])
    assert (
        runner.run([Stage("p", ("-c", code), 60, 0.1)], args, ["--pack", str(tmp_path.parent / "out")], validate=False)
        == 0
    )
    state = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert state["invocations"][-1]["argv"] == ["--pack", runner.OUTSIDE]
    log = (tmp_path / "o" / "logs" / "p.log").read_text()
    assert "latte/ops/x.py" in log and here not in log
    assert "<site-packages>/torch/__init__.py" in log  # the interpreter's own packages, named, not located


def test_probe_names_the_interpreter_without_its_path():
    """The machine record says which Python and whether it is a virtual
    environment, never where it lives (suite.json is committed)."""
    found = machine.probe(dict(os.environ))
    assert found["executable"] == os.path.basename(sys.executable) and os.sep not in found["executable"]
    assert found["virtualenv"] is (sys.prefix != sys.base_prefix)
    assert sys.prefix not in json.dumps(found)


def test_runner_refuses_without_cuda(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "probe", lambda env: {**_fake_probe(env), "cuda_available": False})
    args = suite.parse_args(["--out", "o", "--site", "site", "--wheels", "w"])
    assert runner.run([Stage("x", ("-c", "pass"), 5, 1)], args, []) == 2
    state = json.loads((tmp_path / "o" / "suite.json").read_text())
    assert "no usable CUDA device" in state["invocations"][-1]["outcome"] and not state["stages"]


def _wheel(folder, dist, version="1.0"):
    mod = dist.replace("-", "_")
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{mod}/__init__.py", "VALUE = 42\n")
        di = f"{mod}-{version}.dist-info"
        z.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{di}/RECORD", "")
    return path


def test_missing_packages_install_from_wheels(tmp_path):
    whl = tmp_path / "whl"
    whl.mkdir()
    _wheel(whl, "latte-fake-one")
    rec = machine.install(["latte-fake-one", "latte-fake-absent"], whl, tmp_path / "site")
    assert rec["installed"] == ["latte_fake_one-1.0-py3-none-any.whl"] and rec["no_wheel"] == ["latte-fake-absent"]
    assert not rec["problems"], rec
    assert (tmp_path / "site" / "latte_fake_one" / "__init__.py").exists()
    _wheel(whl, "latte-fake-one", "2.0")
    _, problems = machine.wheels_for(["latte-fake-one"], whl)
    assert "keep one" in problems[0]
    machine._unzip(whl / "latte_fake_one-2.0-py3-none-any.whl", tmp_path / "site2")  # where pip is missing
    assert (tmp_path / "site2" / "latte_fake_one" / "__init__.py").exists()


def _ops_json(ratio_sdpa, ratio_gla, peak_top):
    rows = []
    for T in (1024, 16384, 131072):
        for p, ms, peak in (("latte-fla", 1.0, 100.0), ("sdpa", ratio_sdpa, 50.0), ("fla-gla", 1 / ratio_gla, 90.0)):
            peak = peak_top if (p, T) == ("latte-fla", 131072) else peak
            rows += [{"provider": p, "T": T, "mode": m, "median_ms": ms, "peak_mb": peak} for m in ("fwd", "fwdbwd")]
    return {"results": rows}


def test_targets_met_and_missed_with_their_figures(tmp_path):
    (tmp_path / "ops-cuda-bfloat16.json").write_text(json.dumps(_ops_json(3.5, 1.4, 110.0)))
    junit = '<testsuite tests="3" failures="1" errors="0" skipped="1"><testcase classname="t" name="a"/>'
    junit += '<testcase classname="t" name="b"><failure message="boom"/></testcase></testsuite>'
    (tmp_path / "tests-tf32.xml").write_text(junit)
    rows = {r["target"].split(",")[0][:40]: r for r in targets.targets(tmp_path)}
    status = [r["status"] for r in targets.targets(tmp_path)]
    assert status == ["missed", "not measured", "not measured", "not measured", "met", "missed", "missed", "met",
                      "not measured"]  # fmt: skip
    assert any("3.50x" in r["figure"] for r in rows.values())
    assert any("worst 1.40x" in r["figure"] for r in rows.values())
    assert any("110 / 100 MiB = 1.10 at T=131,072" in r["figure"] for r in rows.values())
    assert any("1 passed, 1 failed, 1 skipped" in r["figure"] for r in rows.values())


def test_check_and_report_regenerate_from_json(tmp_path, monkeypatch):
    """latte bench check on CPU, fla's path on fla-core's pure-torch kernels
    (as tests/ops/test_gla_backend.py): errors recorded; then every table of
    the folder rewritten from its JSON gives the same table."""
    pytest.importorskip("fla")
    from latte.ops import backend as BK
    from latte.ops.latte import gla
    from tests.ops.test_gla_backend import fla_naive

    monkeypatch.setattr(BK, "_fla_error", lambda x: None)
    monkeypatch.setattr(gla, "_kernels", fla_naive)
    with runner.claim_folder(tmp_path, runner.SUITE_WRITER) as folder:
        runner.save_state(folder, {"stages": {}, "invocations": []})
    res = cuda_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    rows = {(r["dist"], r["path"], r["dtype"]): r for r in res["results"]}
    assert len(rows) == 12 and not any(r.get("skipped") for r in rows.values())
    for dist in cuda_check.DISTS:
        assert rows[(dist, "fla", "float32")]["forward"] < 1e-4 and rows[(dist, "torch", "float32")]["grad_b"] < 1e-4
        assert rows[(dist, "fla", "float32")]["decode_vs_forward"] < 1e-4
        assert rows[(dist, "fla", "bfloat16")]["forward"] < 5e-2
        # the bfloat16 floor: rounding the inputs alone costs far more than float32 arithmetic,
        # and the bfloat16 path (pure-torch kernels here) stays within 2x of it
        floor, bf16 = rows[(dist, "rounding", "bfloat16")], rows[(dist, "fla", "bfloat16")]
        assert floor["forward"] > 100 * rows[(dist, "fla", "float32")]["forward"]
        assert bf16["forward"] < 2 * floor["forward"]
    fig = next(t["figure"] for t in targets._check_target(res) if "bfloat16: forward" in t["target"])
    assert "rounding of the inputs alone: forward" in fig and "the floor of its case" in fig
    before = (tmp_path / "check-cpu.md").read_text()
    (tmp_path / "check-cpu.md").write_text("stale")
    written = report.regenerate(tmp_path)
    assert (tmp_path / "check-cpu.md").read_text() == before and tmp_path / "README.md" in written


def test_bench_device_cuda_without_a_gpu_says_why(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert cli.main(["bench", "check", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: torch.cuda.is_available() is False" in err and "--device cpu" in err
    assert suite.main(["--dry-run", "--stages", "check", "--wheels", str(tmp_path)]) == 0
