"""Sequence classification (`task: classification`): a bidirectional
encoder trained on one of the Long Range Arena tasks.

    data        `latte.data.lra.load_task`: ListOps / Pathfinder generated
                (seeded, cached, parallel; rank 0 builds, the others read
                the cache), Text / Retrieval / Image from local files
    model       LatteForSequenceClassification (mean or cls pooling;
                a classification token is prepended for cls), or the
                two-tower LatteForPairClassification for retrieval
    batches     BucketedSampleLoader: similar lengths per batch, a
                resumable global sample index
    loss        summed cross-entropy, counted in examples
    evaluate    loss, accuracy, balanced accuracy and macro-F1 from a
                confusion matrix summed over ranks; periodic ones on the
                first train.eval_batches global batches of validation, the
                final one on the whole validation AND test splits
    summary     the majority-class baseline (the most frequent training
                label) on test, label counts, the data's provenance
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from latte.config_io import ConfigError, ConfigErrors
from latte.data import iter_eval_batches
from latte.data.classification import BucketedSampleLoader, ClassificationData, majority_baseline
from latte.data.lra import VOCAB, ListOpsSpec, PathfinderSpec, load_task
from latte.files import atomic_write
from latte.models import LatteConfig, LatteForPairClassification, LatteForSequenceClassification, num_parameters
from latte.train import distributed as D
from latte.train.checkpoint import Checkpoint
from latte.train.config import ModelConfig, RunConfig
from latte.train.task import Batch, Task


@dataclass
class ClassificationDataConfig:
    """dataset: one of the LRA tasks. Generated ones (listops, pathfinder) use
    the *_examples counts, `seed` and the generator fields; the others read
    `path` (a local copy of the published files; never downloaded).
    max_length: bytes kept per document (text, retrieval). num_workers:
    generator processes (null: every usable core). bucket_batches: global
    batches per length-sorted window of the training order (1: no bucketing)."""

    dataset: Literal["listops", "pathfinder", "text", "retrieval", "image"] = "listops"
    path: str | None = None
    train_examples: int = 20000
    validation_examples: int = 1000
    test_examples: int = 1000
    seed: int = 0
    max_length: int = 4000
    cache_dir: str = "runs/.cache"
    num_workers: int | None = None
    bucket_batches: int = 16
    listops_min_length: int = 500
    listops_max_length: int = 2000
    listops_max_depth: int = 10
    listops_max_args: int = 10
    pathfinder_contour_length: int = 14

    def __post_init__(self):
        e = ConfigErrors(type(self).__name__)
        for name in ("train_examples", "validation_examples", "test_examples", "max_length", "bucket_batches"):
            e.check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        if self.num_workers is not None:
            e.check(self.num_workers >= 1, "num_workers", self.num_workers, ">= 1 or null (every core)")
        e.check(bool(self.cache_dir), "cache_dir", self.cache_dir, "a non-empty path")
        try:
            self.listops_spec(), self.pathfinder_spec()
        except ValueError as err:
            e.check(False, "listops_* / pathfinder_*", "", str(err))
        e.raise_if_any()

    def listops_spec(self) -> ListOpsSpec:
        return ListOpsSpec(
            max_depth=self.listops_max_depth,
            max_args=self.listops_max_args,
            min_length=self.listops_min_length,
            max_length=self.listops_max_length,
        )

    def pathfinder_spec(self) -> PathfinderSpec:
        return PathfinderSpec(contour_length=self.pathfinder_contour_length)


@dataclass
class ClassifierModelConfig(ModelConfig):
    """The LatteConfig fields of a bidirectional encoder (causal=False;
    num_labels and vocab_size come from the dataset). Bidirectional mixers
    only: latte, softmax, linear. An encoder needs absolute positions (the
    LRA models' learned or sinusoidal embeddings)."""

    mixer: Literal["latte", "softmax", "linear"] | list[Literal["latte", "softmax", "linear"]] = "latte"
    position_embedding: Literal["none", "learned", "sinusoidal"] = "sinusoidal"
    pooling: Literal["mean", "cls"] = "mean"
    causal: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.position_embedding == "none" and self.qk_mixer in (None, "none"):
            raise ConfigError(
                type(self).__name__,
                [
                    (
                        "position_embedding",
                        "got 'none': with qk_mixer 'none' the encoder would not see token order; "
                        "use 'learned' or 'sinusoidal' (or qk_mixer 'conv')",
                    )
                ],
            )

    def to_latte_config(self, vocab_size: int, num_labels: int = 2) -> LatteConfig:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(LatteConfig)}
        return LatteConfig(**{**fields, "vocab_size": self.vocab_size or vocab_size, "num_labels": num_labels})


@dataclass
class ClassificationRunConfig(RunConfig):
    """Sequence classification on an LRA task (task "classification")."""

    task: str = "classification"
    data: ClassificationDataConfig = field(default_factory=ClassificationDataConfig)
    model: ClassifierModelConfig = field(default_factory=ClassifierModelConfig)


class ClassificationTask(Task):
    name = "classification"
    config_class = ClassificationRunConfig
    unit = "examples"
    cfg: ClassificationRunConfig

    splits: dict[str, ClassificationData]
    info: dict

    # ------------------------------------------------------------------ setup

    def prepare(self, run_dir: Path, checkpoint: Checkpoint | None) -> None:
        env = self.env
        if env.is_main:  # rank 0 generates (and caches) first; the other ranks then read the cache
            self._load(log=lambda text: print(text, file=sys.stderr))
        D.barrier(env)
        if not env.is_main:
            self._load(log=None)
        if env.is_main:
            atomic_write(run_dir / "data.json", json.dumps(self.info, indent=1) + "\n")
        self._check_positions()

    def _load(self, log) -> None:
        d = self.cfg.data
        sizes = {"train": d.train_examples, "validation": d.validation_examples, "test": d.test_examples}
        self.splits, self.info = load_task(
            d.dataset,
            path=d.path,
            sizes=sizes,
            seed=d.seed,
            cache_dir=d.cache_dir,
            num_workers=d.num_workers,
            max_length=d.max_length,
            listops_spec=d.listops_spec(),
            pathfinder_spec=d.pathfinder_spec(),
            log=log,
        )
        if self.cfg.model.pooling == "cls":
            self.splits = {s: data.with_cls(self.info["cls_id"]) for s, data in self.splits.items()}
        for s, data in self.splits.items():
            data.check_ids(self.vocab_size, where=f"{d.dataset} {s} split")

    def input_files(self) -> dict[str, Path]:
        """The published files under data.path (generated tasks read none)."""
        path = Path(self.cfg.data.path).expanduser() if self.cfg.data.path else None
        if path is None or not path.exists():
            return {}
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        return {f"data.path:{p.resolve()}": p for p in found if not p.name.startswith(".")}

    def prepare_inference(self, checkpoint: Checkpoint) -> None:
        num_classes, vocab_size, cls_id = VOCAB[self.cfg.data.dataset]
        self.info = {
            "vocab_size": vocab_size,
            "num_classes": num_classes,
            "cls_id": cls_id,
            "pair": self.cfg.data.dataset == "retrieval",
        }

    def _check_positions(self) -> None:
        m, longest = self.cfg.model, max(s.max_length() for s in self.splits.values())
        if m.position_embedding != "none" and longest > m.max_position_embeddings:
            raise ConfigError(
                "ClassificationRunConfig",
                [
                    (
                        "model.max_position_embeddings",
                        f"got {m.max_position_embeddings}, but the {self.cfg.data.dataset} "
                        f"data holds inputs of {longest} tokens (the classification token included); "
                        f"raise it to >= {longest}",
                    )
                ],
            )

    @property
    def vocab_size(self) -> int:
        return self.cfg.model.vocab_size or self.info["vocab_size"]

    def build_model(self) -> nn.Module:
        config = self.cfg.model.to_latte_config(self.vocab_size, self.info["num_classes"])
        return (LatteForPairClassification if self.info["pair"] else LatteForSequenceClassification)(config)

    def train_batches(self, start_index: int) -> BucketedSampleLoader:
        t = self.cfg.train
        return BucketedSampleLoader(
            self.splits["train"],
            bucket_batches=self.cfg.data.bucket_batches,
            global_batch_size=t.global_batch_size,
            rank=self.env.rank,
            world_size=self.env.world_size,
            seed=t.seed,
            start_index=start_index,
        )

    def architecture_fields(self) -> set[str]:
        model = {f"model.{f.name}" for f in dataclasses.fields(ClassifierModelConfig) if f.name != "dropout"}
        return model | {"data.dataset"}

    # ------------------------------------------------------------------ training

    def count(self, batch: Batch) -> int:
        return int(batch["labels"].numel())

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(_logits(model, batch).float(), batch["labels"], reduction="sum")

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, model: nn.Module, *, final: bool) -> dict[str, float]:
        t = self.cfg.train
        return self._score(model, self.splits["validation"], 0 if final else t.eval_batches * t.global_batch_size)

    def _score(self, model: nn.Module, data: ClassificationData, limit: int) -> dict[str, float]:
        """Loss and confusion-matrix metrics of the first `limit` examples (0: all), summed over ranks."""
        env, n = self.env, self.info["num_classes"]
        view = _Subset(data, limit) if limit else data
        batch_size = max(1, self.cfg.train.global_batch_size // env.world_size)
        confusion = np.zeros((n, n), dtype=np.float64)  # [true, predicted]
        loss_sum, t0 = 0.0, time.perf_counter()
        was_training = model.training
        model.eval()
        for batch in _eval_batches(view, batch_size, env, self.lockstep):
            batch = {k: v.to(env.device) for k, v in batch.items()}
            logits = _logits(model, batch).float()
            if batch.pop("_dummy", None) is not None:  # lockstep filler: a forward, no counts
                continue
            loss_sum += float(F.cross_entropy(logits, batch["labels"], reduction="sum"))
            np.add.at(confusion, (batch["labels"].cpu().numpy(), logits.argmax(-1).cpu().numpy()), 1)
        model.train(was_training)
        sums = self.sum_over_ranks(loss_sum, *confusion.reshape(-1).tolist())
        return {
            **confusion_metrics(np.array(sums[1:]).reshape(n, n)),
            "loss": sums[0] / max(1.0, sum(sums[1:])),
            "examples_per_s": sum(sums[1:]) / max(time.perf_counter() - t0, 1e-9),
        }

    def eval_size(self, *, final: bool) -> int:
        t, n = self.cfg.train, len(self.splits["validation"])
        # the final evaluation is followed by the test split (in `summary`)
        return n + len(self.splits["test"]) if final else min(n, t.eval_batches * t.global_batch_size)

    @torch.no_grad()
    def summary(self, model: nn.Module, metrics: dict) -> dict:
        """The test split's metrics, and the majority-class baseline on it."""
        test = self._score(model, self.splits["test"], 0)
        majority, baseline = majority_baseline(self.splits["train"], self.splits["test"])
        return {
            **{f"test_{k}": v for k, v in test.items()},
            "dataset": self.cfg.data.dataset,
            "majority_class": majority,
            "majority_baseline": baseline,
            "label_counts": self.info["label_counts"],
            "split_examples": self.info["examples"],
        }

    def format_metrics(self, m: dict) -> str:
        text = (
            f"accuracy {m['accuracy']:.4f} (balanced {m['balanced_accuracy']:.4f}, loss {m['loss']:.4f}, "
            f"{int(m['examples']):,} examples)"
        )
        if "test_accuracy" in m:
            text += f"; test accuracy {m['test_accuracy']:.4f} (balanced {m['test_balanced_accuracy']:.4f})"
        if "majority_baseline" in m:
            text += f" vs majority-class baseline {m['majority_baseline']:.4f}"
        return text

    def describe(self, model: nn.Module) -> str:
        c, info = self.cfg, self.info
        n = {s: len(d) for s, d in self.splits.items()}
        return (
            f"{c.data.dataset}: {c.model.mixer} dim {c.model.dim} x {c.model.num_layers} layers, "
            f"{c.model.pooling} pooling, {num_parameters(D.unwrap(model)):,} parameters; "
            f"{info['num_classes']} classes, vocab {info['vocab_size']}; train {n['train']:,}, validation "
            f"{n['validation']:,}, test {n['test']:,} examples (inputs up to {info['max_length']} tokens); "
            f"batch {c.train.global_batch_size}"
        )


def _logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    if "input_ids_2" in batch:
        return model(
            batch["input_ids"],
            batch["input_ids_2"],
            attention_mask=batch["attention_mask"],
            attention_mask_2=batch["attention_mask_2"],
        ).logits
    return model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits


class _Subset:
    """The first `limit` examples of a split (for periodic evaluations)."""

    def __init__(self, data: ClassificationData, limit: int):
        self.data, self.n = data, min(limit, len(data))

    def __len__(self) -> int:
        return self.n

    def batch(self, indices) -> Batch:
        return self.data.batch(indices)


def _eval_batches(data, batch_size: int, env: D.DistEnv, lockstep: bool):
    """This rank's share of `data`; under FSDP2 (lockstep) every rank runs
    the same number of forwards, the ranks with fewer batches repeating a
    batch marked `_dummy` whose counts are dropped."""
    batches = iter_eval_batches(data, batch_size, rank=env.rank, world_size=env.world_size)
    if not lockstep:
        yield from batches
        return
    mine = -(-len(range(env.rank, len(data), env.world_size)) // batch_size)
    most = -(-len(range(0, len(data), env.world_size)) // batch_size)  # rank 0 has the most
    yield from batches
    for _ in range(most - mine):
        yield {**data.batch([0]), "_dummy": torch.ones(1)}


def confusion_metrics(confusion: np.ndarray) -> dict[str, float]:
    """accuracy, balanced accuracy (the mean recall over the classes that
    occur) and macro-F1 (over the same classes) of a [true, predicted] matrix."""
    total = confusion.sum()
    tp = np.diag(confusion)
    support, predicted = confusion.sum(1), confusion.sum(0)
    present = support > 0
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=present)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(tp), where=precision + recall > 0)
    return {
        "accuracy": float(tp.sum() / total) if total else float("nan"),
        "balanced_accuracy": float(recall[present].mean()) if present.any() else float("nan"),
        "macro_f1": float(f1[present].mean()) if present.any() else float("nan"),
        "examples": int(total),
    }
