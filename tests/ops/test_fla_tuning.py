"""fla's autotuning bounded on latte's side (latte/ops/latte/fla_tuning.py, issue 42).

Triton is not installed in the CPU test environment (its wheel unpacks to
~670 MB), so fla's kernel modules cannot be imported here. What is checked:
which autotuned kernels latte's calls reach, from fla-core's source (no
Triton needed); that `pin` pins every one of them, through heuristics
wrappers, on stand-in modules built from that inventory; and the selection
after fla's own pruning rules. With Triton importable the last test inspects
fla's real autotuner objects.
"""

import importlib.util
import re
from types import SimpleNamespace

import pytest

from latte.ops.latte import fla_tuning as FT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")


def cfg(num_warps=4, num_stages=2, **kwargs):
    return SimpleNamespace(kwargs=kwargs, num_warps=num_warps, num_stages=num_stages)


class FakeAutotuner:
    """Triton's Autotuner as fla_tuning sees it: configs, keys, early_config_prune."""

    def __init__(self, configs, prune=None):
        self.configs, self.keys, self.early_config_prune = configs, ["K"], prune

    def prune(self, **kwargs):  # what Autotuner.prune_configs does first
        return self.early_config_prune(self.configs, {}, **kwargs) if self.early_config_prune else self.configs


def test_inventory_covers_the_kernels_latte_reaches():
    mods = FT.reached_modules()
    assert {"fla.ops.gla.chunk", "fla.ops.common.chunk_h", "fla.ops.common.fused_recurrent"} <= set(mods)
    # the kernel whose tuning sweep the H100 trial was stuck in, and its neighbours
    assert {"chunk_gla_bwd_kernel_dv", "chunk_gla_fwd_kernel_o", "chunk_gla_bwd_kernel_inter"} <= set(
        mods["fla.ops.gla.chunk"]
    )
    assert {"chunk_fwd_kernel_h", "chunk_bwd_kernel_dh"} <= set(mods["fla.ops.common.chunk_h"])
    root = FT._fla_root()
    direct = set()  # what the entry points import by name, read independently of the AST walk
    for module in FT.ENTRY_POINTS:
        direct |= set(re.findall(r"^from (fla\.ops\.[\w.]+) import", FT._source(root, module).read_text(), re.M))
    assert direct and {m for m in direct if FT.autotuned_kernels(root, m)} <= set(mods)


def test_installed_fla_has_the_gate_with_gate_dtype():
    """The "fused" construction calls fla.ops.gsa.gate's fused_additive_gate_fwd
    with gate_dtype (g in float32 whatever the input dtype; fla's own
    chunk_lightnet leaves it in the input's). With the cuda extra installed
    a fla-core without it fails here, read from its source (no Triton
    needed); pyproject.toml pins the release that has it. Its forward
    kernel's autotuner is pinned with the others."""
    import ast

    source = FT._source(FT._fla_root(), "fla.ops.gsa.gate")
    assert source is not None, "fla-core has no fla/ops/gsa/gate.py (pip install 'latte[cuda]')"
    defs = {n.name: n for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
    for name in ("fused_additive_gate_fwd", "fused_additive_gate_bwd", "fused_additive_gate"):
        assert name in defs, f"fla.ops.gsa.gate.{name} is missing"
    assert "gate_dtype" in [a.arg for a in defs["fused_additive_gate_fwd"].args.args]
    assert "fused_additive_gate_fwd_kernel" in FT.reached_modules()["fla.ops.gsa.gate"]


def test_pin_reaches_every_autotuner_through_heuristics_wrappers(monkeypatch):
    """Stand-in modules with one autotuner per kernel of the inventory, half of
    them under a heuristics wrapper (.fn), as fla defines them."""
    modules, tuners = {}, {}
    for module, kernels in FT.reached_modules().items():
        attrs = {}
        for i, name in enumerate(kernels):
            t = FakeAutotuner([cfg(BK=64, num_warps=8, num_stages=3), cfg(BK=32), cfg(BK=16, num_warps=2)])
            tuners[f"{module}.{name}"] = t
            attrs[name] = SimpleNamespace(fn=t) if i % 2 else t
        modules[module] = SimpleNamespace(**attrs)
    monkeypatch.delenv("LATTE_FLA_AUTOTUNE", raising=False)
    first = next(iter(tuners))
    table = {"NVIDIA H100 80GB HBM3": {first: {"kwargs": {"BK": 32}, "num_warps": 4, "num_stages": 2}}}
    pinned = FT.pin("NVIDIA H100 80GB HBM3", table, import_module=modules.__getitem__)
    assert set(pinned) == set(tuners) and len(tuners) >= 10
    assert pinned[first] == "table" and all(v == "smallest" for k, v in pinned.items() if k != first)
    for name, t in tuners.items():
        (one,) = t.prune(K=64)
        assert t.latte_pinned and one.kwargs == ({"BK": 32} if name == first else {"BK": 16})


def test_fla_pruning_rules_run_first_and_bound_the_choice():
    """The table's entry only where fla's own rules keep it; else the smallest they keep."""

    def keep_below_K(configs, nargs, K):
        return [c for c in configs if c.kwargs["BK"] < K] or [min(configs, key=lambda c: c.kwargs["BK"])]

    t = FakeAutotuner([cfg(BK=128), cfg(BK=64), cfg(BK=32, num_warps=8), cfg(BK=32)], prune=keep_below_K)
    FT.pin_autotuner(t, {"kwargs": {"BK": 64}, "num_warps": 4, "num_stages": 2})
    assert [c.kwargs["BK"] for c in t.prune(K=100)] == [64]  # the table's choice, kept by fla
    (one,) = t.prune(K=64)  # fla drops BK=64 for K=64: the smallest it keeps, 4 warps preferred
    assert one.kwargs == {"BK": 32} and one.num_warps == 4
    FT.pin_autotuner(t, None)  # pinning twice wraps once
    assert [c.kwargs["BK"] for c in t.prune(K=100)] == [64]


def test_full_autotuning_on_request(monkeypatch):
    monkeypatch.setenv("LATTE_FLA_AUTOTUNE", "full")
    assert FT.pin("any GPU", {}, import_module=lambda m: pytest.fail("nothing imported")) == {}


def test_table_is_valid_json_keyed_by_gpu_and_kernel():
    table = FT.load_table()
    inventory = {f"{m}.{k}" for m, ks in FT.reached_modules().items() for k in ks}
    for gpu, entries in table.items():
        assert isinstance(gpu, str) and set(entries) <= inventory
        for e in entries.values():
            assert set(e) == {"kwargs", "num_warps", "num_stages"}


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton to import fla's kernels")
def test_every_real_fla_autotuner_latte_reaches_is_pinned(monkeypatch):
    from triton.runtime.autotuner import Autotuner

    monkeypatch.delenv("LATTE_FLA_AUTOTUNE", raising=False)
    pinned = FT.pin("test GPU", {})
    for module, kernels in FT.reached_modules().items():
        for name in kernels:
            tuner = FT.find_autotuner(getattr(importlib.import_module(module), name))
            assert isinstance(tuner, Autotuner) and tuner.latte_pinned, f"{module}.{name}"
    assert len(pinned) == sum(len(k) for k in FT.reached_modules().values())
