"""ClassificationData: padding, the classification token, pairs, disk, and
the language-model loader serving it with an exact resume position."""

import numpy as np
import pytest
import torch

from latte.data import SampleLoader, iter_eval_batches
from latte.data.classification import ClassificationData, Sequences, majority_baseline


def make(cls_id=None, n=10):
    seqs = Sequences.from_list([[5 + (i % 3)] * (1 + i % 4) for i in range(n)], vocab_size=17)
    return ClassificationData(seqs, [i % 3 for i in range(n)], num_classes=3, vocab_size=17, cls_id=cls_id)


def test_batch_pads_right_and_masks():
    data = make()
    b = data.batch([0, 3, 1])
    assert b["input_ids"].tolist() == [[5, 0, 0, 0], [5, 5, 5, 5], [6, 6, 0, 0]]
    assert b["attention_mask"].tolist() == [[True, False, False, False], [True] * 4, [True, True, False, False]]
    assert b["labels"].tolist() == [0, 0, 1]
    assert data.max_length() == 4


def test_cls_token_is_prepended():
    data = make(cls_id=1)
    b = data.batch([0, 1])
    assert b["input_ids"].tolist() == [[1, 5, 0], [1, 6, 6]]
    assert b["attention_mask"][:, 0].all() and data.max_length() == 5
    assert make().with_cls(1).batch([0, 1])["input_ids"].tolist() == b["input_ids"].tolist()


def test_pairs_batch_both_documents():
    a = Sequences.from_list([[3, 4], [5]], vocab_size=10)
    b = Sequences.from_list([[6], [7, 8, 9]], vocab_size=10)
    data = ClassificationData((a, b), [1, 0], num_classes=2, vocab_size=10)
    out = data.batch([1, 0])
    assert out["input_ids"].tolist() == [[5, 0], [3, 4]]
    assert out["input_ids_2"].tolist() == [[7, 8, 9], [6, 0, 0]]
    assert out["attention_mask_2"].sum(1).tolist() == [3, 1]


def test_save_load_round_trip(tmp_path):
    a = Sequences.from_list([[3, 4], [5]], vocab_size=300)
    data = ClassificationData((a, a), [1, 0], num_classes=2, vocab_size=300, pad_id=0)
    data.save(tmp_path, "test")
    back = ClassificationData.load(tmp_path, "test")
    assert back.is_pair and back.vocab_size == 300 and back.inputs[0].tokens.dtype == np.uint16
    for k in ("input_ids", "input_ids_2", "labels"):
        torch.testing.assert_close(back.batch([0, 1])[k], data.batch([0, 1])[k])


def test_errors():
    seqs = Sequences.from_list([[1], [2]], vocab_size=5)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 1\]"):
        ClassificationData(seqs, [0, 2], num_classes=2, vocab_size=5)
    with pytest.raises(ValueError, match="2 labels but inputs of"):
        ClassificationData(Sequences.from_list([[1]], vocab_size=5), [0, 1], num_classes=2, vocab_size=5)
    with pytest.raises(ValueError, match="offsets must rise"):
        Sequences(np.zeros(3, np.uint8), np.array([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="token id 7"):
        make().check_ids(7, where="x")


def test_sample_loader_serves_and_resumes_classification_batches():
    data = make(n=23)
    loader = SampleLoader(data, global_batch_size=4, seed=3)
    batches = [next(loader) for _ in range(9)]  # crosses an epoch boundary (23 examples)
    resumed = SampleLoader(data, global_batch_size=4, seed=3, start_index=5 * 4)
    for want in batches[5:]:
        got = next(resumed)
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    # two ranks see the halves of the same global batch
    halves = [next(SampleLoader(data, global_batch_size=4, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    assert torch.cat([h["labels"] for h in halves]).tolist() == batches[0]["labels"].tolist()
    seen = torch.cat([b["labels"] for b in iter_eval_batches(data, 5)])
    assert seen.tolist() == data.labels.tolist()


def test_majority_baseline():
    train, test = make(n=10), make(n=6)
    assert train.label_counts().tolist() == [4, 3, 3]
    assert majority_baseline(train, test) == (0, 2 / 6)


def test_bucketed_loader_pads_less_and_resumes_exactly():
    from latte.data.classification import BucketedSampleLoader

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 101)
    seqs = Sequences.from_list([[3] * int(n) for n in lengths], vocab_size=10)
    data = ClassificationData(seqs, rng.integers(0, 2, 101), num_classes=2, vocab_size=10)
    G = 8
    plain = SampleLoader(data, global_batch_size=G, seed=1)
    bucketed = BucketedSampleLoader(data, global_batch_size=G, seed=1, bucket_batches=4)
    for epoch in range(3):  # each epoch is a permutation of the examples
        assert sorted(bucketed.epoch_order(epoch).tolist()) == list(range(101))
    steps = 40  # about three epochs: batches straddle epoch boundaries
    waste = {
        name: sum((~b["attention_mask"]).sum().item() for b in (next(loader) for _ in range(steps)))
        for name, loader in (("plain", plain), ("bucketed", bucketed))
    }
    assert waste["bucketed"] < 0.4 * waste["plain"]  # padding tokens
    fresh = BucketedSampleLoader(data, global_batch_size=G, seed=1, bucket_batches=4)
    batches = [next(fresh) for _ in range(steps)]
    resumed = BucketedSampleLoader(data, global_batch_size=G, seed=1, bucket_batches=4, start_index=23 * G)
    for want in batches[23:]:
        got = next(resumed)
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got["labels"], want["labels"])
