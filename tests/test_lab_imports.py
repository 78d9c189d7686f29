"""The laboratory (experiments/ + benchmarks/) reaches the wheel through a few
front doors (experiments/README.md, "Front doors"): at most LIMIT distinct
`latte` modules, none of the trainer's internals."""

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 15
FORBIDDEN = {f"latte.train.{m}" for m in ("manifest", "metrics", "validation", "checkpoint", "lm", "loop", "runs")}


def _is_module(name: str) -> bool:
    """Whether `from PACKAGE import NAME` gives a module (a package may
    export a function of its submodule's name: latte.ops.macchiato)."""
    package, _, attr = name.rpartition(".")
    value = getattr(importlib.import_module(package), attr, None)
    return inspect.ismodule(value) or (value is None and importlib.util.find_spec(name) is not None)


def latte_modules(source: str) -> set[str]:
    """The `latte` modules a file imports: `import latte.X`, `from latte.X
    import a` (latte.X, and latte.X.a when a is itself a module: `from latte
    import reporting` is latte.reporting)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "latte"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "latte":
            subs = {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
            out |= subs
            if len(subs) < len(node.names):
                out.add(node.module)
    return out


def lab_imports() -> dict[str, set[str]]:
    """module -> the laboratory files importing it."""
    users: dict[str, set[str]] = {}
    for folder in ("experiments", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for m in latte_modules(path.read_text()):
                users.setdefault(m, set()).add(str(path.relative_to(ROOT)))
    return users


def test_the_counter_resolves_submodules_and_relative_imports():
    src = "import latte.ops\nfrom latte import reporting, LatteConfig\nfrom latte.train import manifest\n"
    src += "from . import x\n"
    assert latte_modules(src) == {"latte.ops", "latte.reporting", "latte", "latte.train.manifest"}
    assert all(importlib.util.find_spec(m) is not None for m in latte_modules(src))


def test_the_laboratory_imports_few_wheel_modules_and_no_trainer_internals():
    users = lab_imports()
    forbidden = {m: sorted(users[m]) for m in sorted(FORBIDDEN & users.keys())}
    assert not forbidden, f"trainer internals imported by the laboratory (use latte.train's front door): {forbidden}"
    assert len(users) <= LIMIT, f"the laboratory imports {len(users)} wheel modules (at most {LIMIT}): " + "; ".join(
        f"{m} <- {', '.join(sorted(f))}" for m, f in sorted(users.items())
    )
