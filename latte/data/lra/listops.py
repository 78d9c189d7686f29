"""ListOps (Nangia & Bowman 2018, as generated for the Long Range Arena).

An example is a nested prefix expression over the digits 0-9 with four
operators, each closed by "]":

    [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]      -> 5

MIN, MAX, MED (median; for an even count the mean of the two middle values,
rounded down, as `int(np.median(...))` in the LRA script) and SM (sum mod 10).
The label is the value of the whole expression: 10 classes.

The generative process is the LRA one (`lra_benchmarks/data/listops.py`):
a node at depth < max_depth is an operator with probability 0.25 (the LRA
script draws a leaf when u > 0.25), with 2..max_args arguments drawn
uniformly; at max_depth it is a digit; the root is at depth 1. Expressions
are kept when min_length < tokens < max_length (tokens = digits, operators
and closers; the LRA files also hold parentheses that its tokenizer drops).
Differences from the LRA script, both deliberate: draws come from a seeded
generator per shard (the LRA script used the global unseeded `random`), and
duplicates are removed keeping the FIRST occurrence in stream order (the
LRA script collected a Python `set`, whose order is arbitrary).

Token ids: 0 pad, 1 cls, 2-11 the digits, 12-15 MIN MAX MED SM, 16 "]".
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latte.data.classification import ClassificationData, Sequences
from latte.data.lra.common import run_shards, split_stream, utf8_lines

PAD_ID, CLS_ID = 0, 1
DIGIT0 = 2  # digit d has id DIGIT0 + d
MIN_ID, MAX_ID, MED_ID, SM_ID = 12, 13, 14, 15
CLOSE_ID = 16
VOCAB_SIZE = 17
NUM_CLASSES = 10
OPERATOR_IDS = (MIN_ID, MAX_ID, MED_ID, SM_ID)
# The spelling of the LRA TSV files; "(" and ")" also occur there and carry nothing.
TOKEN_NAMES = ("<pad>", "<cls>", *map(str, range(10)), "[MIN", "[MAX", "[MED", "[SM", "]")
_IDS = {name: i for i, name in enumerate(TOKEN_NAMES) if i >= DIGIT0}


@dataclass(frozen=True)
class ListOpsSpec:
    """The LRA settings by default (depth 10, up to 10 arguments, 500 < length < 2000)."""

    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000
    operator_prob: float = 0.25

    def __post_init__(self):
        problems = []
        if self.max_depth < 1:
            problems.append(f"max_depth={self.max_depth}: must be >= 1")
        if self.max_args < 2:
            problems.append(f"max_args={self.max_args}: must be >= 2 (an operator takes 2..max_args)")
        if not 0 <= self.min_length < self.max_length:
            problems.append(f"min_length={self.min_length}, max_length={self.max_length}: need 0 <= min < max")
        if not 0.0 < self.operator_prob < 1.0:
            problems.append(f"operator_prob={self.operator_prob}: must be in (0, 1)")
        if problems:
            raise ValueError("ListOpsSpec: " + "; ".join(problems))


def sample_expression(rng: random.Random, spec: ListOpsSpec) -> list[int] | None:
    """One expression (token ids, no cls), or None when its length is outside
    (min_length, max_length). Generation stops as soon as the expression
    cannot end shorter than max_length, so rejections cost little."""
    out: list[int] = []
    remaining: list[int] = []  # arguments still to come, one entry per open operator
    while True:
        depth = len(remaining) + 1
        if depth < spec.max_depth and rng.random() < spec.operator_prob:
            out.append(OPERATOR_IDS[int(rng.random() * 4)])
            remaining.append(2 + int(rng.random() * (spec.max_args - 1)))
        else:
            out.append(DIGIT0 + int(rng.random() * 10))
            while remaining:  # this argument is complete; close every operator it completes
                remaining[-1] -= 1
                if remaining[-1]:
                    break
                remaining.pop()
                out.append(CLOSE_ID)
            if not remaining:
                return out if spec.min_length < len(out) < spec.max_length else None
        if len(out) + len(remaining) >= spec.max_length:  # every open operator still needs its "]"
            return None


def apply_operator(op: int, args: list[int]) -> int:
    if op == MIN_ID:
        return min(args)
    if op == MAX_ID:
        return max(args)
    if op == SM_ID:
        return sum(args) % 10
    s, n = sorted(args), len(args)  # MED
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def evaluate(tokens) -> int:
    """The value of an expression given as token ids (a leading cls is
    allowed). A malformed expression is a ValueError saying where."""
    stack: list[tuple[int, list[int]]] = []  # (operator, arguments so far)
    result = None
    for pos, t in enumerate(int(t) for t in tokens):
        if t == CLS_ID and pos == 0:
            continue
        if result is not None:
            raise ValueError(f"ListOps: token {pos} ({_name(t)}) follows a complete expression")
        if t in OPERATOR_IDS:
            stack.append((t, []))
            continue
        if DIGIT0 <= t < DIGIT0 + 10:
            value = t - DIGIT0
        elif t == CLOSE_ID:
            if not stack or not stack[-1][1]:
                what = "nothing" if not stack else "an empty operator"
                raise ValueError(f"ListOps: token {pos} ']' closes {what}")
            op, args = stack.pop()
            value = apply_operator(op, args)
        else:
            raise ValueError(f"ListOps: token {pos} has id {t}, not a digit, operator or ']'")
        if stack:
            stack[-1][1].append(value)
        else:
            result = value
    if stack or result is None:
        raise ValueError(
            f"ListOps: expression ends with {len(stack)} unclosed operator(s)" if stack else "ListOps: empty expression"
        )
    return result


def _name(t: int) -> str:
    return TOKEN_NAMES[t] if 0 <= t < len(TOKEN_NAMES) else str(t)


def to_text(tokens) -> str:
    """Readable form: "[MAX 4 3 [MIN 2 3 ] ]"."""
    return " ".join(_name(int(t)) for t in tokens)


def parse_lra_source(source: str, *, where: str = "ListOps source") -> list[int]:
    """Token ids of an LRA TSV 'Source' string such as "( ( [MAX 2 ) 9 ) ] )";
    the parentheses are dropped (the LRA tokenizer drops them too)."""
    ids = []
    for word in source.split():
        if word in ("(", ")"):
            continue
        if word not in _IDS:
            raise ValueError(f"{where}: unknown token {word!r}; expected digits, [MIN [MAX [MED [SM, ], ( or )")
        ids.append(_IDS[word])
    return ids


def to_lra_source(tokens) -> str:
    """The LRA TSV spelling of an expression: the script nests pairs
    ((((op, a1), a2), ...), "]") and writes a parenthesis around each pair."""

    def parse(i: int):
        t = tokens[i]
        if t not in OPERATOR_IDS:
            return _name(t), i + 1
        args, i = [], i + 1
        while tokens[i] != CLOSE_ID:
            arg, i = parse(i)
            args.append(arg)
        return "( " * (len(args) + 1) + _name(t) + "".join(f" {a} )" for a in args) + " ] )", i + 1

    tokens = [int(t) for t in tokens]
    evaluate(tokens)  # refuses a malformed expression with a clear message
    return parse(0)[0]


def read_lra_tsv(path: str | Path) -> tuple[list[list[int]], list[int]]:
    """(expressions as token ids, labels) of an LRA release file such as
    lra_release/listops-1000/basic_train.tsv (tab-separated, header Source, Target)."""
    path = Path(path)
    seqs, labels = [], []
    reader = csv.reader(utf8_lines(path), delimiter="\t")  # a non-UTF-8 byte is named with its line
    header = next(reader, None)
    if header != ["Source", "Target"]:
        raise ValueError(f"{path}: expected the LRA ListOps header 'Source<TAB>Target', got {header}")
    for line, row in enumerate(reader, start=2):
        if len(row) != 2 or not row[1].strip().isdigit() or not 0 <= int(row[1]) < NUM_CLASSES:
            raise ValueError(f"{path}:{line}: expected '<expression><TAB><label 0-9>', got {row[:2]}")
        seqs.append(parse_lra_source(row[0], where=f"{path}:{line}"))
        labels.append(int(row[1]))
    return seqs, labels


def generate_shard(seed: int, shard: int, count: int, spec: ListOpsSpec) -> tuple[list[tuple[bytes, int]], int]:
    """`count` accepted (expression as uint8 token bytes, value) pairs of one
    shard, and the number of candidates drawn for them. The shard's generator depends on
    (seed, shard) only, so shards can run in any process in any order."""
    state = np.random.SeedSequence(seed, spawn_key=(shard,)).generate_state(2)
    rng = random.Random(int(state[0]) << 32 | int(state[1]))
    out, drawn = [], 0
    while len(out) < count:
        drawn += 1
        expr = sample_expression(rng, spec)
        if expr is not None:
            out.append((bytes(expr), evaluate(expr)))
    return out, drawn


def generate_listops(
    sizes: dict[str, int],
    *,
    seed: int = 0,
    spec: ListOpsSpec = ListOpsSpec(),
    num_workers: int = 1,
    shard_size: int = 256,
) -> tuple[dict, dict]:
    """Splits {"train", "validation", "test"} of sizes[split] distinct
    expressions, and a report (candidates drawn, duplicates dropped,
    examples/s). Duplicates are dropped across all splits, keeping the first
    occurrence, so no test expression also occurs in training."""
    needed = sum(sizes.values())
    seen: set[bytes] = set()
    unique: list[tuple[bytes, int]] = []
    drawn = duplicates = 0
    t0 = time.perf_counter()
    shards = ((seed, i, shard_size, spec) for i in itertools.count())
    for exprs, n in run_shards(generate_shard, shards, num_workers):
        drawn += n
        for expr, value in exprs:
            key = hashlib.blake2b(expr, digest_size=16).digest()
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            unique.append((expr, value))
            if len(unique) == needed:
                break
        if len(unique) == needed:
            break
    seconds = time.perf_counter() - t0
    splits = {
        name: to_data([np.frombuffer(e, dtype=np.uint8) for e, _ in part], [v for _, v in part])
        for name, part in split_stream(unique, sizes).items()
    }
    report = {
        "candidates_drawn": drawn,
        "duplicates_dropped": duplicates,
        "generate_s": round(seconds, 2),
        "examples_per_s": round(needed / seconds, 1),
        "num_workers": num_workers,
    }
    return splits, report


def to_data(seqs, labels):
    """ClassificationData of expressions (token id sequences) and their values."""
    return ClassificationData(
        Sequences.from_list(seqs, vocab_size=VOCAB_SIZE),
        labels,
        num_classes=NUM_CLASSES,
        vocab_size=VOCAB_SIZE,
        pad_id=PAD_ID,
    )
