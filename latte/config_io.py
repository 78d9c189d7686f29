"""Validated config dataclasses from YAML files and command-line overrides.

Configs are plain dataclasses; this module turns untrusted dicts (YAML, CLI)
into them and reports *every* problem at once, one line each, naming the
dotted field path, the value received and what is allowed (docs/design.md, "Configuration").
Range checks live in each dataclass's ``__post_init__`` via `ConfigErrors`.

Typical use::

    data = merge(load_yaml(path), parse_overrides(sys.argv[2:]))
    cfg = build(RunConfig, data, where=str(path))
    save_yaml(cfg, run_dir / "config.yaml")

Only PyYAML is needed. YAML is read with YAML 1.2-style scalars: ``1e-3`` is a
float (PyYAML's YAML 1.1 reads it as a string) and only true/false are
booleans (YAML 1.1 turns ``no``/``on``/``off`` into bools). Duplicate keys are
errors rather than silently keeping the last one.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from latte.files import atomic_write

__all__ = [
    "ConfigError",
    "ConfigErrors",
    "build",
    "load_yaml",
    "parse_overrides",
    "merge",
    "to_dict",
    "save_yaml",
]


class ConfigError(ValueError):
    """A ValueError carrying the individual problems as (path, text) pairs."""

    def __init__(self, where: str, problems: list[tuple[str, str]]):
        self.where, self.problems = where, list(problems)
        n = len(self.problems)
        lines = [f"  {p}: {t}" if p else f"  {t}" for p, t in self.problems]
        super().__init__(f"{where}: {n} config problem{'s' * (n != 1)}:\n" + "\n".join(lines))

    def __reduce__(self):  # survives pickling (e.g. raised in a worker process)
        return type(self), (self.where, self.problems)


def _show(value: Any) -> str:
    """`'eight' (str)`: the repr (shortened) and the type of a received value."""
    r = repr(value)
    r = r if len(r) <= 60 else r[:57] + "..."
    return f"{r} ({type(value).__name__})"


class ConfigErrors:
    """Collects range/consistency problems in ``__post_init__``, raises once.

    ``errs.check(self.num_heads >= 1, "num_heads", self.num_heads, ">= 1")``
    records ``num_heads: got 0 (int), expected >= 1`` when the condition fails.
    """

    def __init__(self, name: str):
        self.name, self.problems = name, []

    def check(self, ok: bool, field: str, value: Any, allowed: str) -> bool:
        if not ok:
            self.add(field, f"got {_show(value)}, expected {allowed}")
        return bool(ok)

    def add(self, field: str, text: str) -> None:
        self.problems.append((field, text))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.name, self.problems)


# --------------------------------------------------------------------------- build


def _describe(tp: Any) -> str:
    """Human description of an annotation, used in 'expected ...'."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None) or tp is None:
        return "None"
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple, dict) and args:
        if origin is dict:
            return f"mapping of {_describe(args[0])} to {_describe(args[1])}"
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return f"list of {len(args)} items ({', '.join(_describe(a) for a in args)})"
        return f"list of {_describe(args[0])}"
    if dataclasses.is_dataclass(tp):
        return f"mapping for {tp.__name__}"
    return getattr(tp, "__name__", str(tp))


def _check(value: Any, tp: Any, path: str, errors: list) -> Any:
    """Returns `value` converted to `tp` (int->float, list->tuple, dict->dataclass),
    appending (path, text) to `errors` for each problem found."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    bad = (path, f"got {_show(value)}, expected {_describe(tp)}")
    if tp is Any or tp is object:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alt in args:  # first alternative that accepts the value wins
            sub: list = []
            out = _check(value, alt, path, sub)
            if not sub:
                return out
        # A mapping/list matching exactly one structured alternative (e.g. a
        # nested config in `Inner | None`): report that alternative's detailed errors.
        same_kind = [a for a in args if _kind(a) is not None and isinstance(value, _kind(a))]
        if len(same_kind) == 1:
            return _check(value, same_kind[0], path, errors)
        errors.append(bad)
        return value
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            errors.append(bad)
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            errors.append(bad)
            return value
        return _build(tp, value, path, errors)
    if origin in (list, tuple) or tp in (list, tuple):
        return _check_sequence(value, tp, origin or tp, args, path, errors, bad)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            errors.append(bad)
            return value
        if not args:
            return dict(value)
        return {
            _check(k, args[0], f"{path}[{k!r}]", errors): _check(v, args[1], f"{path}[{k!r}]", errors)
            for k, v in value.items()
        }
    ok = _scalar_ok(value, tp)
    if not ok:
        errors.append(bad)
        return value
    if tp is float and not math.isfinite(value):  # YAML .inf / .nan: never a sensible setting
        errors.append((path, f"got {_show(value)}, expected a finite number"))
        return value
    return float(value) if tp is float else value


def _kind(tp: Any) -> type | tuple | None:
    """The container type a structured annotation expects, else None."""
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(tp) or origin is dict:
        return dict
    return (list, tuple) if origin in (list, tuple) else None


def _scalar_ok(value: Any, tp: Any) -> bool:
    if tp is type(None) or tp is None:
        return value is None
    if tp is float:  # ints are fine where floats are expected; bools are not
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(tp, type) and isinstance(value, tp)


def _check_sequence(value, tp, origin, args, path, errors, bad):
    if not isinstance(value, (list, tuple)):
        errors.append(bad)
        return value
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            errors.append(bad)
            return value
        item_types = list(args)
    else:
        item_types = [args[0] if args else Any] * len(value)
    out = [_check(v, t, f"{path}[{i}]", errors) for i, (v, t) in enumerate(zip(value, item_types))]
    return tuple(out) if origin is tuple else out


def _build(cls: type, data: dict, prefix: str, errors: list) -> Any:
    """Type-checks `data` against `cls`, then constructs it (running its
    ``__post_init__``) only if no problem was found below this level."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    dot = f"{prefix}." if prefix else ""
    upgrade = getattr(cls, "upgrade_keys", None)  # maps a class's deprecated keys (e.g. LatteConfig)
    if upgrade is not None:
        try:
            data = upgrade(data)
        except ConfigError as e:
            errors.extend((f"{dot}{p}" if p else prefix, t) for p, t in e.problems)
            return None
    n_before = len(errors)
    for key in data:
        if key not in fields:
            names = sorted(fields)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append((f"{dot}{key}", f"unknown key{hint}; allowed keys: {', '.join(names)}"))
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _check(data[name], hints[name], f"{dot}{name}", errors)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            errors.append((f"{dot}{name}", f"missing required field ({_describe(hints[name])})"))
    if len(errors) > n_before:
        return None
    try:
        return cls(**kwargs)
    except ConfigError as e:  # from ConfigErrors in __post_init__: re-root the paths
        errors.extend((f"{dot}{p}" if p else prefix, t) for p, t in e.problems)
    except ValueError as e:
        errors.append((prefix or cls.__name__, str(e)))
    return None


def build(cls: type, data: dict, *, where: str = "config") -> Any:
    """Builds dataclass `cls` from a plain dict, raising one `ConfigError`
    (a ValueError) listing every unknown key, wrong type, missing field and
    ``__post_init__`` problem; `where` (e.g. the YAML path) heads the message."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"build() needs a dataclass type, got {cls!r}")
    if not isinstance(data, dict):
        raise ConfigError(where, [("", f"got {_show(data)}, expected a mapping for {cls.__name__}")])
    errors: list[tuple[str, str]] = []
    obj = _build(cls, data, "", errors)
    if errors:
        raise ConfigError(where, errors)
    return obj


# --------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 scalars (below) that refuses duplicate keys."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 core scalars instead of PyYAML's YAML 1.1 ones: only true/false are
# bools (1.1 also turns yes/no/on/off into bools), 1e-3 and 1.5e3 are floats
# (1.1 leaves them as strings), and 010, 1:30 and 2024-01-01 stay strings
# (1.1 reads octal, base-60 and dates).
_TAG = "tag:yaml.org,2002:"
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag[len(_TAG) :] not in ("bool", "int", "float", "timestamp")]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_TAG + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _TAG + "int", re.compile(r"^[-+]?(?:0|[1-9][0-9_]*|0x[0-9a-fA-F_]+)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _TAG + "float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _Dumper(yaml.SafeDumper):
    """Quotes a string when either YAML 1.1 or our loader would read it as
    something else ("no", "1e-3"), so files round-trip here and elsewhere."""


_Dumper.yaml_implicit_resolvers = {
    k: yaml.SafeDumper.yaml_implicit_resolvers.get(k, []) + _Loader.yaml_implicit_resolvers.get(k, [])
    for k in set(yaml.SafeDumper.yaml_implicit_resolvers) | set(_Loader.yaml_implicit_resolvers)
}


def _yaml_error(source: str, e: yaml.YAMLError) -> ValueError:
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e)
    return ValueError(f"{source}: invalid YAML{at}: {problem}")


def load_yaml(path: str | os.PathLike) -> dict:
    """Reads a YAML mapping (an empty file gives {}). Syntax errors name the
    file, line and column; a non-mapping top level is an error."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise _yaml_error(str(path), e) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping of keys to values, got {_show(data)}")
    return data


def _parse_value(text: str, arg: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise _yaml_error(f"override {arg!r}", e) from None


def parse_overrides(args: list[str]) -> dict:
    """``["--model.num_layers=4", "train.lr=1e-3", "--train.seed", "7"]`` ->
    ``{"model": {"num_layers": 4}, "train": {"lr": 0.001, "seed": 7}}``.
    Values are typed as YAML would (4 int, 1e-3 float, true, null, [1,2])."""
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, text = arg.partition("=")
        if not eq:
            if not arg.startswith("--"):
                raise ValueError(f"override {arg!r}: expected key=value, --key=value or --key value")
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"override {arg!r}: missing value")
            text, i = args[i + 1], i + 1
        i += 1
        key = key[2:] if key.startswith("--") else key
        parts = key.split(".")
        if not all(p.isidentifier() for p in parts):
            raise ValueError(f"override {arg!r}: {key!r} is not a dotted field name like train.lr")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {arg!r}: {p!r} was already given a value")
        if isinstance(node.get(parts[-1]), dict):
            raise ValueError(f"override {arg!r}: {key!r} already has sub-keys set")
        node[parts[-1]] = _parse_value(text, arg)  # a repeated key: the last one wins
    return out


# Keys that spell one setting: a deprecated name beside today's (the class's
# `upgrade_keys` maps the old one). An override of either replaces the other.
SAME_SETTING = {"num_latents": "latents_per_head", "latents_per_head": "num_latents"}


def merge(base: dict, override: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in `override`
    replaces the value in `base` (and its other spelling, `SAME_SETTING`).
    Neither input is modified."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if k in SAME_SETTING and k not in out:
            out.pop(SAME_SETTING[k], None)
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def to_dict(obj: Any) -> Any:
    """Dataclass (or dict) -> plain dicts/lists/scalars that YAML can write."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return obj


def save_yaml(obj: Any, path: str | os.PathLike) -> None:
    """Writes a dataclass or dict as YAML, atomically (see `atomic_write`)."""
    text = yaml.dump(to_dict(obj), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
    atomic_write(path, text)


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested dict as one level of dotted keys: {"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
