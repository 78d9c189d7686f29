"""Validated config dataclasses: every error kind, all problems at once,
nested configs, CLI overrides typed like YAML, and a save/load round trip."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal

import pytest

from latte.config_io import ConfigError, ConfigErrors, build, load_yaml, merge, parse_overrides, save_yaml, to_dict


@dataclass
class Model:
    dim: int = 64
    num_heads: int = 8
    dropout: float = 0.0
    tie_embeddings: bool = True

    def __post_init__(self):
        errs = ConfigErrors(type(self).__name__)
        if errs.check(self.num_heads >= 1, "num_heads", self.num_heads, ">= 1"):
            errs.check(self.dim % self.num_heads == 0, "dim", self.dim, f"a multiple of num_heads ({self.num_heads})")
        errs.check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "in [0, 1)")
        errs.raise_if_any()


@dataclass
class Train:
    lr: float = 1e-3
    decay: Literal["linear", "cosine"] = "cosine"
    betas: tuple[float, float] = (0.9, 0.95)
    seed: int | None = None
    eval_every: int | None = 100
    tags: list[str] = field(default_factory=list)
    name: str = "run"


@dataclass
class Run:
    model: Model = field(default_factory=Model)
    train: Train = field(default_factory=Train)
    head: Model | None = None


@dataclass
class Required:
    vocab_size: int


def problems(excinfo) -> list[str]:
    """The problem lines of a ConfigError message (after the header)."""
    return [line.strip() for line in str(excinfo.value).splitlines()[1:]]


def test_defaults_and_conversion():
    run = build(Run, {"train": {"lr": 1, "betas": [0.9, 1]}, "head": {"dim": 32, "num_heads": 4}})
    assert run.model == Model()
    assert run.train.lr == 1.0 and isinstance(run.train.lr, float)  # int accepted for float
    assert run.train.betas == (0.9, 1.0) and isinstance(run.train.betas, tuple)
    assert run.head == Model(dim=32, num_heads=4)


@pytest.mark.parametrize(
    "data, line",
    [
        ({"model": {"num_heads": "eight"}}, "model.num_heads: got 'eight' (str), expected int"),
        ({"model": {"num_heads": 8.0}}, "model.num_heads: got 8.0 (float), expected int"),
        ({"model": {"tie_embeddings": 1}}, "model.tie_embeddings: got 1 (int), expected bool"),
        ({"model": {"dim": True}}, "model.dim: got True (bool), expected int"),
        ({"train": {"lr": "1e-3"}}, "train.lr: got '1e-3' (str), expected float"),
        ({"train": {"decay": "cos"}}, "train.decay: got 'cos' (str), expected one of 'linear', 'cosine'"),
        ({"train": {"betas": [0.9]}}, "train.betas: got [0.9] (list), expected list of 2 items (float, float)"),
        ({"train": {"seed": "x"}}, "train.seed: got 'x' (str), expected int or None"),
        ({"train": {"eval_every": 1.5}}, "train.eval_every: got 1.5 (float), expected int or None"),
        ({"train": {"tags": ["a", 2]}}, "train.tags[1]: got 2 (int), expected str"),
        ({"train": 3}, "train: got 3 (int), expected mapping for Train"),
        ({"head": {"dim": "x"}}, "head.dim: got 'x' (str), expected int"),
        ({"model": {"num_heads": 0}}, "model.num_heads: got 0 (int), expected >= 1"),
    ],
)
def test_each_error_kind(data, line):
    with pytest.raises(ValueError) as excinfo:
        build(Run, data)
    assert problems(excinfo) == [line]


def test_unknown_key_suggests_and_lists_allowed():
    with pytest.raises(ValueError) as excinfo:
        build(Run, {"train": {"lrr": 0.1}})
    (line,) = problems(excinfo)
    assert line.startswith("train.lrr: unknown key (did you mean 'lr'?); allowed keys: ")
    assert "betas, decay, eval_every, lr, name, seed, tags" in line


def test_missing_required_field():
    with pytest.raises(ValueError, match=r"vocab_size: missing required field \(int\)"):
        build(Required, {})


def test_all_problems_reported_at_once_with_where():
    data = {
        "model": {"num_heads": "eight", "dropout": 2.0, "dimm": 3},
        "train": {"lr": None, "decay": "step"},
        "extra": 1,
    }
    with pytest.raises(ConfigError) as excinfo:
        build(Run, data, where="configs/tiny.yaml")
    msg = str(excinfo.value)
    assert msg.startswith("configs/tiny.yaml: 5 config problems:")
    lines = problems(excinfo)
    assert len(lines) == 5
    for path in ["extra:", "model.dimm:", "model.num_heads:", "train.lr:", "train.decay:"]:
        assert any(line.startswith(path) for line in lines), path
    # dropout is out of range too, but __post_init__ only runs once types are right.


def test_post_init_problems_all_collected_across_nested_configs():
    data = {"model": {"num_heads": 3, "dropout": 1.5}, "head": {"num_heads": 0}}
    with pytest.raises(ValueError) as excinfo:
        build(Run, data)
    assert problems(excinfo) == [
        "model.dim: got 64 (int), expected a multiple of num_heads (3)",
        "model.dropout: got 1.5 (float), expected in [0, 1)",
        "head.num_heads: got 0 (int), expected >= 1",
    ]


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match="num_heads: got -1"):
        Model(num_heads=-1)


def test_parse_overrides_types_values_like_yaml():
    args = [
        "--model.num_heads=4",
        "model.dropout=1e-1",
        "--train.lr",
        "1e-3",
        "--train.seed=null",
        "--model.tie_embeddings=false",
        "--train.tags=[a, b]",
        "train.name=no",
        "--train.decay=cosine",
    ]
    assert parse_overrides(args) == {
        "model": {"num_heads": 4, "dropout": 0.1, "tie_embeddings": False},
        "train": {"lr": 1e-3, "seed": None, "tags": ["a", "b"], "name": "no", "decay": "cosine"},
    }


@pytest.mark.parametrize(
    "args, match",
    [
        (["--train.lr"], "missing value"),
        (["--train.lr", "--train.seed=1"], "missing value"),
        (["train.lr"], "expected key=value"),
        (["--train..lr=1"], "not a dotted field name"),
        (["--train=1", "--train.lr=2"], "already given a value"),
        (["--x=[1, 2"], "invalid YAML"),
    ],
)
def test_parse_overrides_errors(args, match):
    with pytest.raises(ValueError, match=match):
        parse_overrides(args)


def test_merge_is_deep_and_pure():
    base = {"model": {"dim": 64, "num_heads": 8}, "train": {"lr": 0.1}}
    out = merge(base, {"model": {"dim": 128}, "train": {"tags": ["x"]}})
    assert out == {"model": {"dim": 128, "num_heads": 8}, "train": {"lr": 0.1, "tags": ["x"]}}
    assert base["model"]["dim"] == 64


def test_yaml_plus_overrides_into_build(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  dim: 32\n  num_heads: 4\ntrain:\n  lr: 3e-4\n  decay: linear\n")
    data = merge(load_yaml(path), parse_overrides(["--model.num_heads=8", "--train.seed", "1"]))
    run = build(Run, data, where=str(path))
    assert run.model == Model(dim=32, num_heads=8) and run.train.lr == 3e-4 and run.train.seed == 1


def test_load_yaml_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  dim: 32\n  num_heads: [4\ntrain: {}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: invalid YAML at line \d+"):
        load_yaml(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text("train:\n  lr: 1\n  lr: 2\n")
    with pytest.raises(ValueError, match=r"dup\.yaml: invalid YAML at line 3.*duplicate key 'lr'"):
        load_yaml(dup)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match=r"list\.yaml: the top level must be a mapping"):
        load_yaml(top)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml(empty) == {}


def test_round_trip(tmp_path):
    run = Run(
        model=Model(dim=48, num_heads=6, dropout=0.1),
        train=Train(lr=3e-4, betas=(0.9, 0.99), seed=0, tags=["no", "1e-3", "010"], name="1:30"),
        head=Model(dim=16, num_heads=2),
    )
    path = tmp_path / "sub" / "config.yaml"
    path.parent.mkdir()
    save_yaml(run, path)
    assert build(Run, load_yaml(path), where=str(path)) == run
    assert to_dict(run)["train"]["betas"] == [0.9, 0.99]  # plain lists for YAML
    assert os.listdir(path.parent) == ["config.yaml"]  # no temp file left behind
    save_yaml(dataclasses.replace(run, head=None), path)  # overwrite in place
    assert build(Run, load_yaml(path)).head is None
