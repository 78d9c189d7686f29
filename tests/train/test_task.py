"""A second task plugs into the trainer without touching it: the toy task
(tests/train/toy_task.py) gets the config section with validation, the
logs, checkpoints with a manifest and bitwise resume, also after kill -9."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from latte.config_io import ConfigError
from latte.train.checkpoint import find_latest_checkpoint, load_checkpoint
from latte.train.loop import train
from latte.train.metrics import process_walls, read_csv, run_wall_time
from latte.train.runs import open_run
from latte.train.state import Progress
from latte.train.task import build_run_config, load_run_config, task_class
from tests.train.runs import losses, run_cli, write_config
from tests.train.toy_task import TASK, ToyRunConfig, ToyTask


def toy_config(run_dir, **train_fields) -> ToyRunConfig:
    data = {
        "task": TASK,
        "toy": {"hidden": 16},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "decay": "constant", "weight_decay": 0.0},
        "train": {
            "steps": 8,
            "global_batch_size": 32,
            "eval_every": 4,
            "save_every": 4,
            "log_every": 1,
            "run_dir": str(run_dir),
            "tensorboard": False,
            "num_threads": 1,
            **train_fields,
        },
    }
    cfg = build_run_config(data, where="toy")
    assert isinstance(cfg, ToyRunConfig)
    return cfg


def test_toy_task_trains_with_its_own_units_and_metrics(tmp_path):
    summary = train(toy_config(tmp_path / "run"))
    run = tmp_path / "run"
    assert summary["task"] == TASK and summary["examples_seen"] == 8 * 32
    assert summary["val_accuracy"] > 0.6 and summary["val_examples"] == 64  # chance is ~0.5
    rows = read_csv(run / "metrics.csv")
    assert (
        list(rows[0]) == ["step", "loss", "lr", "grad_norm", "examples", "examples_per_s", "applied", "elapsed_s"]
        and rows[-1]["examples"] == "32"
    )
    val = read_csv(run / "val.csv")
    assert [r["step"] for r in val] == ["4", "8"] and {"val_loss", "val_accuracy"} <= set(val[0])
    ckpt = load_checkpoint(find_latest_checkpoint(run))
    assert ckpt.step == 8 and ckpt.config["task"] == TASK and ckpt.trainer_state["examples_seen"] == 256
    assert set(ckpt.model_state) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert json.loads((run / "summary.json").read_text())["val_accuracy"] == summary["val_accuracy"]


def test_toy_task_resumes_bitwise_in_process(tmp_path):
    train(toy_config(tmp_path / "straight"))
    train(toy_config(tmp_path / "cut", time_budget_minutes=1e-9))  # stops (and saves) after step 1
    assert [s for s, _ in losses(tmp_path / "cut")] == [1]
    train(toy_config(tmp_path / "cut"))
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")


def test_wall_time_counts_every_process_of_a_resumed_run(tmp_path):
    """summary.json's wall_time_s is the run's, over all its processes (the
    checkpoints carry it on); process_wall_time_s is the last process's."""
    run = tmp_path / "cut"
    first = train(toy_config(run, time_budget_minutes=1e-9))  # stops (and saves) after step 1
    assert first["wall_time_s"] == first["process_wall_time_s"] > 0
    saved = load_checkpoint(find_latest_checkpoint(run)).trainer_state["wall_s"]
    assert 0 < saved <= first["wall_time_s"]
    second = train(toy_config(run))
    assert second["wall_time_s"] == pytest.approx(saved + second["process_wall_time_s"])
    assert second["wall_time_s"] > second["process_wall_time_s"] and "wall_time_estimated" not in second
    assert json.loads((run / "summary.json").read_text())["wall_time_s"] == second["wall_time_s"]
    assert run_wall_time(run) == second["wall_time_s"]


def test_wall_time_of_checkpoints_older_than_wall_s_is_read_from_metrics_csv(tmp_path, monkeypatch):
    run = tmp_path / "old"
    state_dict = Progress.state_dict
    monkeypatch.setattr(
        Progress, "state_dict", lambda self: {k: v for k, v in state_dict(self).items() if k != "wall_s"}
    )
    train(toy_config(run, time_budget_minutes=1e-9))
    assert "wall_s" not in load_checkpoint(find_latest_checkpoint(run)).trainer_state
    first_elapsed = float(read_csv(run / "metrics.csv")[0]["elapsed_s"])
    monkeypatch.undo()
    second = train(toy_config(run))
    assert second["wall_time_estimated"] is True
    assert second["wall_time_s"] == pytest.approx(first_elapsed + second["process_wall_time_s"])
    assert process_walls(run / "metrics.csv", upto_step=1) == [first_elapsed]


def test_run_wall_time_of_a_summary_from_before_process_wall_time_s(tmp_path):
    """Such a summary's wall_time_s is its last process's alone: the earlier
    ones come from metrics.csv, each the last elapsed_s before it restarts."""
    rows = [(1, 50.0), (2, 80.0), (3, 20.0), (4, 45.0), (5, 70.0), (6, 30.0)]
    lines = ["step,loss,lr,grad_norm,tokens,tokens_per_s,applied,elapsed_s"]
    lines += [f"{s},1.0,0.1,1.0,8,1.0,1,{e}" for s, e in rows]
    (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert process_walls(tmp_path / "metrics.csv") == [80.0, 70.0, 30.0]
    assert process_walls(tmp_path / "metrics.csv", upto_step=4) == [80.0, 45.0]
    (tmp_path / "summary.json").write_text(json.dumps({"step": 6, "wall_time_s": 40.0}))
    assert run_wall_time(tmp_path) == 80.0 + 70.0 + 40.0
    (tmp_path / "summary.json").write_text(json.dumps({"wall_time_s": 190.0, "process_wall_time_s": 40.0}))
    assert run_wall_time(tmp_path) == 190.0
    assert run_wall_time(tmp_path / "missing") is None


@pytest.mark.slow
def test_toy_task_survives_kill_9_via_the_cli(tmp_path):
    train(toy_config(tmp_path / "straight"))
    path = write_config(toy_config(tmp_path / "killed"), tmp_path / "toy.yaml")
    proc = run_cli(["train", "--config", str(path)], faults="kill_after_save=4")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert find_latest_checkpoint(tmp_path / "killed").name == "step-00000004"
    proc = run_cli(["train", "--config", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")


def test_task_sections_are_validated_like_the_rest(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_run_config({"task": TASK, "toy": {"hidden": 0, "layers": 2}, "train": {"stepz": 1}}, where="x")
    msg = str(e.value)
    assert "toy.layers: unknown key" in msg and "train.stepz: unknown key" in msg
    with pytest.raises(ConfigError, match=r"toy.hidden: got 0 \(int\), expected >= 1"):
        build_run_config({"task": TASK, "toy": {"hidden": 0}}, where="x")
    with pytest.raises(ConfigError, match="data: unknown key"):  # the LM's sections are not the toy's
        build_run_config({"task": TASK, "data": {"seq_len": 8}}, where="x")


def test_task_names_resolve_or_fail_clearly(tmp_path):
    assert task_class("lm").__name__ == "LanguageModelingTask" and task_class(TASK) is ToyTask
    with pytest.raises(
        ConfigError,
        match=r"task: got 'nope', expected one of 'lm', 'classification', 'convert' or 'package.module:Class'",
    ):
        build_run_config({"task": "nope"}, where="x")
    with pytest.raises(ConfigError, match="cannot import tests.train.nothing:X"):
        task_class("tests.train.nothing:X")
    with pytest.raises(ConfigError, match="is not a latte.train.task.Task subclass"):
        task_class("tests.train.toy_task:ToyConfig")
    cfg = load_run_config(None, ["--task=lm"])  # the shipped LM configs name no task: "lm" by default
    assert cfg.task == "lm"


def test_resuming_with_another_task_is_refused(tmp_path, make_config):
    train(make_config(run_dir=tmp_path / "run", **{"train.steps": 1, "optim.warmup_steps": 1}))
    with pytest.raises(ValueError, match="trained with task 'lm', the config says task 'tests.train.toy_task"):
        train(toy_config(tmp_path / "run"))


def test_frozen_weights_are_not_trained_and_checkpoints_keep_only_what_is(tmp_path):
    """FrozenToyTask trains only its last layer and saves only that: the
    frozen layer stays at its seeded initial value, resume is still exact,
    and a trained run opens for inference from the partial checkpoint."""
    frozen = "tests.train.toy_task:FrozenToyTask"

    def config(run_dir, **fields):
        cfg = toy_config(run_dir, **fields)
        cfg.task = frozen
        return cfg

    train(config(tmp_path / "straight"))
    ckpt = load_checkpoint(find_latest_checkpoint(tmp_path / "straight"))
    assert set(ckpt.model_state) == {"2.weight", "2.bias"}
    assert len(ckpt.optimizer_state["state"]) == 2  # moments of the trained tensors only
    torch.manual_seed(123)  # whatever the caller's RNG state, the frozen weights come back as trained
    trained = open_run(tmp_path / "straight")
    torch.manual_seed(0)  # train.seed: what build_model gave the trainer
    initial = trained.task.build_model()
    assert torch.equal(trained.model[0].weight, initial[0].weight)  # frozen: untouched, rebuilt
    assert torch.equal(trained.model[2].weight, ckpt.model_state["2.weight"])
    assert not torch.equal(trained.model[2].weight, initial[2].weight)
    train(config(tmp_path / "cut", time_budget_minutes=1e-9))
    train(config(tmp_path / "cut"))
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")
