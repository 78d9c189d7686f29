"""The MQAR generator: layout, distinct keys, labels, the placement law, seeds."""

import numpy as np
import pytest
import torch

from latte.data import mqar, mqar_splits
from latte.data.mqar import IGNORE_INDEX, power_law


def example_parts(data, i):
    ids, labels = data.input_ids[i].tolist(), data.labels[i].tolist()
    P = data.num_kv_pairs
    keys, values = ids[0 : 2 * P : 2], ids[1 : 2 * P : 2]
    return ids, labels, keys, values


@pytest.mark.parametrize("random_fillers", [False, True])
def test_layout_keys_values_and_labels(random_fillers):
    V, T, P = 512, 64, 6
    d = mqar(300, seq_len=T, num_kv_pairs=P, vocab_size=V, seed=3, random_fillers=random_fillers)
    assert d.input_ids.shape == d.labels.shape == (300, T) and d.input_ids.dtype == torch.int64
    assert d.fillers == ("random" if random_fillers else "zeros")
    for i in range(len(d)):
        ids, labels, keys, values = example_parts(d, i)
        assert len(set(keys)) == P and len(set(values)) == P  # distinct per example
        assert all(1 <= k < V // 2 for k in keys) and all(V // 2 <= v < V for v in values)
        scored = [t for t in range(T) if labels[t] != IGNORE_INDEX]
        assert len(scored) == P and all(t >= 2 * P and (t - 2 * P) % 2 == 0 for t in scored)
        # the label at each query is the value paired with the key found there
        pairs = dict(zip(keys, values))
        assert sorted(ids[t] for t in scored) == sorted(keys)
        assert all(labels[t] == pairs[ids[t]] for t in scored)
        assert all(labels[t] == IGNORE_INDEX for t in range(2 * P))  # the context is never scored
        rest = [ids[t] for t in range(2 * P, T) if t not in scored]
        if not random_fillers:
            assert set(rest) == {0}
    if random_fillers:  # fillers cover the whole vocabulary
        fill = d.input_ids[:, 2 * P :][d.labels[:, 2 * P :] == IGNORE_INDEX]
        assert fill.min() >= 0 and fill.max() < V and len(torch.unique(fill)) > V // 2


def test_placement_follows_the_power_law():
    """The first query's slot is drawn from p(g) ~ (g + 1)^(a - 1) itself
    (later ones without replacement): a chi-square test on 20k examples, and
    the law differs enough from uniform slots for the test to notice."""
    T, P, N = 64, 4, 20000
    d = mqar(N, seq_len=T, num_kv_pairs=P, vocab_size=256, seed=11)
    first_key = d.input_ids[:, 0]
    pos = (d.input_ids[:, 2 * P :] == first_key[:, None]).float().argmax(1) + 2 * P
    slots = ((pos - 2 * P) // 2).numpy()
    n_slots = (T - 2 * P) // 2
    observed = np.bincount(slots, minlength=n_slots)
    chi2 = lambda p: float((((observed - N * p) ** 2) / (N * p)).sum())  # noqa: E731
    # 27 degrees of freedom: the 0.999 quantile is 55.5
    assert chi2(power_law(n_slots, 0.01)) < 55.5
    assert chi2(np.full(n_slots, 1.0 / n_slots)) > 1000
    # every query slot is distinct (drawn without replacement)
    q = (d.labels != IGNORE_INDEX).sum(1)
    assert bool((q == P).all())


def test_power_law_shape():
    p = power_law(10, 0.01)
    assert p.sum() == pytest.approx(1.0) and np.all(np.diff(p) < 0)
    assert p[0] / p[1] == pytest.approx(2**0.99)
    assert np.allclose(power_law(7, 1.0), 1 / 7)  # a = 1: uniform


def test_seeds_are_reproducible_and_train_test_disjoint():
    kw = dict(seq_len=32, num_kv_pairs=4, vocab_size=64)
    a_train, a_test = mqar_splits(500, 500, seed=0, **kw)
    b_train, _ = mqar_splits(500, 10, seed=0, **kw)
    assert torch.equal(a_train.input_ids, b_train.input_ids)  # same seed, same stream
    assert a_train.split == "train" and a_test.split == "test"
    # the test stream of seed s is not the train stream of any seed
    for s in range(4):
        other = mqar(500, seed=s, split="train", **kw)
        assert not torch.equal(other.input_ids, a_test.input_ids)
    # and no test example appears in the training set (V=64 makes repeats possible at all)
    train_rows = {tuple(r) for r in a_train.input_ids.tolist()}
    assert not any(tuple(r) in train_rows for r in a_test.input_ids.tolist())


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(seq_len=15, num_kv_pairs=4), "seq_len=15: too short"),
        (dict(seq_len=64, num_kv_pairs=4, vocab_size=8), "vocab_size=8: too small"),
        (dict(seq_len=64, num_kv_pairs=0), "num_kv_pairs: expected an integer >= 1"),
        (dict(seq_len=64, num_kv_pairs=4, power_a=0.0), "power_a"),
        (dict(seq_len=64, num_kv_pairs=4, split="val"), "split"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, text):
    with pytest.raises(ValueError, match=text):
        mqar(4, **kwargs)
