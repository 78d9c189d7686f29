"""`--quick` runs of every benchmark write well-formed results: machine info,
every provider present at every scheduled point or explicitly skipped with a
reason. Nothing here looks at a time (tests never assert on time)."""

import json

import pytest
import torch

from latte.bench import common, decode, fixed_shapes, ops, providers
from tests.bench.quick_checks import FAST
from tests.bench.quick_checks import check_files as _check_files
from tests.bench.quick_checks import check_machine as _check_machine
from tests.bench.quick_checks import check_point as _check_point


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
    # Macchiato's window and mix phases, their own provider, over softmax attention
    first = {(r["provider"], r["T"], r["mode"]): r for r in res["results"] if r["dist"] == "std1"}
    for mode in ops.MODES:
        ratio = res["ratios"][f"macchiato-window-mix/sdpa {mode}"]["32"]
        want = first[("macchiato-window-mix", 32, mode)]["median_ms"] / first[("sdpa", 32, mode)]["median_ms"]
        assert ratio == pytest.approx(want)
    assert "macchiato-window-mix/sdpa" in (tmp_path / "ops.md").read_text()
    assert res["rglru"]["loop_over_chunked_fwd"] > 0
    # the key-logit distributions side by side, and the tables by distribution
    assert res["config"]["dists"] == ["std1", "std10"]
    by = {(r["provider"], r["T"], r["mode"], r["dist"]) for r in res["results"] if not r.get("skipped")}
    for p in ops.DIST_PROVIDERS:
        assert {(p, 32, "fwdbwd", d) for d in ("std1", "std10")} <= by
    assert ("naive-softmax", 32, "fwd", "std10") not in by
    sw = {(r["provider"], r["dist"], r["mode"]) for r in res["sweep_shape"]}
    assert sw == {(p, d, m) for p in fixed_shapes.SWEEP_PROVIDERS for d in ("std1", "std10") for m in ops.MODES}
    rows = res["causal_by_distribution"]
    assert [r["name"] for r in rows] == list(fixed_shapes.QUICK_CAUSAL_SHAPES)
    assert set(rows[0]["median_ms"]) == set(fixed_shapes.CAUSAL_DISTS) and rows[0]["max_over_min"] >= 1


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
        assert first["static_median_ms"] > 0 and first["static_captured"] is False  # the static step, on the CPU
        assert second["skipped"] and "cap" in second["reason"]


def test_decode_prefill_time_leaves_out_first_call_costs(monkeypatch):
    """A kernel's first call (fla's Triton compile on a GPU) is paid before the
    timed prefill: otherwise it inflates the per-token rate, and the longer
    contexts are skipped by a prediction they would never take. A fake model
    on a fake clock: its first two calls cost 100 s, then 1 ms a token."""
    import contextlib
    import types

    clock, calls = [0.0], []

    class SlowFirstCall:
        config = types.SimpleNamespace(vocab_size=11)

        def __call__(self, ids, state=None, use_cache=True):
            calls.append(ids.shape[1])
            clock[0] += 100.0 if len(calls) <= 2 else 1e-3 * ids.shape[1]
            return types.SimpleNamespace(state=(state or 0) + ids.shape[1])

    monkeypatch.setattr(decode, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    args = types.SimpleNamespace(device="cpu", prefill_chunk=8, contexts=[8, 32], prefill_cap=1.0)
    gen = torch.Generator().manual_seed(0)
    saved, recs = decode._prefill_contexts(SlowFirstCall(), args, contextlib.nullcontext(), gen, "m", False)
    assert calls == [8, 8, 8, 8, 8, 8]  # two warm-up chunks, then 8 + 24 tokens in chunks of 8
    assert recs[8]["prefill_s"] == pytest.approx(0.008) and recs[32]["prefill_s"] == pytest.approx(0.024)
    assert saved[32] == 32  # the kept state holds the measured tokens only


def test_device_options_fail_clearly_without_a_gpu():

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for mod in (ops, decode):  # benchmarks/train.py: tests/benchmarks
        with pytest.raises(SystemExit, match="--device cuda: torch.cuda.is_available"):
            mod.main(FAST + ["--device", "cuda", "--out", "unused"])
    with pytest.raises(SystemExit):  # argparse: the CPU runs are float32 only
        ops.parse_args(["--dtype", "bfloat16"])
    assert ops.parse_args(["--device", "cuda"]).providers == list(ops.CUDA_PROVIDERS)


def test_cuda_ops_plumbing_runs_on_cpu(tmp_path, monkeypatch):
    """latte bench ops --device cuda with its device swapped for the CPU: every
    provider is timed or recorded as unavailable (fla's need CUDA), batch x T
    stays constant, and the files are written. The CUDA numbers need a GPU."""
    from latte.bench import cuda

    monkeypatch.setattr(cuda, "DEVICE", "cpu")
    argv = ["--device", "cuda", "--quick", "--repeats", "5", "--warmup", "0", "--out", str(tmp_path)]
    args = ops.parse_args(argv + ["--seqs", "32,64", "--macchiato-seqs", "64", "--tokens", "128"])
    assert (args.heads, args.latents, args.dv, args.tokens) == (2, 16, 16, 128)
    args.dtype = "float32"  # CPU SDPA and the torch kernels
    res = cuda.main_ops(args)
    got = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    want = {(p, T, m) for p in cuda.PROVIDERS for T in (32, 64) for m in cuda.MODES}
    assert set(got) == want - {(p, 32, m) for p in cuda.FLEX for m in cuda.MODES}
    assert {(r["T"], r["B"]) for r in res["results"]} == {(32, 4), (64, 2)}
    for p in ("latte", "macchiato", "macchiato-window-mix", "sdpa"):
        _check_point(got[(p, 64, "fwdbwd")])
    want = got[("macchiato-window-mix", 64, "fwdbwd")]["median_ms"] / got[("sdpa", 64, "fwdbwd")]["median_ms"]
    assert res["ratios"]["fwdbwd"]["64"]["macchiato-window-mix/sdpa"] == pytest.approx(want)
    flas = ("latte-fla", "latte-fla-compiled", "latte-fla-fused", "fla-gla", "fla-gate", "macchiato-fla")
    for p in (*flas, "macchiato-fla-window-mix"):
        assert got[(p, 64, "fwd")]["skipped"] and "unavailable" in got[(p, 64, "fwd")]["reason"]
    from latte.ops import backend

    assert backend._construction is None  # the compiled provider's failed call left the choice as it was: unset
    assert (tmp_path / "ops-cuda-float32.md").read_text().startswith("# latte bench ops --device cuda (float32")
    assert "sdpa/latte-fla" not in json.dumps(res["ratios"])  # nothing to divide by on CPU


def test_cuda_latte_providers_pin_their_construction(monkeypatch):
    """latte-fla times the eager construction and latte-fla-compiled the
    compiled one whatever is in force around them, so that their ratio compares
    the two; the choice in force is the same afterwards."""
    from latte.bench import cuda
    from latte.ops import backend as choice

    seen = []

    def fake_latte_causal(a, b, v, chunk_size, backend):
        seen.append((backend, choice.get_fla_construction()))
        return (v,)

    monkeypatch.setattr(cuda, "DEVICE", "cpu")
    monkeypatch.setattr(cuda, "latte_causal", fake_latte_causal)
    for around in ("eager", "compiled"):
        with choice.using_fla_construction(around):
            for p in ("latte", "latte-fla", "latte-fla-compiled", "latte-fla-fused"):
                inputs, fn = cuda.make_inputs(p, 8, torch.float32, 1, (2, 4, 4))
                fn(*inputs)
            assert choice.get_fla_construction() == around
        assert seen == [("torch", around), ("fla", "eager"), ("fla", "compiled"), ("fla", "fused")]
        seen.clear()
    assert choice._construction is None


def test_cuda_ops_options_are_checked():
    with pytest.raises(SystemExit):  # the CUDA sweep's options on the CPU run
        ops.parse_args(["--seqs", "1024"])
    for bad in (["--seqs", "0"], ["--seqs", "1k"], ["--tokens", "0"], ["--point-cap", "0"]):
        with pytest.raises(SystemExit):
            ops.parse_args(["--device", "cuda", *bad])
    args = ops.parse_args(["--device", "cuda"])
    from latte.bench import cuda

    pts = cuda.plan(args)
    assert {p["T"] * p["B"] for p in pts} == {131072} and max(p["T"] for p in pts) == 131072
    assert {p["T"] for p in pts if p["provider"] == "macchiato-fla"} == set(cuda.MACCHIATO_T)


def test_the_window_mix_provider_is_macchiato_beyond_its_latent_phase():
    # providers.macchiato_window_mix on latte's output is the whole Macchiato call
    from latte.ops import latte_causal, macchiato

    g = torch.Generator().manual_seed(0)
    a, b, v, q, k = (torch.randn(2, 40, 3, n, generator=g, dtype=torch.float64) for n in (4, 4, 5, 5, 5))
    y_lat = latte_causal(a, b, v, chunk_size=8)[0]
    got = providers.macchiato_window_mix(a, v, q, k, y_lat, window=6, chunk=8)
    want = macchiato(a, b, v, q, k, window_size=6, chunk_size=8)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
