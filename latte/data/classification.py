"""Sequence classification data: variable-length token sequences with labels.

    seqs = Sequences.from_list([[5, 6, 7], [8, 9]], vocab_size=17)
    data = ClassificationData(seqs, labels, num_classes=10, vocab_size=17, cls_id=1)
    loader = SampleLoader(data, global_batch_size=32, seed=0)     # resumable, rank-aware
    batch = next(loader)    # {"input_ids", "attention_mask", "labels"} (+ "*_2" for pairs)

Sequences are stored flat (one token array and N + 1 offsets) so a split of
100K examples is three arrays that load with memmap and need no pickling.
A batch is padded on the right to its longest member (dynamic padding) and
carries an attention mask; a `cls_id` is prepended to every sequence when
the model pools on a classification token. Pairs (the retrieval task: two
documents, one label) hold a second `Sequences` and batch it under the same
keys with the suffix `_2`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from latte.data.loader import SampleLoader, _epoch_seed
from latte.data.packing import check_token_ids, token_dtype
from latte.files import atomic_write


@dataclass
class Sequences:
    """N token sequences: sequence i is tokens[offsets[i]:offsets[i + 1]]."""

    tokens: np.ndarray  # [total] integer ids
    offsets: np.ndarray  # [N + 1] int64, non-decreasing, offsets[0] == 0

    def __post_init__(self):
        self.tokens, self.offsets = np.asarray(self.tokens), np.asarray(self.offsets)
        o = self.offsets
        if self.tokens.ndim != 1 or o.ndim != 1 or len(o) < 1:
            raise ValueError(f"Sequences: expected 1-D tokens and offsets, got shapes {self.tokens.shape}, {o.shape}")
        if o[0] != 0 or o[-1] != len(self.tokens) or (len(o) > 1 and bool((np.diff(o) < 0).any())):
            raise ValueError(
                f"Sequences: offsets must rise from 0 to len(tokens)={len(self.tokens)}, "
                f"got {o[:3].tolist()}...{o[-1:].tolist()}"
            )

    @classmethod
    def from_list(cls, seqs: Iterable[Sequence[int]], *, vocab_size: int) -> Sequences:
        arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        dtype = np.uint8 if vocab_size <= 256 else token_dtype(vocab_size)
        tokens = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def save(self, prefix: Path) -> None:
        np.save(f"{prefix}.tokens.npy", self.tokens)
        np.save(f"{prefix}.offsets.npy", self.offsets)

    @classmethod
    def load(cls, prefix: Path) -> Sequences:
        return cls(np.load(f"{prefix}.tokens.npy", mmap_mode="r"), np.load(f"{prefix}.offsets.npy"))


class ClassificationData:
    """A split of a sequence classification task (one or two inputs per label).

    Duck-types the `TokenWindows` interface that `SampleLoader` and
    `iter_eval_batches` use (`len`, `batch(indices)`, `check_ids`), so the
    language-model loader serves classification batches unchanged: same
    shuffling per (seed, epoch), same single-integer resume state.
    """

    def __init__(
        self,
        inputs: Sequences | tuple[Sequences, Sequences],
        labels,
        *,
        num_classes: int,
        vocab_size: int,
        pad_id: int = 0,
        cls_id: int | None = None,
    ):
        pair = isinstance(inputs, tuple)
        self.inputs: tuple[Sequences, ...] = inputs if pair else (inputs,)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.num_classes, self.vocab_size = num_classes, vocab_size
        self.pad_id, self.cls_id = pad_id, cls_id
        if len(self.inputs) not in (1, 2) or any(len(s) != len(self.labels) for s in self.inputs):
            raise ValueError(
                f"ClassificationData: {len(self.labels)} labels but inputs of {[len(s) for s in self.inputs]} sequences"
            )
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= num_classes):
            raise ValueError(
                f"ClassificationData: labels must be in [0, {num_classes - 1}], "
                f"got [{self.labels.min()}, {self.labels.max()}]"
            )
        for s in self.inputs:
            if len(s) and int(s.lengths.min()) == 0 and cls_id is None:
                raise ValueError("ClassificationData: an empty sequence needs cls_id (a model needs >= 1 token)")

    @property
    def is_pair(self) -> bool:
        return len(self.inputs) == 2

    def __len__(self) -> int:
        return len(self.labels)

    def max_length(self) -> int:
        """The longest model input (the classification token included)."""
        longest = max((int(s.lengths.max()) if len(s) else 0) for s in self.inputs)
        return longest + (self.cls_id is not None)

    def label_counts(self) -> np.ndarray:
        return np.bincount(self.labels, minlength=self.num_classes)

    def check_ids(self, vocab_size: int, *, where: str) -> None:
        for s in self.inputs:
            check_token_ids(s.tokens, vocab_size, where=where)

    def batch(self, indices) -> dict[str, torch.Tensor]:
        """{"input_ids" [B, T] int64, "attention_mask" [B, T] bool, "labels" [B]},
        plus "input_ids_2" / "attention_mask_2" for pairs; T = the longest
        sequence of this batch (right padding with pad_id)."""
        idx = [int(i) for i in indices]
        out = {"labels": torch.from_numpy(self.labels[idx].copy())}
        for k, seqs in enumerate(self.inputs):
            ids, mask = self._pad([seqs[i] for i in idx])
            suffix = "" if k == 0 else "_2"
            out["input_ids" + suffix], out["attention_mask" + suffix] = ids, mask
        return out

    def _pad(self, rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        extra = self.cls_id is not None
        T = max(len(r) for r in rows) + extra
        ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=bool)
        for b, r in enumerate(rows):
            if extra:
                ids[b, 0] = self.cls_id
            ids[b, extra : extra + len(r)] = r
            mask[b, : extra + len(r)] = True
        return torch.from_numpy(ids), torch.from_numpy(mask)

    # ------------------------------------------------------------------ disk

    def save(self, folder: Path, split: str) -> None:
        """folder/{split}.labels.npy, {split}[.2].tokens/offsets.npy and {split}.json."""
        folder = Path(folder)
        np.save(folder / f"{split}.labels.npy", self.labels)
        for k, s in enumerate(self.inputs):
            s.save(folder / (split if k == 0 else f"{split}.2"))
        meta = {
            "num_classes": self.num_classes,
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            "cls_id": self.cls_id,
            "pair": self.is_pair,
            "examples": len(self),
        }
        atomic_write(folder / f"{split}.json", json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, folder: Path, split: str) -> ClassificationData:
        folder = Path(folder)
        meta = json.loads((folder / f"{split}.json").read_text())
        first = Sequences.load(folder / split)
        inputs = (first, Sequences.load(folder / f"{split}.2")) if meta["pair"] else first
        return cls(
            inputs,
            np.load(folder / f"{split}.labels.npy"),
            num_classes=meta["num_classes"],
            vocab_size=meta["vocab_size"],
            pad_id=meta["pad_id"],
            cls_id=meta["cls_id"],
        )

    def with_cls(self, cls_id: int | None) -> ClassificationData:
        """The same examples with (or without) a classification token."""
        return ClassificationData(
            self.inputs if self.is_pair else self.inputs[0],
            self.labels,
            num_classes=self.num_classes,
            vocab_size=self.vocab_size,
            pad_id=self.pad_id,
            cls_id=cls_id,
        )


def majority_baseline(train: ClassificationData, test: ClassificationData) -> tuple[int, float]:
    """(the most frequent training label, the test accuracy of always predicting it)."""
    majority = int(np.argmax(train.label_counts()))
    return majority, float((test.labels == majority).mean()) if len(test) else float("nan")


class BucketedSampleLoader(SampleLoader):
    """`SampleLoader` whose epochs group examples of similar length, so a
    batch padded to its longest member wastes little (ListOps lengths run
    from 500 to 2000: random batches are half padding).

    Each epoch is the same seeded permutation as SampleLoader's, cut into
    windows of `bucket_batches` global batches; a window is sorted by length
    and its batches are served in a seeded random order. Window and batch
    boundaries are placed where the global batches of that epoch fall, so
    every global batch is one bucket. The order stays a pure function of
    (seed, epoch), so the resume state is still the one sample index."""

    def __init__(self, data: ClassificationData, *, bucket_batches: int = 16, **kwargs):
        if not isinstance(bucket_batches, int) or bucket_batches < 1:
            raise ValueError(f"bucket_batches={bucket_batches!r}: must be an int >= 1")
        self.lengths = np.max([s.lengths for s in data.inputs], axis=0)
        self.bucket_batches = bucket_batches
        super().__init__(data, **kwargs)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            n, G = len(self.windows), self.global_batch_size
            g = torch.Generator().manual_seed(_epoch_seed(self.seed, epoch))
            perm = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
            first = (-epoch * n) % G  # where this epoch's first whole global batch starts
            cuts = sorted({0, *range(first, n, G * self.bucket_batches), n})
            pieces = []
            for lo, hi in zip(cuts, cuts[1:]):
                window = perm[lo:hi]
                window = window[np.argsort(self.lengths[window.numpy()], kind="stable")]
                batches = list(window.split(G))
                whole = len(batches) - (len(batches[-1]) < G)  # a short last one straddles into the next epoch
                order = torch.randperm(whole, generator=g).tolist() if self.shuffle else list(range(whole))
                pieces += [batches[i] for i in order] + batches[whole:]
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = torch.cat(pieces) if pieces else perm
        return self._orders[epoch]
