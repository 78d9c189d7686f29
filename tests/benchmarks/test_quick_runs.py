"""`--quick` runs of the repository's benchmarks (benchmarks/) write
well-formed results, as tests/bench checks the library's. Nothing here looks
at a time (tests never assert on time)."""

import json

import pytest
import torch

from benchmarks import audit, train
from latte.guard import MARKER
from latte.ops import distributions
from tests.bench.quick_checks import FAST
from tests.bench.quick_checks import check_files as _check_files
from tests.bench.quick_checks import check_machine as _check_machine
from tests.bench.quick_checks import check_point as _check_point


@pytest.mark.slow
def test_audit_quick(tmp_path, capsys):
    audit.main(FAST + ["--out", str(tmp_path)])
    res = _check_files(tmp_path, "audit", capsys)
    _check_machine(res)
    assert {r["name"] for r in res["results"]} == {
        "latte_causal",
        "macchiato",
        "sliding_window",
        "linear_recurrence",
        "linear_cross_entropy",
        "latte_bidirectional",
        "decode steps",
    }
    for r in res["results"]:
        assert set(r["median_ms"]) == set(distributions.DISTRIBUTIONS)
        assert r["max_over_min"] >= 1 and r["within_rule"] == (r["max_over_min"] <= audit.RULE)
        for t in r["times"].values():
            _check_point(t)


@pytest.mark.slow
def test_train_quick(tmp_path, capsys):
    train.main(FAST + ["--out", str(tmp_path), "--seqs", "32"])
    res = _check_files(tmp_path, "train", capsys)
    _check_machine(res)
    got = {(r["label"], r["seq"]): r for r in res["results"]}
    for m in train.MIXERS + tuple(f"{m} (b std10)" for m in train.LATENT):
        r = got[(m, 32)]
        _check_point(r)
        assert r["tokens_per_s"] > 0 and r["batch"] * 32 == r["tokens_per_step"]


@pytest.mark.slow
def test_window_quick(tmp_path, capsys):
    """CPU: the tiles kernel forward and forward+backward, compiled flex
    forward (one compile), flex forward+backward recorded as unavailable."""
    from benchmarks import window

    window.main(FAST + ["--out", str(tmp_path)])
    res = _check_files(tmp_path, "window", capsys)
    _check_machine(res)
    got = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    for T in res["config"]["seqs"]:
        for p, mode in (("tiles", "fwd"), ("tiles", "fwdbwd"), ("flex", "fwd")):
            _check_point(got[(p, T, mode)])
        assert got[("flex", T, "fwdbwd")]["skipped"]
        assert got[("flex", T, "fwd")]["max_abs_diff_vs_tiles"] < 1e-4  # the same attention


def test_distill_quick(tmp_path, capsys):
    """Both providers timed and measured at every N; the chunked objective
    agrees with the whole logits (the float64 proof is in
    tests/convert/test_distill.py); 300 tokens spans two chunks."""
    from benchmarks import distill

    distill.main(FAST + ["--out", str(tmp_path), "--tokens", "48,300"])
    res = _check_files(tmp_path, "distill", capsys)
    _check_machine(res)
    got = {(r["provider"], r["tokens"]): r for r in res["results"]}
    assert set(got) == {(p, n) for p in distill.PROVIDERS for n in (48, 300)}
    for r in got.values():
        _check_point(r)
        assert r["peak_mb"] is None or r["peak_mb"] >= 0
    for n in (48, 300):
        chunked = got[("chunked", n)]
        assert chunked["loss_rel_diff"] < 1e-5
        assert chunked["grad_max_abs_diff"] < 1e-4 * chunked["grad_max_abs"]
    with pytest.raises(ValueError, match="provider: expected one of"):
        distill.build("dense", 4, 8, 16)


@pytest.mark.slow
def test_train_compile_and_sweep_preset(tmp_path):
    """--compile adds a compiled twin of each variant and the eager/compiled
    ratio; a mixer may name its qk mixer; the sweep preset is the MQAR size."""
    res = train.main(FAST + ["--out", str(tmp_path), "--mixers", "softmax", "--seqs", "32", "--compile"])
    assert res["config"]["variants"] == ["softmax", "softmax compiled"]
    for r in res["results"]:
        _check_point(r)
    assert res["ratios"]["over_softmax"]["32"] == {"softmax": 1.0, "softmax compiled": 1.0}
    assert set(res["ratios"]["eager_over_compiled"]["32"]) == {"softmax"}
    assert [r["compile_s"] > 0 for r in res["results"] if r["compiled"]] == [True]
    args = train.parse_args(["--preset", "sweep", "--mixers", "latte:none,linear", "--compile", "--sizes", "v8192"])
    assert args.seqs == [64] and args.tokens_per_step // 64 == 64  # batch 64
    assert [train.label_of(m, d, args.dists, b, c, z) for m, d, b, c, z in train.variants(args)] == [
        "latte:none",
        "latte:none compiled",
        "latte:none (b std10)",
        "latte:none (b std10) compiled",
        "linear",
        "linear compiled",
    ]
    cfg = train.make_config("macchiato:conv", False, 64, "sweep")
    assert (cfg.dim, cfg.num_layers, cfg.vocab_size, cfg.qk_mixer, cfg.window_size) == (64, 2, 8192, "conv", 16)
    # both sizes side by side by default; the small vocabulary one is issue 25's measurement
    args = train.parse_args(["--preset", "sweep", "--mixers", "linear", "--batch", "64", "--seqs", "64,256"])
    assert args.sizes == ["v8192", "v256"] and args.batch == 64
    assert [train.label_of(m, d, args.dists, b, c, z) for m, d, b, c, z in train.variants(args)] == [
        "linear",
        "linear @v256",
    ]
    cfg = train.make_config("latte", False, 64, "sweep", "v256")
    assert (cfg.vocab_size, cfg.mlp_ratio, cfg.dim) == (256, 1.0, 64)


def test_train_tag_names_its_own_files(tmp_path):
    """--tag writes a run beside the usual one (train-TAG.*), never over it."""
    train.main(FAST + ["--out", str(tmp_path), "--mixers", "softmax", "--seqs", "32"])
    res = train.main(FAST + ["--out", str(tmp_path), "--mixers", "softmax", "--seqs", "32", "--tag", "1thread"])
    assert res["config"]["tag"] == "1thread"
    assert {p.name for p in tmp_path.glob("*.json")} == {"train.json", "train-1thread.json", MARKER}
    files = json.loads((tmp_path / MARKER).read_text())["files"]  # each run's files recorded (latte/guard.py)
    assert files["train.json"] == files["train-1thread.json"] == "latte bench train"
    assert json.loads((tmp_path / "train.json").read_text())["config"]["tag"] is None


def test_train_ratios_per_size_and_layer():
    """Step and layer ratios pair each variant with softmax's and linear's of
    its own size, sequence and compilation; the RG-LRU note reads the conv
    variant of the same mixer."""
    from benchmarks.train_report import markdown, step_ratios

    def row(mixer, size, ms, layer, label=None):
        return dict(
            mixer=mixer,
            size=size,
            seq=64,
            compiled=False,
            dist="std1",
            backend="torch",
            label=label or mixer + (f" @{size}" if size == "v256" else ""),
            median_ms=ms,
            attention_layer_ms=layer,
            batch=64,
            tokens_per_s=1.0,
            attention_share=0.5,
            params=1,
        )

    rows = [
        row("softmax", "v8192", 10, 2),
        row("linear", "v8192", 20, 4),
        row("latte:conv", "v8192", 30, 6),
        row("latte", "v8192", 40, 9),
        row("softmax", "v256", 5, 1),
        row("latte", "v256", 15, 3),
    ]
    res = {"results": rows}
    r = step_ratios(res)
    assert r["over_softmax"]["64"] == {
        "softmax": 1,
        "linear": 2,
        "latte:conv": 3,
        "latte": 4,
        "softmax @v256": 1,
        "latte @v256": 3,
    }
    assert r["over_linear"]["64"]["latte"] == 2 and "latte @v256" not in r["over_linear"]["64"]
    assert r["layer_over_linear"]["64"]["latte"] == 9 / 4 and r["layer_over_softmax"]["64"]["latte @v256"] == 3
    res.update(
        machine={"cpu_model": "cpu", "threads": 1, "torch": "x"},
        ratios=r,
        config=dict(
            quick=False,
            preset="sweep",
            seqs=[64],
            repeats=5,
            dists=["std1"],
            variants=[x["label"] for x in rows],
            sizes={"v8192": {}, "v256": {}},
        ),
    )
    text = markdown(res)
    assert "| latte | 9.0 / 2.25 / 4.50 |" in text
    assert "latte (qk mixer conv_rglru) layer / latte:conv layer = 1.50x" in text


@pytest.mark.slow
def test_train_runs_split_by_sequence_merge(tmp_path, capsys):
    train.main(FAST + ["--out", str(tmp_path), "--seqs", "32", "--mixers", "latte,softmax"])
    res = train.main(FAST + ["--out", str(tmp_path), "--seqs", "64", "--mixers", "latte,softmax", "--merge"])
    assert res["config"]["seqs"] == [32, 64] and res["merged"]["seqs"] == [32]
    assert {(r["label"], r["seq"]) for r in res["results"]} == {
        (m, s) for m in ("latte", "latte (b std10)", "softmax") for s in (32, 64)
    }
    assert "from an earlier run" in (tmp_path / "train.md").read_text()


def test_sharpened_key_logits_have_the_asked_spread():
    from latte.models import LatteForCausalLM

    model = LatteForCausalLM(train.make_config("macchiato", True, 32))
    ids = torch.randint(0, model.config.vocab_size, (4, 32))
    train.sharpen_key_logits(model, ids, 10.0)
    seen = []
    hooks = [
        m.b_proj.register_forward_hook(lambda mod, i, out: seen.append(out.std().item()))
        for m in model.modules()
        if hasattr(m, "b_proj")
    ]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    assert len(seen) == model.config.num_layers and all(abs(s - 10.0) < 1e-3 for s in seen)


def test_sharpening_runs_on_the_torch_kernels_whatever_backend_was_left_set():
    """The std10 variants sharpen on the CPU before the model moves to the
    device; a previous point's backend ("fla", CUDA only) left set must not
    reach that forward (it did on an H200: every std10 variant unavailable)."""
    from latte.ops import backend as BK

    args = train.parse_args(FAST + ["--seqs", "32"])
    try:
        BK.set_backend("fla")
        pt = train.build_point("macchiato", 32, args, dist="std10", backend="torch")
    finally:
        BK.set_backend(None)
    assert pt["dist"] == "std10" and callable(pt["step"])


def test_step_profile_counts_ops_and_names_the_top_ones():
    from benchmarks import step_profile

    x = torch.randn(8, 8)
    prof = step_profile.profile_step(lambda: (x @ x).exp().sum(), steps=2, top=3)
    assert prof["aten_calls_per_step"] >= 3 and prof["wall_ms_per_step"] > 0
    ms = [t["self_ms_per_step"] for t in prof["top"]]
    assert len(ms) == 3 and ms == sorted(ms, reverse=True) and all(t["op"].startswith("aten::") for t in prof["top"])
    table = step_profile.markdown({"toy": prof}, 8)
    assert table[1].startswith("## Profile") and table[-1].startswith("| toy | ")


def test_device_options_fail_clearly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="--device cuda: torch.cuda.is_available"):
        train.main(FAST + ["--device", "cuda", "--out", "unused"])


def test_the_scripts_write_beside_their_committed_results_by_default():
    """The repository's benchmarks keep their outputs apart from the code:
    their default --out is benchmarks/results/, which holds every committed
    json, md and png (benchmarks/ itself holds only code and its README)."""
    from pathlib import Path

    from benchmarks import RESULTS, distill, window

    root = Path(__file__).resolve().parents[2]
    for module, argv in ((audit, []), (train, []), (window, []), (distill, [])):
        assert module.parse_args(argv).out == Path(RESULTS), module.__name__
    committed = sorted(p.name for p in (root / "benchmarks").iterdir() if p.suffix in (".json", ".md", ".png"))
    assert committed == ["README.md"], committed
    assert (root / RESULTS / "ops.json").is_file() and (root / RESULTS / "decode.md").is_file()
