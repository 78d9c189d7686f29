"""Bounded autotuning of fla-core's Triton kernels (backend "fla"; docs/gpu.md §2.1).

fla tunes each of its kernels over up to a few hundred configurations for
every new (heads, widths, dtype) key: on a bare H100 the first
forward+backward of latte_causal on fla had not finished after 170 s (issue
42). Before fla's kernels first run, `pin` walks every fla module latte's
calls reach (chunk_gla, fused_recurrent_gla, the gate fused_additive_gate
and what they import: found
from fla's source, `reached_modules`), finds each Triton autotuner in it
(under a `triton.heuristics` wrapper too), and wraps its early pruning so
that, after fla's own pruning rules have run on the actual arguments,
exactly one configuration is left:

- the one the table `fla_tuning.json` names for this GPU (keyed by
  `torch.cuda.get_device_name()`) and kernel, if fla's rules keep it;
- else the smallest tiles among those kept (fewest warps over 4 away, fewest
  stages): a configuration that fits any GPU fla's lists were built for.

Triton then compiles that one configuration per new key instead of
benchmarking the whole list. `LATTE_FLA_AUTOTUNE=full` in the environment
leaves fla's tuning as it is (a tuning run); `record()` at the end of such a
run writes the configurations fla chose into the table, under this GPU's
name. The table is empty until a GPU run fills it: the smallest tiles run
meanwhile (not yet measured against tuned ones on a GPU: docs/gpu.md §5).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import torch

from latte.files import atomic_write

TABLE = Path(__file__).with_name("fla_tuning.json")
ENTRY_POINTS = ("fla.ops.gla.chunk", "fla.ops.gla.fused_recurrent", "fla.ops.gsa.gate")


def _fla_root() -> Path | None:
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _source(root: Path, module: str) -> Path | None:
    p = root.joinpath(*module.split(".")[1:])
    for candidate in (p.with_suffix(".py"), p / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(root: Path, module: str) -> set[str]:
    """fla.ops modules imported anywhere in module's source (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(_source(root, module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fla.ops"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if _source(root, f"{node.module}.{a.name}"))
    return {m for m in out if _source(root, m)}


def autotuned_kernels(root: Path, module: str) -> list[str]:
    """Names of the functions of module decorated with an autotuner (triton's or fla's)."""
    names = []
    for node in ast.walk(ast.parse(_source(root, module).read_text())):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if ast.unparse(d.func if isinstance(d, ast.Call) else d).endswith("autotune"):
                    names.append(node.name)
    return names


@functools.cache
def reached_modules() -> dict[str, list[str]]:
    """{module: [autotuned kernel names]} over the fla.ops modules that
    chunk_gla and fused_recurrent_gla import, transitively (from source: no
    Triton needed); {} without fla-core."""
    root = _fla_root()
    if root is None:
        return {}
    seen, todo = set(), list(ENTRY_POINTS)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(sorted(_imports(root, m) - seen))
    found = {m: autotuned_kernels(root, m) for m in sorted(seen)}
    return {m: k for m, k in found.items() if k}


def _describe(cfg) -> dict:
    return {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _smallest(configs):
    def cost(cfg):
        tiles = 1
        for v in cfg.kwargs.values():
            tiles *= v if isinstance(v, int) else 1
        return tiles, abs(cfg.num_warps - 4), cfg.num_warps, cfg.num_stages

    return min(configs, key=cost)


def select(configs, entry: dict | None):
    """The table's entry if it is among configs (what fla's pruning kept), else the smallest."""
    if entry is not None:
        for cfg in configs:
            if _describe(cfg) == entry:
                return cfg
    return _smallest(configs)


def find_autotuner(obj):
    """The autotuner under obj (through heuristics wrappers' .fn), or None."""
    for _ in range(4):
        if hasattr(obj, "configs") and hasattr(obj, "early_config_prune") and hasattr(obj, "keys"):
            return obj
        obj = getattr(obj, "fn", None)
        if obj is None:
            return None
    return None


def pin_autotuner(tuner, entry: dict | None) -> None:
    """After the tuner's own early pruning (fla's rules, on the real
    arguments), keep one configuration (select)."""
    if getattr(tuner, "latte_pinned", False):
        return
    own = tuner.early_config_prune

    def one(configs, nargs, **kwargs):
        kept = own(configs, nargs, **kwargs) if own is not None else list(configs)
        return [select(kept, entry)]

    tuner.early_config_prune = one
    tuner.latte_pinned = True


def load_table(path: Path = TABLE) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def pin(gpu_name: str, table: dict | None = None, import_module=importlib.import_module) -> dict[str, str]:
    """Pin every autotuner of reached_modules(): {"module.kernel": "table" |
    "smallest"}. Unless LATTE_FLA_AUTOTUNE=full."""
    if os.environ.get("LATTE_FLA_AUTOTUNE") == "full":
        return {}
    entries = (load_table() if table is None else table).get(gpu_name, {})
    pinned = {}
    for module, kernels in reached_modules().items():
        mod = import_module(module)
        for name in kernels:
            tuner = find_autotuner(getattr(mod, name, None))
            if tuner is None:
                continue
            entry = entries.get(f"{module}.{name}")
            pin_autotuner(tuner, entry)
            pinned[f"{module}.{name}"] = "table" if entry else "smallest"
    return pinned


@functools.cache
def pin_for_device(device_index: int) -> dict[str, str]:
    """pin() for the GPU in hand, once per process and device."""
    return pin(torch.cuda.get_device_name(device_index))


def record(gpu_name: str, path: Path = TABLE) -> dict:
    """Merge tuned_table() into the table under gpu_name; returns the table."""
    table = load_table(path)
    table.setdefault(gpu_name, {}).update(tuned_table())
    atomic_write(path, json.dumps(table, indent=1, sort_keys=True) + "\n")  # a kill leaves the old table whole
    return table


def tuned_table(import_module=importlib.import_module) -> dict[str, dict]:
    """{"module.kernel": config} of the configuration fla's full tuning chose
    most often for each kernel (after a run with LATTE_FLA_AUTOTUNE=full)."""
    out = {}
    for module, kernels in reached_modules().items():
        mod = import_module(module)
        for name in kernels:
            tuner = find_autotuner(getattr(mod, name, None))
            chosen = [json.dumps(_describe(c), sort_keys=True) for c in getattr(tuner, "cache", {}).values()]
            if chosen:
                out[f"{module}.{name}"] = json.loads(Counter(chosen).most_common(1)[0][0])
    return out
