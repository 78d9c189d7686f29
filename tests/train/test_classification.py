"""`latte train` with the classification task: end to end on tiny LRA data
in seconds, exact resume (in process and after kill -9), torchrun, the
two-tower retrieval path, metrics, and config errors."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch

from latte.config_io import ConfigError, merge, parse_overrides
from latte.train.classification import ClassificationRunConfig, confusion_metrics
from latte.train.loop import train
from latte.train.metrics import read_csv
from latte.train.runs import open_run
from latte.train.task import build_run_config, load_run_config
from tests.train.runs import losses, run_cli, write_config

TINY = {
    "data.train_examples": 24,
    "data.validation_examples": 6,
    "data.test_examples": 10,
    "data.num_workers": 1,
    "data.listops_min_length": 20,
    "data.listops_max_length": 60,
    "data.listops_max_depth": 4,
    "data.bucket_batches": 2,
    "model.dim": 16,
    "model.num_layers": 1,
    "model.num_heads": 2,
    "model.latents_per_head": 2,
    "optim.warmup_steps": 1,
    "train.steps": 6,
    "train.global_batch_size": 4,
    "train.eval_every": 3,
    "train.eval_batches": 1,
    "train.save_every": 2,
    "train.log_every": 1,
    "train.tensorboard": False,
    "train.num_threads": 1,
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("lra-cache")


def config(run_dir, cache, name="lra/listops", **overrides) -> ClassificationRunConfig:
    items = {**TINY, "data.cache_dir": cache, "train.run_dir": run_dir, **overrides}
    cfg = load_run_config(name, [f"{k}={v}" for k, v in items.items()])
    assert isinstance(cfg, ClassificationRunConfig)
    return cfg


@pytest.mark.parametrize("mixer", ["latte", "softmax", "linear"])
def test_listops_trains_end_to_end(tmp_path, cache, mixer):
    summary = train(config(tmp_path / "run", cache, **{"model.mixer": mixer}))
    run = tmp_path / "run"
    assert summary["task"] == "classification" and summary["examples_seen"] == 6 * 4
    for key in ("val_accuracy", "val_balanced_accuracy", "test_accuracy", "test_macro_f1", "majority_baseline"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert summary["test_examples"] == 10 and summary["val_examples"] == 6
    counts = summary["label_counts"]["train"]
    assert sum(counts) == 24 and summary["majority_baseline"] == pytest.approx(
        summary["label_counts"]["test"][int(np.argmax(counts))] / 10
    )
    assert [r["step"] for r in read_csv(run / "val.csv")] == ["3", "6"]
    assert json.loads((run / "data.json").read_text())["examples"] == {"train": 24, "validation": 6, "test": 10}
    reopened = open_run(run)  # the model comes back from the checkpoint without the data
    assert type(reopened.model).__name__ == "LatteForSequenceClassification"


def test_cls_pooling_prepends_the_token(tmp_path, cache):
    cfg = config(tmp_path / "run", cache, **{"model.pooling": "cls", "train.steps": 2})
    train(cfg)
    data = json.loads((tmp_path / "run" / "data.json").read_text())
    assert data["cls_id"] == 1
    # the task's batches start with the classification token
    from latte.train import distributed as D
    from latte.train.classification import ClassificationTask

    task = ClassificationTask(cfg, D.DistEnv())
    task.prepare(tmp_path / "run", None)
    batch = next(task.train_batches(0))
    assert (batch["input_ids"][:, 0] == 1).all() and batch["attention_mask"][:, 0].all()


def test_resume_is_exact(tmp_path, cache):
    train(config(tmp_path / "straight", cache))
    train(config(tmp_path / "cut", cache, **{"train.time_budget_minutes": 1e-9}))  # stops after step 1
    assert [s for s, _ in losses(tmp_path / "cut")] == [1]
    summary = train(config(tmp_path / "cut", cache))
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["test_accuracy"] == straight["test_accuracy"] and summary["val_loss"] == straight["val_loss"]


@pytest.mark.slow
def test_resume_after_kill_9_via_the_cli(tmp_path, cache):
    train(config(tmp_path / "straight", cache, **{"model.mixer": "linear"}))
    path = write_config(config(tmp_path / "killed", cache, **{"model.mixer": "linear"}), tmp_path / "c.yaml")
    proc = run_cli(["train", "--config", str(path)], faults="kill_after_save=4")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    proc = run_cli(["train", "--config", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path, cache):
    """torchrun (gloo): 2 ranks x 2 examples == 1 process x 4, weights and metrics."""
    single = config(tmp_path / "single", cache, **{"train.steps": 4})
    train(single)
    path = write_config(config(tmp_path / "ddp", cache, **{"train.steps": 4}), tmp_path / "ddp.yaml")
    proc = run_cli(["train", "--config", str(path)], torchrun=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref, got = (open_run(tmp_path / name).model.state_dict() for name in ("single", "ddp"))
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5, msg=k)
    a, b = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("single", "ddp"))
    assert a["test_examples"] == b["test_examples"] == 10  # every test example scored once over the ranks
    assert a["test_accuracy"] == b["test_accuracy"] and a["val_accuracy"] == b["val_accuracy"]


def test_pathfinder_trains(tmp_path, cache):
    overrides = {k: v for k, v in TINY.items() if not k.startswith("data.listops")}
    summary = train(
        config(tmp_path / "run", cache, "lra/pathfinder", **{**overrides, "train.steps": 2, "data.train_examples": 8})
    )
    assert summary["test_examples"] == 10 and sum(summary["label_counts"]["train"]) == 8


def test_retrieval_pairs_train_the_two_tower_model(tmp_path, cache):
    folder = tmp_path / "tsv_data"
    folder.mkdir()
    for split, name in (
        ("train", "new_aan_pairs.train.tsv"),
        ("eval", "new_aan_pairs.eval.tsv"),
        ("test", "new_aan_pairs.test.tsv"),
    ):
        rows = [f"{i % 2}.0\tA{i}\tB{i}\tpaper {i} on {split} " + "x" * (i % 7) + f"\tcited {i}" for i in range(12)]
        (folder / name).write_text("\n".join(rows) + "\n")
    overrides = {k: v for k, v in TINY.items() if not k.startswith("data.listops")}
    cfg = config(
        tmp_path / "run",
        cache,
        "lra/listops",
        **{
            **overrides,
            "data.dataset": "retrieval",
            "data.path": folder,
            "data.max_length": 40,
            "model.max_position_embeddings": 64,
        },
    )
    summary = train(cfg)
    assert summary["test_examples"] == 12
    assert type(open_run(tmp_path / "run").model).__name__ == "LatteForPairClassification"


def test_config_errors(tmp_path, cache):
    with pytest.raises(ConfigError, match="model.mixer"):
        config(tmp_path / "a", cache, **{"model.mixer": "macchiato"})
    with pytest.raises(ConfigError, match="would not see token order"):
        config(tmp_path / "b", cache, **{"model.position_embedding": "none"})
    with pytest.raises(ConfigError, match="data.dataset"):
        config(tmp_path / "c", cache, **{"data.dataset": "imdb"})
    with pytest.raises(ConfigError, match="data.train_examples: got 0"):
        config(tmp_path / "d", cache, **{"data.train_examples": 0})
    with pytest.raises(ConfigError, match=r"model.max_position_embeddings: got 32, .* raise it to >= "):
        train(config(tmp_path / "e", cache, **{"model.max_position_embeddings": 32}))
    with pytest.raises(ValueError, match="set data.path"):
        train(config(tmp_path / "f", cache, **{"data.dataset": "text"}))
    # a classification section is not the LM's
    with pytest.raises(ConfigError, match="data.source: unknown key"):
        build_run_config(merge({"task": "classification"}, parse_overrides(["data.source=x"])), where="x")


def test_confusion_metrics():
    confusion = np.array([[5, 1, 0], [2, 2, 0], [0, 0, 0]], dtype=float)  # class 2 never occurs
    m = confusion_metrics(confusion)
    assert m["accuracy"] == pytest.approx(7 / 10) and m["examples"] == 10
    assert m["balanced_accuracy"] == pytest.approx((5 / 6 + 2 / 4) / 2)
    f1_0 = 2 * (5 / 7) * (5 / 6) / (5 / 7 + 5 / 6)
    f1_1 = 2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4)
    assert m["macro_f1"] == pytest.approx((f1_0 + f1_1) / 2)


@pytest.mark.parametrize("dataset", ["listops", "pathfinder"])
def test_shipped_lra_configs_are_like_for_like(dataset):
    """The mixer is the only thing `python -m experiments.lra` changes; the model
    fits the dataset's longest input."""
    from latte.data.lra import VOCAB

    cfg = load_run_config(f"lra/{dataset}")
    assert cfg.task == "classification" and cfg.data.dataset == dataset and cfg.model.mixer == "latte"
    assert cfg.train.run_dir == f"runs/lra/{dataset}" and cfg.train.num_threads <= 2
    num_classes, vocab_size, _ = VOCAB[dataset]
    assert cfg.model.to_latte_config(vocab_size, num_classes).causal is False
    longest = cfg.data.listops_max_length if dataset == "listops" else 32 * 32
    assert cfg.model.max_position_embeddings >= longest
    other = load_run_config("lra/listops" if dataset == "pathfinder" else "lra/pathfinder")
    assert (cfg.optim, cfg.train.steps, cfg.train.global_batch_size) == (
        other.optim,
        other.train.steps,
        other.train.global_batch_size,
    )
