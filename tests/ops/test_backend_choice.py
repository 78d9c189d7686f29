"""backend=None / "auto": what runs where (issue 42, item 5), with CUDA and
fla-core faked (only the device type, the dtype and fla_missing are read)."""

import logging
from types import SimpleNamespace

import pytest
import torch

from latte.ops import backend as BK


def like(device="cuda", dtype=torch.bfloat16):
    return SimpleNamespace(device=torch.device(device), dtype=dtype)


@pytest.fixture
def default(monkeypatch):
    """No set_backend, no LATTE_BACKEND: the built-in default."""
    monkeypatch.setattr(BK, "_default", None)
    monkeypatch.setattr(BK, "_env_default", None)
    monkeypatch.setattr(BK, "chosen", {})
    monkeypatch.setattr(BK, "_logged", set())


@pytest.fixture
def fla_ok(monkeypatch):
    monkeypatch.setattr(BK, "fla_missing", lambda: None)


def test_default_is_auto(default):
    assert BK.get_backend() == "auto"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cuda_latents_default_to_fla_when_it_imports(default, fla_ok, dtype):
    assert BK.resolve_latent(None, like("cuda", dtype)) == "fla"
    assert BK.chosen["latents"][0] == "fla"


def test_torch_stays_the_default_on_cpu_for_float64_and_without_fla(default, fla_ok, monkeypatch):
    assert BK.resolve_latent(None, like("cpu", torch.float32)) == "torch"
    assert "CUDA tensors" in BK.chosen["latents"][1]
    assert BK.resolve_latent(None, like("cuda", torch.float64)) == "torch"
    assert "float64" in BK.chosen["latents"][1]
    monkeypatch.setattr(BK, "fla_missing", lambda: "ModuleNotFoundError: No module named 'triton'")
    assert BK.resolve_latent(None, like("cuda")) == "torch"
    assert "triton" in BK.chosen["latents"][1]
    assert BK.resolve_latent("torch", like("cuda")) == "torch"


def test_explicit_choices_are_kept(default, fla_ok, monkeypatch):
    monkeypatch.setattr(BK, "_default", "torch")
    assert BK.resolve_latent(None, like("cuda")) == "torch"
    assert BK.resolve_window(None, like("cuda")) == "tiles"
    assert BK.resolve_latent("fla", like("cuda")) == "fla"
    with torch.no_grad():
        assert BK.resolve_window("fla", like("cuda"), cached=True) == "flex"  # asked for: no second-guessing


def test_window_takes_flex_only_where_its_compile_is_paid_once(default, fla_ok, monkeypatch, caplog):
    x = like("cuda")
    with caplog.at_level(logging.INFO, logger="latte.ops.backend"):
        with torch.enable_grad():
            assert BK.resolve_window(None, x) == "flex"  # training: the same shapes every step
            assert BK.chosen["window"] == ("flex", "training: the shapes repeat, one compile per shape")
            assert BK.resolve_window(None, x) == "flex"
            assert BK.resolve_window(None, x, cached=True) == "tiles"  # continuing from a cache
        with torch.no_grad():
            assert BK.resolve_window(None, x) == "tiles"  # inference: prefill of any length
            assert BK.chosen["window"][0] == "tiles" and "compile" in BK.chosen["window"][1]
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        with torch.no_grad():
            assert BK.resolve_window(None, x) == "flex"  # compiled with its caller (not logged while tracing)
    said = [r.getMessage() for r in caplog.records if "window" in r.getMessage()]
    assert len(said) == len(set(said)) == 2  # each choice and reason logged once
    assert BK.resolve_window(None, like("cpu", torch.float32)) == "tiles"
    assert BK.resolve_window(None, like("cuda", torch.float64)) == "tiles"


def test_macchiato_passes_its_cache_to_the_choice(monkeypatch):
    import importlib

    M = importlib.import_module("latte.ops.macchiato")
    seen = []
    monkeypatch.setattr(M, "resolve_window", lambda backend, x, cached=False: seen.append(cached) or "tiles")
    B, T, H, L, E, W = 1, 6, 2, 3, 4, 3
    a, b, q, k, v = (torch.randn(B, T, H, n) for n in (L, L, E, E, E))
    y, st = M.macchiato(a, b, v, q, k, window_size=W, output_final_state=True, backend="torch")
    M.macchiato(a, b, v, q, k, window_size=W, initial_state=st, backend="torch")
    assert seen == [False, True]
