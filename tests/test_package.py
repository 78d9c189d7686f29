"""The package as a user and a reader meet it: the names `import latte`
offers, imports that run one way (ops <- layers <- models <- train <-
convert <- eval/bench <- cli, data beside), with no cycle inside a package, and the
laboratory outside the wheel: the repository's experiments/ and benchmarks/
import latte, never the reverse, and the wheel holds neither."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import textwrap
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
    # `from . import x` and `from latte import x` name submodules only (the facade
    # latte/__init__.py imports nothing on its own); anything else also reads the package itself
    names_only_submodules = (node.module is None or target == "latte") and len(submodules) == len(node.names)
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
            there = part(target)  # the facade `latte` counts as cli: nothing inside imports it
            if there != here and there not in ALLOWED[here]:
                bad.append(f"{module} ({here}) imports {target} ({there})")
    return bad


def test_imports_run_one_way():
    bad = violations(imports())
    assert not bad, "\n".join(bad)


REPO = ROOT.parent
LAB = ("experiments", "benchmarks")  # the repository's folders of code that the wheel leaves out


def _top_imports(path: Path, package: str) -> set[str]:
    """Every module one file imports (absolute names), at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.level and node.module else base if node.level else node.module
            found |= {target, *(f"{target}.{a.name}" for a in node.names)}  # `from p import m`: maybe a module
    return found


def _lab_modules(folder: str):
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        yield path, module, module if rel.name == "__init__" else module.rpartition(".")[0]


def test_the_library_never_imports_the_laboratory():
    """latte/ imports neither experiments/ nor benchmarks/ (they exist only in a
    checkout, where `python -m experiments.NAME` / `python -m benchmarks.NAME`
    run them)."""
    bad = [
        f"{m}: imports {name}"
        for path in ROOT.rglob("*.py")
        for m, package in [_module_name(path)]
        for name in sorted(_top_imports(path, package))
        if name.split(".")[0] in LAB
    ]
    assert not bad, "\n".join(bad)


def test_the_cli_never_touches_sys_path_or_pythonpath():
    """latte/cli.py opens no back door into a checkout: it neither reads nor
    writes sys.path or PYTHONPATH, and imports no module by a computed name
    but the package's own benchmarks (latte.bench)."""
    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    bad = [
        f"line {node.lineno}: sys.path"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys"
    ]
    bad += [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "PYTHONPATH" in node.value
    ]
    from latte import cli

    bad += [f"latte bench {n}: {m}" for n, m in cli.BENCHES.items() if not m.startswith("latte.bench.")]
    assert not bad, "\n".join(bad)


def test_experiments_and_benchmarks_depend_on_latte_one_way():
    """benchmarks/ imports latte alone; an experiment folder imports latte,
    experiments.common and itself (the conversion's ablations, data and
    pilots, also the conversion study whose stages they run); the GPU suite,
    which runs the others, any of them."""
    bad = []
    for folder in LAB:
        for path, module, package in _lab_modules(folder):
            parts = module.split(".")
            own = ".".join(parts[:2]) if folder == "experiments" and len(parts) > 2 else folder
            allowed = ("latte", own) + {
                "experiments": ("experiments.common", "experiments.COMMANDS", "experiments.MOVED"),
                "benchmarks": (),
            }[folder]
            if own == "experiments.pilots":
                allowed += ("experiments.convert",)
            if module.startswith("experiments.gpu_suite"):
                allowed += ("experiments", "benchmarks")
            for name in sorted(_top_imports(path, package)):
                top = name.split(".")[0]
                if top in ("latte", *LAB) and not any(name == a or name.startswith(f"{a}.") for a in allowed):
                    if not (module.startswith("experiments.") and name == "experiments"):  # the registry
                        bad.append(f"{module} imports {name}")
    assert not bad, "\n".join(bad)


def test_no_import_cycle_in_the_laboratory():
    graph = {}
    for folder in LAB:
        for path, module, package in _lab_modules(folder):
            graph[module] = _top_imports(path, package)
    graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_wheel_holds_no_laboratory_code():
    """The packages setuptools puts in the wheel (pyproject's packages.find,
    expanded by setuptools' own reader, as the build does): latte and its subpackages, none of them an
    experiment, the GPU suite or a repository-only benchmark. (.ci/run builds
    the real wheel and checks its file list the same way.)"""
    from setuptools.config.pyprojecttoml import read_configuration

    shipped = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["packages"]  # find, expanded
    assert "latte" in shipped and "latte.bench" in shipped and "latte.models" in shipped
    assert not [p for p in shipped if not p.startswith("latte")], shipped
    assert not [p for p in shipped if p.split(".")[1:2] in (["experiments"], ["suite"])], shipped
    lab_bench = [m for _, m, _ in _lab_modules("benchmarks") if m != "benchmarks"]
    assert lab_bench, "benchmarks/ holds the repository-only benchmarks"
    for module in lab_bench:  # none of them also left inside the package
        assert not (ROOT / "bench" / f"{module.split('.')[-1]}.py").exists(), module
    assert not (ROOT / "experiments").exists() and not (ROOT / "suite").exists()


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
    command line, so that it starts without torch; the comment on the import or the
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
            on_use = module == "latte.cli"  # starts before torch
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


def test_one_version_in_the_package_and_its_metadata():
    from latte.models.pretrained import __version__ as saved

    lines = (REPO / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    assert f'version = "{latte.__version__}"' in lines and saved == latte.__version__


def test_subpackages_listed_are_the_subpackages_there():
    """`latte.X` reaches every subpackage, and only subpackages."""
    there = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert sorted(latte._SUBPACKAGES) == sorted(there)
    assert latte.convert.__name__ == "latte.convert"
    assert "convert" in dir(latte)


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
    the package, of tools/ and of the laboratory turns that off (allow_abbrev=False)."""
    lax = []
    lab = [path for folder in LAB for path in (REPO / folder).rglob("*.py")]
    for path in [*ROOT.rglob("*.py"), *(ROOT.parent / "tools").glob("*.py"), *lab]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
                flags = {k.arg: k.value for k in node.keywords}
                value = flags.get("allow_abbrev")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    lax.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not lax, f"parsers accepting abbreviated flags: {lax}"


def test_the_two_families_of_ops_stay_apart():
    """ops/latte/ (latent attention) and ops/window/ (sliding window, sinks)
    never import each other, and the shared ops modules (checks, layout,
    packing, backend, ...) import neither: only macchiato.py, which composes
    them, and the package's public surface (ops/__init__.py) see both
    (docs/design.md §10)."""

    def family(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 3 and parts[2] in ("latte", "window") else None

    composers = {"latte.ops", "latte.ops.macchiato"}
    bad = []
    for module, targets in sorted(imports().items()):
        if not module.startswith("latte.ops") or module in composers:
            continue
        for target in sorted(targets):
            there = family(target)
            if there is not None and there != family(module):
                bad.append(f"{module} imports {target}")
    assert not bad, "\n".join(bad)


# Parts of latte/ the length rule skips (none: conversion lives in
# latte/convert/, where the rule applies, as it does in the laboratory).
MOVING = ()
LIMIT = 60  # lines per function, its signature and docstring included (docs/design.md habit 7)


def long_functions(source: str, limit: int = LIMIT) -> dict[str, int]:
    """{qualified name: lines} of the functions and methods in `source`
    longer than `limit` lines, nested ones included."""
    found = {}
    stack = [(ast.parse(source), "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > limit:
                    found[name[:-1]] = lines
            stack.append((child, name))
    return found


def allowed_long_functions() -> dict[str, str]:
    """{`path: name`: reason} from the list in docs/design.md habit 7."""
    lines = (ROOT.parent / "docs" / "design.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Functions longer than 60 lines"))
    allowed = {}
    for line in lines[start + 1 :]:
        if not line.strip().startswith("- "):
            break
        if line.strip() != "- none":
            name, _, reason = line.strip()[2:].partition(": ")
            allowed[name.strip("`")] = reason
    return allowed


def test_long_function_finder_counts_methods_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    source = f"def short():\n    pass\n\n\nclass C:\n    def m(self):\n{textwrap.indent(body, '    ')}\n"
    source += f"\n\ndef outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n    return inner\n"
    assert long_functions(source) == {"C.m": 61, "outer": 63, "outer.inner": 61}


def test_functions_are_at_most_60_lines():
    """Functions in latte/ and in the laboratory (experiments/, benchmarks/)
    are at most 60 lines, but for at most 3 named, with their reason, in
    docs/design.md habit 7."""
    allowed = allowed_long_functions()
    assert len(allowed) <= 3, f"at most 3 exceptions, docs/design.md names {len(allowed)}"
    over = []
    paths = [p for folder in ("latte", *LAB) for p in sorted((REPO / folder).rglob("*.py"))]
    assert any(p.is_relative_to(REPO / "experiments") for p in paths)
    for path in paths:
        rel = path.relative_to(REPO).as_posix()
        if rel.removeprefix("latte/").startswith(MOVING):
            continue
        for name, lines in long_functions(path.read_text(encoding="utf-8")).items():
            if f"{rel}: {name}" not in allowed:
                over.append(f"{rel}: {name} ({lines} lines)")
    assert not over, f"functions over {LIMIT} lines (split them, or justify them in docs/design.md):\n" + "\n".join(
        over
    )
