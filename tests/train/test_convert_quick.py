"""`latte convert --quick`: the shipped SmolLM2 recipe with a smaller token
budget (config convert/quick), and nothing else changed."""

import dataclasses

import pytest

from latte import cli
from latte.train.task import load_run_config

BUDGET = {("train", "steps"), ("optim", "warmup_steps"), ("train", "save_every"), ("train", "keep"),
          ("train", "run_dir")}  # fmt: skip


def fields(cfg) -> dict:
    out = {}
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if dataclasses.is_dataclass(value):
            out.update({(section.name, f.name): getattr(value, f.name) for f in dataclasses.fields(value)})
        else:
            out[(section.name,)] = value
    return out


def test_quick_is_the_default_recipe_with_a_smaller_budget():
    full, quick = fields(load_run_config("convert/smollm2", [])), fields(load_run_config("convert/quick", []))
    assert {k for k in full if full[k] != quick[k]} == BUDGET
    tokens = quick[("train", "steps")] * quick[("train", "global_batch_size")] * quick[("data", "seq_len")]
    assert tokens == 81_920 and full[("train", "steps")] * 4 * 512 == 1_024_000


def test_the_quick_flag_picks_the_quick_config(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "cmd_train", lambda args: seen.append(args) or 0)
    assert cli.cmd_convert(["--quick", "--train.steps=3"]) == 0
    assert cli.cmd_convert(["--train.steps=3"]) == 0
    assert seen == [
        ["--config", "convert/quick", "--train.steps=3"],
        ["--config", "convert/smollm2", "--train.steps=3"],
    ]
    with pytest.raises(ValueError, match="--quick is the config convert/quick"):
        cli.cmd_convert(["--quick", "--config", "convert/gemma3-270m"])
