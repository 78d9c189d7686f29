"""The package as a user and a reader meet it: the names `import latte`
offers, and imports that run one way (ops <- layers <- models <- train <-
convert <- eval/bench/experiments <- suite <- cli, data beside), with no cycle inside a package."""

from __future__ import annotations

import ast
import importlib
import pkgutil
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
    # conversion patches transformers' models (beside models) and trains them as a task
    "convert": {"base", "ops", "layers", "models", "data", "train"},
    "eval": {"base", "ops", "layers", "models", "data", "train", "convert"},
    "bench": {"base", "ops", "layers", "models", "data", "train", "convert"},
    "experiments": {"base", "ops", "layers", "models", "data", "train", "convert", "eval", "bench"},
    "suite": {"base", "ops", "layers", "models", "data", "train", "convert", "eval", "bench", "experiments"},
    "configs": set(),
}


def part(module: str) -> str:
    """latte.models.hf -> 'models'; latte.config_io -> 'base'; latte.cli -> 'cli'
    (as the package facade `latte`, whose names are imported lazily, on use)."""
    name = module.split(".")[1] if module.count(".") else ""
    if name in ("cli", "__main__") or module == "latte":
        return "cli"
    return name if name in ALLOWED else "base"


def _module_name(path: Path) -> tuple[str, str]:
    """(module, the package its relative imports start from)."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    return module, module if rel.name == "__init__" else module.rpartition(".")[0]


def _runtime_nodes(tree: ast.AST):
    """(node, inside a function) for every node that runs: the bodies of
    `if TYPE_CHECKING:` blocks are skipped (annotations only, never imported)."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        yield node, in_function
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            children = node.orelse
        else:
            children = list(ast.iter_child_nodes(node))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in children)


def _targets(node: ast.AST, package: str) -> set[str]:
    """The latte modules one import statement imports."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name.startswith("latte")}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    if not target.startswith("latte"):
        return set()
    submodules = {
        f"{target}.{a.name}"
        for a in node.names
        if (ROOT.parent / f"{target}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
        or (ROOT.parent / f"{target}.{a.name}".replace(".", "/") / "__init__.py").exists()
    }
    # `from . import x` names submodules only; anything else also reads the package itself
    names_only_submodules = node.module is None and len(submodules) == len(node.names)
    return submodules | (set() if names_only_submodules else {target})


def imports(*, deferred_only: bool = False) -> dict[str, set[str]]:
    """module -> latte modules it imports, at the top or inside functions
    (a deferred import is an edge of the graph too; `if TYPE_CHECKING:`
    blocks are not). deferred_only: the imports inside functions alone."""
    found = {}
    for path in ROOT.rglob("*.py"):
        module, package = _module_name(path)
        targets = set()
        for node, in_function in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if in_function or not deferred_only:
                targets |= _targets(node, package)
        found[module] = targets - {module}
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


def test_conversion_has_one_home_above_the_native_model():
    """Conversion lives in latte/convert (models/ is the native model alone):
    nothing at or below train imports it; the trainer reaches its task only
    by name (train/task.py TASKS, imported when `task: convert` is chosen)."""
    from latte.train.task import TASKS

    stray = [
        *(ROOT / "models").glob("convert/*.py"),
        *(ROOT / "models").glob("convert*.py"),
        *(ROOT / "train").glob("convert*.py"),
    ]
    assert not stray, f"conversion code outside latte/convert: {stray}"
    below = ("base", "ops", "layers", "models", "data", "train")
    graph = imports()
    bad = [f"{m} imports {t}" for m, ts in graph.items() if part(m) in below for t in ts if part(t) == "convert"]
    assert not bad, "\n".join(bad)
    module, _, cls = TASKS["convert"].partition(":")
    assert part(module) == "convert" and f"class {cls}(" in (ROOT.parent / module.replace(".", "/")).with_suffix(
        ".py"
    ).read_text(encoding="utf-8")


def packages() -> list[str]:
    """latte and every package below it (latte.ops, ..., latte.data.lra, latte.convert)."""
    return sorted(_module_name(p)[0] for p in ROOT.rglob("__init__.py"))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in graph.get(m, ()):
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            component = []
            while not component or component[-1] != m:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return found


@pytest.mark.parametrize("package", packages())
def test_no_import_cycle(package):
    """No module of `package` (latte: the whole package) reaches itself again
    through imports, deferred ones (inside functions) included."""
    inside = {m: ts for m, ts in imports().items() if m == package or m.startswith(f"{package}.")}
    graph = {m: {t for t in ts if t in inside} for m, ts in inside.items()}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_cycle_finder_sees_deferred_imports():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = imports()
    assert "latte.models.hf" in graph["latte.eval.harness"]  # imported inside register()


def test_deferred_internal_imports_say_why():
    """A latte module imported inside a function instead of at the top is
    there for an optional dependency (transformers, lm-eval) or, in the
    command line and the GPU suite, so that they start without torch (the
    suite installs what is missing first); the comment on the import or the
    line above says which (docs/design.md §10)."""
    bad = []
    for path in ROOT.rglob("*.py"):
        module, package = _module_name(path)
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, in_function in _runtime_nodes(ast.parse("\n".join(lines))):
            if not (in_function and _targets(node, package)):
                continue
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
                first -= 1  # the group of imports this one belongs to
            said = lines[node.lineno - 1] + (lines[first - 1] if first else "")
            on_use = module == "latte.cli" or module.startswith("latte.suite.")  # start before torch
            if "optional" not in said and not (on_use and "on use" in said):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, "deferred internal imports without a reason:\n" + "\n".join(sorted(bad))


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


def test_public_ops_and_layer_forwards_are_annotated():
    """Every public op has annotated arguments and return; every layer's
    forward says what it returns (the signatures are the documentation an
    IDE shows)."""
    import inspect

    from torch import nn

    import latte.layers
    import latte.ops

    bad = []
    for name in latte.ops.__all__:
        op = getattr(latte.ops, name)
        if not inspect.isfunction(op):
            continue
        sig = inspect.signature(op)
        bad += [f"latte.ops.{name}: argument {a}" for a, p in sig.parameters.items() if p.annotation is p.empty]
        bad += [f"latte.ops.{name}: return"] if sig.return_annotation is sig.empty else []
    modules = [importlib.import_module(m.name) for m in pkgutil.walk_packages(latte.layers.__path__, "latte.layers.")]
    for module in modules:
        for cls in vars(module).values():
            if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__ == module.__name__:
                forward = vars(cls).get("forward")
                if forward is not None and inspect.signature(forward).return_annotation is inspect.Signature.empty:
                    bad.append(f"{module.__name__}.{cls.__name__}.forward: return")
    assert not bad, "\n".join(bad)


def test_internal_helpers_are_not_public_layer_names():
    import latte.layers

    for name in ("real_positions", "sqrt_bounded_grad", "check_positive_int"):
        assert not hasattr(latte.layers, name) and name not in latte.layers.__all__


def test_every_command_line_parser_refuses_abbreviated_flags():
    """argparse accepts any unique prefix of a flag by default; each parser of
    the package and of tools/ turns that off (allow_abbrev=False)."""
    lax = []
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "tools").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
                flags = {k.arg: k.value for k in node.keywords}
                value = flags.get("allow_abbrev")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    lax.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not lax, f"parsers accepting abbreviated flags: {lax}"
