"""The package as a user and a reader meet it: the names `import latte`
offers, and imports that run one way (ops <- layers <- models <- train <-
eval/bench/experiments <- suite <- cli, data beside), with no cycle inside a package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import latte

ROOT = Path(latte.__file__).parent
# What each part may import from the package (the top-level helper modules,
# "base": _checks, config_io, allocator, are below everything).
ALLOWED = {
    "base": {"base"},
    "ops": {"base"},
    "layers": {"base", "ops"},
    "data": {"base"},
    "models": {"base", "ops", "layers", "data"},
    "train": {"base", "ops", "layers", "models", "data"},
    "eval": {"base", "ops", "layers", "models", "data", "train"},
    "bench": {"base", "ops", "layers", "models", "data", "train"},
    "experiments": {"base", "ops", "layers", "models", "data", "train", "eval", "bench"},
    "suite": {"base", "ops", "layers", "models", "data", "train", "eval", "bench", "experiments"},
    "configs": set(),
}


def part(module: str) -> str:
    """latte.models.hf -> 'models'; latte.config_io -> 'base'; latte.cli -> 'cli'
    (as the package facade `latte`, whose names are imported lazily, on use)."""
    name = module.split(".")[1] if module.count(".") else ""
    if name in ("cli", "__main__") or module == "latte":
        return "cli"
    return name if name in ALLOWED else "base"


def imports() -> dict[str, set[str]]:
    """module -> latte modules it imports (anywhere in the file, functions included)."""
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if rel.name == "__init__" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("latte")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                if target.startswith("latte"):
                    targets.add(target)
                    targets |= {
                        f"{target}.{a.name}"
                        for a in node.names
                        if (ROOT.parent / f"{target}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                    }
        found[module] = targets
    return found


def violations(imports_of: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(imports_of.items()):
        here = part(module)
        if here == "cli":
            continue
        for target in sorted(targets):
            there = "base" if target == "latte" else part(target)  # `from latte import __version__`
            if there != here and there not in ALLOWED[here]:
                bad.append(f"{module} ({here}) imports {target} ({there})")
    return bad


def test_imports_run_one_way():
    bad = violations(imports())
    assert not bad, "\n".join(bad)


def test_train_does_not_import_eval():
    """Validation and "open a trained run" live in train (train/validation.py,
    train/runs.py); eval builds on them."""
    bad = [v for v in violations(imports()) if v.startswith("latte.train")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", ["ops", "layers", "models"])
def test_no_import_cycle_inside_a_package(package):
    graph = {
        m: {t for t in ts if t.startswith(f"latte.{package}.")}
        for m, ts in imports().items()
        if m.startswith(f"latte.{package}.")
    }
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(m) :] + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for t in graph.get(m, ()):
            visit(t, path + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])


def test_top_level_names_are_lazy_and_complete():
    """`import latte` does not import torch (the CLI starts fast); the
    names a user reaches for are one attribute away."""
    code = (
        "import sys, latte; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert latte.LatteForCausalLM.__module__ == 'latte.models.causal_lm'; "
        "assert 'torch' in sys.modules; print(sorted(latte.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in (
        "LatteConfig",
        "LatteForCausalLM",
        "LatteForSequenceClassification",
        "LatteAttention",
        "MacchiatoAttention",
        "SoftmaxAttention",
        "SlidingWindowAttention",
        "LinearAttention",
    ):
        assert name in out.stdout
        assert getattr(latte, name) is getattr(__import__(latte._EXPORTS[name], fromlist=[name]), name)
    assert sorted(latte.__all__) == sorted(["__version__", *latte._EXPORTS])
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        latte.nope  # noqa: B018


def test_internal_helpers_are_not_public_layer_names():
    import latte.layers

    for name in ("real_positions", "sqrt_bounded_grad", "check_positive_int"):
        assert not hasattr(latte.layers, name) and name not in latte.layers.__all__
