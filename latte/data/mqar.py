"""Multi-query associative recall (MQAR), the Zoology recall task
(Arora, Eyuboglu et al. 2023), seeded, with disjoint train and test streams.

One example of length T with P key-value pairs over a vocabulary V:

    k1 v1 k2 v2 ... kP vP | q . q . . . q . . .        (input_ids)
    -100 ...          -100 | v . v . . . v . . .       (labels)

- keys are drawn from [1, V/2) and values from [V/2, V), distinct within an
  example; the 2P-token key-value context comes first;
- the queries (each key once) sit at even offsets 2g after the context, in
  slots g in [0, (T - 2P) / 2); the slots are drawn WITHOUT replacement from
  the power law p(g) ~ (g + 1)^(a - 1), a = 0.01 (in real text the gap
  between repeated bigrams is power-law distributed; Zoology's choice). The
  first key takes the first slot drawn, and so on;
- labels are position-aligned (`shift_labels` in latte.models): the label at
  a query key's position is its value, -100 everywhere else;
- every other position is a filler: 0 by default, or uniformly random tokens
  from [0, V) with random_fillers=True (Zoology's "random_non_queries"); which
  one was used is recorded in `MQARData.fillers`.

Seeds: `mqar_splits(seed=s)` draws the training examples from the stream
(s, 0) and the test examples from (s, 1) (numpy SeedSequence entropy), so no
choice of seeds makes the two streams coincide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100
SPLITS = {"train": 0, "test": 1}


@dataclass
class MQARData:
    """input_ids, labels: int64 [N, T]; labels are position-aligned (the label at
    t is the token expected after input_ids[:, t]; -100 = not scored)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    vocab_size: int
    num_kv_pairs: int
    seed: int
    split: str
    fillers: str  # "zeros" or "random"
    power_a: float

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.input_ids.shape[1]


def power_law(num_slots: int, power_a: float = 0.01) -> np.ndarray:
    """p(g) ~ (g + 1)^(a - 1) for slots g = 0 .. num_slots - 1, normalised."""
    p = np.arange(1, num_slots + 1, dtype=np.float64) ** (power_a - 1.0)
    return p / p.sum()


def check_mqar_args(vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float) -> None:
    """ValueError naming the argument when no example of this shape exists."""
    for name, v in (("vocab_size", vocab_size), ("seq_len", seq_len), ("num_kv_pairs", num_kv_pairs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    if vocab_size // 2 - 1 < num_kv_pairs or vocab_size - vocab_size // 2 < num_kv_pairs:
        raise ValueError(
            f"vocab_size={vocab_size}: too small for {num_kv_pairs} distinct keys in [1, V/2) "
            f"and values in [V/2, V); need vocab_size >= {2 * num_kv_pairs + 2}"
        )
    if seq_len < 4 * num_kv_pairs:
        raise ValueError(
            f"seq_len={seq_len}: too short for num_kv_pairs={num_kv_pairs}: the context takes "
            f"2 x {num_kv_pairs} tokens and the queries need {num_kv_pairs} slots of 2 tokens "
            f"after it; need seq_len >= {4 * num_kv_pairs}"
        )
    if not (isinstance(power_a, (int, float)) and 0 < power_a <= 1):
        raise ValueError(f"power_a: expected a number in (0, 1] (1 = uniform slots), got {power_a!r}")


def _distinct(rng: np.random.Generator, n: int, k: int, lo: int, hi: int) -> np.ndarray:
    """[n, k] integers from [lo, hi), distinct within each row, in random order.
    Rows with a repeat are redrawn (cheap: k << hi - lo in every MQAR setting)."""
    out = rng.integers(lo, hi, size=(n, k))
    while True:
        s = np.sort(out, axis=1)
        bad = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
        if bad.size == 0:
            return out
        out[bad] = rng.integers(lo, hi, size=(bad.size, k))


def _slots(rng: np.random.Generator, n: int, k: int, p: np.ndarray) -> np.ndarray:
    """[n, k] slot indices drawn from p without replacement, in draw order.
    Gumbel top-k: sorting log p + Gumbel noise in descending order gives the
    same law as drawing one slot at a time and renormalising."""
    scores = np.log(p)[None, :] + rng.gumbel(size=(n, p.size))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # the k largest, unordered
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


def mqar(
    num_examples: int,
    *,
    seq_len: int,
    num_kv_pairs: int,
    vocab_size: int = 8192,
    seed: int = 0,
    split: str = "train",
    power_a: float = 0.01,
    random_fillers: bool = False,
) -> MQARData:
    """`num_examples` MQAR examples of the `split` stream of `seed` (module docstring)."""
    check_mqar_args(vocab_size, seq_len, num_kv_pairs, power_a)
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {tuple(SPLITS)}, got {split!r}")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ValueError(f"num_examples: expected an integer >= 0, got {num_examples!r}")
    rng = np.random.default_rng([int(seed), SPLITS[split]])
    N, P, T, V = num_examples, num_kv_pairs, seq_len, vocab_size
    keys = _distinct(rng, N, P, 1, V // 2)  # [N, P]
    values = _distinct(rng, N, P, V // 2, V)  # [N, P]
    context = 2 * P
    slots = _slots(rng, N, P, power_law((T - context) // 2, power_a))  # [N, P]; key j -> slot j
    ids = np.zeros((N, T), dtype=np.int64)
    ids[:, 0:context:2], ids[:, 1:context:2] = keys, values
    query_pos = context + 2 * slots  # [N, P]
    np.put_along_axis(ids, query_pos, keys, axis=1)
    labels = np.full((N, T), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, query_pos, values, axis=1)
    if random_fillers:
        filler = np.ones((N, T), dtype=bool)
        filler[:, :context] = False
        np.put_along_axis(filler, query_pos, False, axis=1)
        ids[filler] = rng.integers(0, V, size=int(filler.sum()))
    return MQARData(
        torch.from_numpy(ids),
        torch.from_numpy(labels),
        V,
        P,
        int(seed),
        split,
        "random" if random_fillers else "zeros",
        float(power_a),
    )


def mqar_splits(num_train: int, num_test: int, **kwargs) -> tuple[MQARData, MQARData]:
    """(train, test) from the disjoint streams of one seed; kwargs as `mqar`."""
    if "split" in kwargs:
        raise ValueError("split: mqar_splits makes both; give num_train and num_test instead")
    return mqar(num_train, split="train", **kwargs), mqar(num_test, split="test", **kwargs)
