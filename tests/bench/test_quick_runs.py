"""`--quick` runs of every benchmark write well-formed results: machine info,
every provider present at every scheduled point or explicitly skipped with a
reason. Nothing here looks at a time (STYLE.md habits 10, 11)."""

import importlib.util
import json

import pytest

from latte.bench import common, decode, ops, providers, train

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
FAST = ["--quick", "--threads", "1", "--warmup", "0"]


def _check_machine(res, threads=1):
    m = res["machine"]
    for key in ("platform", "cpu_model", "cpu_count", "torch", "threads", "loadavg_end"):
        assert key in m
    assert m["threads"] == res["config"]["threads"] == threads
    assert res["config"]["dtype"] == "float32"


def _check_point(r):
    if r.get("skipped"):
        assert isinstance(r["reason"], str) and r["reason"]
    else:
        assert r["median_ms"] >= r["min_ms"] > 0
        assert r.get("repeats", r.get("tokens")) >= 5


def _check_files(tmp_path, name, capsys):
    res = json.loads((tmp_path / f"{name}.json").read_text())
    assert (tmp_path / f"{name}.md").read_text().startswith(f"# latte bench {name}")
    if HAS_MPL:
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    else:
        assert "matplotlib is not installed" in capsys.readouterr().out
    return res


@pytest.mark.slow
def test_ops_quick(tmp_path, capsys):
    # a tiny naive-softmax cap: T=32 runs, T=64 is recorded as skipped
    ops.main(FAST + ["--out", str(tmp_path), "--naive-mem-cap-gb", "0.0002", "--no-memory"])
    res = _check_files(tmp_path, "ops", capsys)
    _check_machine(res)
    assert res["ceiling"]["gflops_median"] > 0
    assert set(res["config"]["T"]) == set(providers.PROVIDERS)
    got = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    for p, ts in res["config"]["T"].items():
        for T in ts:
            for mode in ops.MODES:
                _check_point(got[(p, T, mode)])
    assert got[("naive-softmax", 64, "fwd")]["skipped"]
    assert not got[("naive-softmax", 32, "fwd")].get("skipped")
    assert not got[("paper-scan", 32, "fwdbwd")].get("skipped")
    assert "32" in res["ratios"]["sdpa/latte fwdbwd"]
    assert res["rglru"]["loop_over_chunked_fwd"] > 0


def test_memory_worker_measures_a_point(monkeypatch):
    # as in a real `latte bench` run: the worker must still use glibc's
    # defaults (with latte.allocator.tune freed memory stays resident, and
    # every peak would read 0 after a larger point in the same worker)
    monkeypatch.delenv("LATTE_MALLOC", raising=False)
    pts = [{"provider": "latte", "T": T, "mode": "fwdbwd"} for T in (1024, 256)]
    big, m = common.memory_points("latte.bench.providers:build", pts, threads=1)
    assert m["provider"] == "latte" and m["T"] == 256
    if m.get("note") != "needs Linux /proc":
        assert big["peak_mb"] > m["peak_mb"] > 0  # at least the gradients of the inputs


def test_time_call_cap_records_a_skip():
    t = common.time_call(lambda: sum(range(10000)), repeats=5, warmup=1, cap_s=1e-9)
    assert t["skipped"] and "cap" in t["reason"]
    with pytest.raises(ValueError, match="repeats"):
        common.time_call(lambda: None, repeats=3)


@pytest.mark.slow
def test_decode_quick(tmp_path, capsys):
    # a tiny prefill cap: each mixer's first context runs, the second is skipped
    decode.main(FAST + ["--out", str(tmp_path), "--prefill-cap", "1e-9"])
    res = _check_files(tmp_path, "decode", capsys)
    _check_machine(res)
    assert set(res["mixers"]) == set(decode.MIXERS)
    got = {(r["mixer"], r["context"]): r for r in res["results"]}
    for m in decode.MIXERS:
        first, second = (got[(m, c)] for c in res["config"]["contexts"])
        _check_point(first)
        assert first["state_bytes"] > 0 and first["tokens"] == res["config"]["tokens"]
        assert second["skipped"] and "cap" in second["reason"]


@pytest.mark.slow
def test_train_quick(tmp_path, capsys):
    train.main(FAST + ["--out", str(tmp_path), "--seqs", "32"])
    res = _check_files(tmp_path, "train", capsys)
    _check_machine(res)
    got = {(r["mixer"], r["seq"]): r for r in res["results"]}
    for m in train.MIXERS:
        r = got[(m, 32)]
        _check_point(r)
        assert r["tokens_per_s"] > 0 and r["batch"] * 32 == r["tokens_per_step"]


@pytest.mark.slow
def test_window_quick(tmp_path, capsys):
    """CPU: the tiles kernel forward and forward+backward, compiled flex
    forward (one compile), flex forward+backward recorded as unavailable."""
    from latte.bench import window

    window.main(FAST + ["--out", str(tmp_path)])
    res = _check_files(tmp_path, "window", capsys)
    _check_machine(res)
    got = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    for T in res["config"]["seqs"]:
        for p, mode in (("tiles", "fwd"), ("tiles", "fwdbwd"), ("flex", "fwd")):
            _check_point(got[(p, T, mode)])
        assert got[("flex", T, "fwdbwd")]["skipped"]
        assert got[("flex", T, "fwd")]["max_abs_diff_vs_tiles"] < 1e-4  # the same attention


def test_device_options_fail_clearly_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for mod in (ops, train, decode):
        with pytest.raises(SystemExit, match="--device cuda: torch.cuda.is_available"):
            mod.main(FAST + ["--device", "cuda", "--out", "unused"])
    with pytest.raises(SystemExit):  # argparse: the CPU runs are float32 only
        ops.parse_args(["--dtype", "bfloat16"])
    assert ops.parse_args(["--device", "cuda"]).providers == list(ops.CUDA_PROVIDERS)


@pytest.mark.slow
def test_train_compile_and_sweep_preset(tmp_path):
    """--compile adds a compiled twin of each variant and the eager/compiled
    ratio; a mixer may name its qk mixer; the sweep preset is the MQAR size."""
    res = train.main(FAST + ["--out", str(tmp_path), "--mixers", "softmax", "--seqs", "32", "--compile"])
    assert res["config"]["mixers"] == ["softmax", "softmax compiled"]
    for r in res["results"]:
        _check_point(r)
    assert res["ratios"]["over_softmax"]["32"] == {"softmax": 1.0, "softmax compiled": 1.0}
    assert set(res["ratios"]["eager_over_compiled"]["32"]) == {"softmax"}
    assert [r["compile_s"] > 0 for r in res["results"] if r["compiled"]] == [True]
    args = train.parse_args(["--preset", "sweep", "--mixers", "latte:none,linear", "--compile"])
    assert args.seqs == [64] and args.tokens_per_step // 64 == 64  # batch 64
    assert [train.label_of(*v) for v in train.variants(args)] == [
        "latte:none", "latte:none compiled", "linear", "linear compiled"]
    cfg = train.make_config("macchiato:conv", False, 64, "sweep")
    assert (cfg.dim, cfg.num_layers, cfg.vocab_size, cfg.qk_mixer, cfg.window_size) == (64, 2, 8192, "conv", 16)


def test_cuda_ops_plumbing_runs_on_cpu(tmp_path, monkeypatch):
    """latte bench ops --device cuda with its device swapped for the CPU: every
    provider is timed or recorded as unavailable (fla's need CUDA), and the
    markdown is written. The CUDA numbers themselves need a GPU."""
    from latte.bench import cuda

    monkeypatch.setattr(cuda, "DEVICE", "cpu")
    monkeypatch.setattr(cuda, "FULL_T", [16])
    args = ops.parse_args(["--device", "cuda", "--repeats", "5", "--warmup", "0", "--out", str(tmp_path)])
    args.dtype = "float32"  # CPU SDPA and the torch kernels
    res = cuda.main_ops(args)
    got = {(r["provider"], r["mode"]): r for r in res["results"]}
    assert set(got) == {(p, m) for p in cuda.PROVIDERS for m in cuda.MODES}
    for p in ("latte", "macchiato", "sdpa"):
        _check_point(got[(p, "fwdbwd")])
    for p in ("latte-fla", "fla-gla", "macchiato-fla"):
        assert got[(p, "fwd")]["skipped"] and "unavailable" in got[(p, "fwd")]["reason"]
    assert (tmp_path / "ops-cuda.md").read_text().startswith("# latte bench ops --device cuda")
