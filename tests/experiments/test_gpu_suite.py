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

from experiments.gpu_suite import dryrun, kernels, machine, report, runner, targets
from experiments.gpu_suite import stages as suite
from experiments.gpu_suite.stages import Stage
from latte import cli
from latte.bench import cuda_check


def test_dry_run_checks_every_stage(capsys):
    assert suite.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    for s in suite.stages():
        assert f"] {s.name}" in out
    assert "152 points, T 1024..131072, batch x T 131072" in out  # the bf16 CUDA sweep, window+mix included
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


def _ops_json(over_gla, flash, peak):
    """bench ops rows: latte-fla over fla-gla by over_gla, sdpa over latte-fla by flash, peak memory ratio."""
    rows = []
    for T in (4096, 16384, 65536):
        for p, ms, mb in (("latte-fla", 1.0, peak * 100), ("fla-gla", 1 / over_gla, 100.0), ("sdpa", flash, 50.0)):
            rows += [{"provider": p, "T": T, "mode": m, "median_ms": ms, "peak_mb": mb} for m in ("fwd", "fwdbwd")]
    return {"results": rows}


def _decode_json(ms_short, ms_long):
    rows = [
        {"mixer": mx, "context": c, "static_median_ms": ms, "static_captured": True, "median_ms": 9.0}
        for mx in ("latte[fla]", "macchiato[fla]", "softmax")
        for c, ms in ((1024, ms_short), (131072, ms_long))
    ]
    return {"results": rows}


def test_targets_met_and_missed_with_their_figures(tmp_path):
    """Issue 56's targets from the loan's files: met, missed or not measured, with their figures."""
    (tmp_path / "ops-cuda-bfloat16.json").write_text(json.dumps(_ops_json(1.1, 3.0, 1.5)))
    (tmp_path / "decode-cuda.json").write_text(json.dumps(_decode_json(0.8, 0.85)))
    train = {"ratios": {"over_softmax": {"4096": {"latte[fla]": 1.05, "macchiato[fla]": 1.4}}}}
    (tmp_path / "train-cuda.json").write_text(json.dumps(train))
    junit = '<testsuite tests="2" failures="0" errors="0" skipped="0"><testcase classname="t" name="a"/></testsuite>'
    for name in targets.TEST_FILES:
        (tmp_path / name).write_text(junit)
    stages = {n: {"status": "ok", "wall_s": 70.0, "kernels": "cold"} for n in ("loan-tests", "loan-tests-compile")}
    (tmp_path / "suite.json").write_text(json.dumps({"stages": stages, "invocations": []}))
    rows = {r["target"]: r for r in targets.targets(tmp_path)}
    got = {name.split(":")[0]: (r["status"], r["figure"]) for name, r in rows.items()}
    assert got["tests/gpu all pass, kernel cache cold"] == ("met", "140 s, 4 passed, 0 failed")
    assert got["tests/gpu all pass, kernel cache warm"][0] == "not measured"
    assert got["latte (fla) / chunk_gla, forward+backward, bfloat16"] == ("met", "1.10 at 4K, 1.10 at 16K, 1.10 at 64K")
    assert got["FlashAttention / latte (fla), forward+backward"] == ("missed", "3.00 at 16K, 3.00 at 64K")
    assert (
        got["peak extra memory, forward+backward"][0] == "missed"
        and "1.50 at T=4,096" in rows[next(n for n in rows if n.startswith("peak"))]["figure"]
    )
    latte = got["decode, latte, captured step, Table 6 model, batch 1"]
    assert latte[0] == "met" and "0.80 ms at 1,024, 0.85 ms at 131,072 (1.06x)" in latte[1]
    assert "softmax's static KV cache" in latte[1]
    eager = [v for k, v in got.items() if k.startswith("training tokens/s")]
    assert eager == [("met", "0.95"), ("missed", "0.71")]
    (tmp_path / "decode-cuda.json").write_text(json.dumps(_decode_json(0.8, 1.2)))  # not flat, over 1 ms
    assert {r["status"] for r in targets._decode_targets(_decode_json(0.8, 1.2))} == {"missed"}


def test_targets_from_part_of_the_lengths():
    """A loan that measured only some T: a measured miss is a miss, a
    measured pass with T left is not measured; the figure names the T left."""
    ops = _ops_json(1.1, 3.0, 1.0)
    short = {"results": [r for r in ops["results"] if r["T"] == 4096]}
    fig, met = targets._partial({4096: 1.1, 16384: None, 65536: None}, lambda T, v: v <= 1.15)
    assert (fig, met) == ("1.10 at 4K (16K, 64K: -)", None)
    assert targets._partial({4096: 2.4, 16384: None}, lambda T, v: v <= 1.15) == ("2.40 at 4K (16K: -)", False)
    rows = {r["target"].split(":")[0]: r for r in targets._gla_targets(short)}
    assert rows["latte (fla) / chunk_gla, forward+backward, bfloat16"]["status"] == "not measured"
    slow = {"results": [dict(r, median_ms=3.0) if r["provider"] == "latte-fla" else r for r in short["results"]]}
    rows = {r["target"].split(":")[0]: r for r in targets._gla_targets(slow)}
    assert rows["latte (fla) / chunk_gla, forward, bfloat16"] == {
        "target": rows["latte (fla) / chunk_gla, forward, bfloat16"]["target"],
        "figure": "3.30 at 4K (16K, 64K: -)",
        "status": "missed",
    }


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


LOAN = ["loan-ops", "loan-decode", "loan-train", "loan-tests", "loan-tests-compile"]


def test_loan_runs_in_priority_order_and_fits_one_loan(capsys, tmp_path):
    """--loan: ops, decode (synthetic states to 128K), train, then tests/gpu
    (fast files first, the compile-heavy one last); the dry run passes and
    its estimate holds the machine's start, the call and a rerun within 15
    minutes; a budget the stages do not fit is a problem (exit 2)."""
    args = suite.parse_args(["--loan"])
    todo = suite.selected(args)
    assert [s.name for s in todo] == LOAN and args.budget_s == suite.LOAN_BUDGET_S
    decode = todo[1].argv
    assert "--synthetic-state" in decode and "1024,16384,131072" in decode
    assert f"--ignore={suite.COMPILE_TESTS}" in todo[3].argv and todo[4].argv[-2] == suite.COMPILE_TESTS
    assert all(dict(s.env)["TRITON_CACHE_DIR"] == "{kernels}/triton" for s in todo)
    assert suite.main(["--loan", "--dry-run", "--wheels", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    fits, total, lines = suite.loan_fit(todo, args.budget_s, runner.PACK_MARGIN_S)
    assert (
        fits and f"= {total:g} s of 900 s" in lines[-1] and lines[-1] in out and total <= suite.LOAN_S - 60
    )  # a minute to spare at least
    assert "dry run: every command checked" in out
    assert suite.main(["--loan", "--dry-run", "--budget-s", "200", "--wheels", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        suite.parse_args(["--loan", "--first-run"])
    with pytest.raises(SystemExit):
        suite.parse_args(["--kernels-from", str(tmp_path)])  # only with --loan


def test_compile_heavy_tests_apart():
    """tests/gpu: no torch.compile in the fast file, the compile-heavy file
    collected by the loan's last stage only; each file says what it is."""
    from tests.gpu import test_cuda, test_cuda_compile

    assert "torch.compile(" not in open(test_cuda.__file__).read()
    assert "torch.compile(" in open(test_cuda_compile.__file__).read()
    for mod in (test_cuda, test_cuda_compile):
        assert len(mod.__doc__.split()) > 20
    problems, detail = dryrun.check_stage(suite.loan()[3])
    assert not problems and detail == "1 test files"


HERE = {"gpu": "NVIDIA H200", "triton": "3.6.0", "torch": "2.11.0"}


def test_kernel_cache_rule():
    """A cache is carried in only when GPU, Triton and torch match, and never without its record."""
    assert kernels.mismatch(dict(HERE), HERE) is None
    assert "gpu 'NVIDIA H100" in kernels.mismatch({**HERE, "gpu": "NVIDIA H100 80GB HBM3"}, HERE)
    assert "triton '3.5.1' there" in kernels.mismatch({**HERE, "triton": "3.5.1"}, HERE)
    assert "torch" in kernels.mismatch({**HERE, "torch": "2.10.0"}, HERE)
    assert "no kernel-cache.json" in kernels.mismatch(None, HERE)
    assert "unknown" in kernels.mismatch(dict(HERE), {**HERE, "gpu": None})


def _probe_of(gpu, triton="3.6.0"):
    def probe(env):
        found = _fake_probe(env)
        found["packages"]["triton"]["version"], found["packages"]["torch"]["version"] = triton, "2.11.0"
        return {**found, "gpu_name": gpu}

    return probe


def test_kernel_cache_goes_back_and_comes_in_on_a_match(tmp_path, monkeypatch):
    """The stages compile under --pack (returned); the next invocation given
    it carries it in only on the same GPU and Triton, else starts cold."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "PACK_MARGIN_S", 0.0)
    code = (
        "import os, pathlib; d = pathlib.Path(os.environ['TRITON_CACHE_DIR']); "
        "print('seen', sorted(p.name for p in d.glob('*'))); d.mkdir(parents=True, exist_ok=True); "
        "(d / 'kernel.cubin').write_text('x')"
    )
    todo = [Stage("k", ("-c", code), 60, 0.1, env=(("TRITON_CACHE_DIR", "{kernels}/triton"),))]

    def loan(pack, gpu, triton="3.6.0", carried=None):
        monkeypatch.setattr(machine, "probe", _probe_of(gpu, triton))
        argv = ["--loan", "--out", f"o-{pack}", "--pack", pack, "--site", "s", "--wheels", "w", "--budget-s", "60"]
        args = suite.parse_args(argv + (["--kernels-from", carried] if carried else []), names=["k"])
        assert runner.run(todo, args, [], validate=False) == 0
        state = json.loads((tmp_path / f"o-{pack}" / "suite.json").read_text())
        return state, (tmp_path / f"o-{pack}" / "logs" / "k.log").read_text()

    state, log = loan("p1", "NVIDIA H200")
    assert "seen []" in log and state["stages"]["k"]["kernels"] == "cold"
    assert (tmp_path / "p1" / "kernel-cache" / "triton" / "kernel.cubin").exists()
    assert json.loads((tmp_path / "p1" / "kernel-cache.json").read_text())["gpu"] == "NVIDIA H200"
    state, log = loan("p2", "NVIDIA H200", carried="p1")
    assert "seen ['kernel.cubin']" in log and state["stages"]["k"]["kernels"] == "carried in"
    assert state["invocations"][-1]["kernels"]["carried_in"]
    for gpu, triton in (("NVIDIA H100 80GB HBM3", "3.6.0"), ("NVIDIA H200", "3.5.1")):
        pack = f"p-{triton}-{gpu[-4:]}"
        state, log = loan(pack, gpu, triton, carried="p1")
        assert "seen []" in log and state["stages"]["k"]["kernels"] == "cold"
        assert "there" in state["invocations"][-1]["kernels"]["reason"]


def test_decode_from_synthetic_states(tmp_path, monkeypatch):
    """bench decode --synthetic-state: each context's state at its shape and
    position without a prefill (the record says the values do not matter),
    the static step timed; a context whose states would not fit the free
    memory is skipped with the estimate."""
    from latte.bench import decode

    res = decode.main(["--quick", "--synthetic-state", "--contexts", "64,2048", "--out", str(tmp_path / "a")])
    assert "not on its values" in res["config"]["state"]
    rows = {(r["mixer"], r["context"]): r for r in res["results"]}
    assert len(rows) == 6 and all(r["state"] == "synthetic" and r["static_median_ms"] > 0 for r in rows.values())
    soft = rows[("softmax", 2048)]
    assert soft["state_bytes"] > 20 * rows[("softmax", 64)]["state_bytes"] > 0
    assert rows[("latte", 2048)]["state_bytes"] == rows[("latte", 64)]["state_bytes"]
    monkeypatch.setattr(decode, "free_bytes", lambda dev: 2**20)  # 1 MiB free: softmax's 2K cache does not fit
    res = decode.main(["--quick", "--synthetic-state", "--contexts", "64,2048", "--out", str(tmp_path / "b")])
    rows = {(r["mixer"], r["context"]): r for r in res["results"]}
    assert "estimated at" in rows[("softmax", 2048)]["reason"] and not rows[("softmax", 64)].get("skipped")
    assert not rows[("latte", 2048)].get("skipped")
