"""ListOps: evaluation on hand-made trees, the generator's distribution rules,
seeds, de-duplication, parallel determinism and the LRA file format."""

import random

import numpy as np
import pytest

from latte.data.lra import listops as L

D = [L.DIGIT0 + d for d in range(10)]  # D[3] is the token of digit 3
MIN, MAX, MED, SM, END = L.MIN_ID, L.MAX_ID, L.MED_ID, L.SM_ID, L.CLOSE_ID


@pytest.mark.parametrize(
    "tokens, value",
    [
        ([D[7]], 7),
        ([MAX, D[2], D[9], END], 9),
        ([MIN, D[4], D[3], D[8], END], 3),
        ([SM, D[9], D[8], D[7], END], 4),  # 24 mod 10
        ([MED, D[1], D[5], D[3], END], 3),  # odd count: the middle value
        ([MED, D[1], D[4], END], 2),  # even count: (1 + 4) // 2, as int(np.median)
        ([MED, D[9], D[2], D[8], D[3], END], 5),  # sorted 2 3 8 9 -> (3 + 8) // 2
        # [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ] = max(4, 3, 2, 1, 0, 5) (the LRA paper's example)
        ([MAX, D[4], D[3], MIN, D[2], D[3], END, D[1], D[0], MED, D[1], D[5], D[8], D[9], D[2], END, END], 5),
        # [SM [MIN 7 [MAX 1 2 ] ] [MED 6 6 ] 9 ] = (2 + 6 + 9) mod 10
        ([SM, MIN, D[7], MAX, D[1], D[2], END, END, MED, D[6], D[6], END, D[9], END], 7),
        ([L.CLS_ID, MIN, D[5], D[6], END], 5),  # a leading cls is ignored
    ],
)
def test_evaluate_hand_made_trees(tokens, value):
    assert L.evaluate(tokens) == value


def test_median_matches_numpy_on_every_small_list():
    rng = random.Random(0)
    for _ in range(500):
        args = [rng.randrange(10) for _ in range(rng.randint(1, 10))]
        assert L.apply_operator(MED, args) == int(np.median(args))


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([MAX, D[1], D[2]], "1 unclosed operator"),
        ([D[1], D[2]], "follows a complete expression"),
        ([END], "closes nothing"),
        ([MAX, END], "closes an empty operator"),
        ([MAX, D[1], 99, END], "id 99"),
        ([], "empty expression"),
    ],
)
def test_evaluate_refuses_malformed(tokens, message):
    with pytest.raises(ValueError, match=message):
        L.evaluate(tokens)


def _tree_value(node):
    """Reference evaluation of a nested (op, [children]) tree."""
    if isinstance(node, int):
        return node
    op, children = node
    return L.apply_operator(op, [_tree_value(c) for c in children])


def _tree_tokens(node):
    if isinstance(node, int):
        return [L.DIGIT0 + node]
    op, children = node
    return [op] + [t for c in children for t in _tree_tokens(c)] + [END]


def _random_tree(rng, depth=1):
    if depth >= 6 or rng.random() < 0.4:
        return rng.randrange(10)
    return (rng.choice(L.OPERATOR_IDS), [_random_tree(rng, depth + 1) for _ in range(rng.randint(2, 5))])


def test_evaluate_agrees_with_recursive_reference():
    rng = random.Random(1)
    for _ in range(300):
        tree = _random_tree(rng)
        assert L.evaluate(_tree_tokens(tree)) == _tree_value(tree)


def test_sampled_expressions_follow_the_spec():
    spec = L.ListOpsSpec(max_depth=6, max_args=5, min_length=20, max_length=200)
    rng = random.Random(0)
    seen = 0
    while seen < 200:
        expr = L.sample_expression(rng, spec)
        if expr is None:
            continue
        seen += 1
        assert 20 < len(expr) < 200
        L.evaluate(expr)  # well formed
        depth = max_depth = 0
        args = []
        for t in expr:
            if t in L.OPERATOR_IDS:
                depth += 1
                max_depth = max(max_depth, depth)
                args.append(0)
            elif t == END:
                depth -= 1
                assert 2 <= args.pop() <= 5
            if t != END and len(args) > (t in L.OPERATOR_IDS):
                args[-1 - (t in L.OPERATOR_IDS)] += 1
        assert max_depth <= spec.max_depth - 1  # operators at depths 1..max_depth-1, digits below


def test_generation_is_seeded_and_independent_of_workers():
    sizes = {"train": 40, "validation": 10, "test": 10}
    spec = L.ListOpsSpec(min_length=30, max_length=120)
    one, rep = L.generate_listops(sizes, seed=3, spec=spec, num_workers=1, shard_size=16)
    two, _ = L.generate_listops(sizes, seed=3, spec=spec, num_workers=2, shard_size=16)
    other, _ = L.generate_listops(sizes, seed=4, spec=spec, num_workers=1, shard_size=16)
    for split in sizes:
        assert len(one[split]) == sizes[split]
        np.testing.assert_array_equal(one[split].inputs[0].tokens, two[split].inputs[0].tokens)
        np.testing.assert_array_equal(one[split].labels, two[split].labels)
        for i in range(len(one[split])):  # the stored label is the value of the stored expression
            assert one[split].labels[i] == L.evaluate(one[split].inputs[0][i])
    assert not np.array_equal(one["test"].inputs[0].tokens, other["test"].inputs[0].tokens)
    assert rep["candidates_drawn"] >= 60 and rep["examples_per_s"] > 0


def test_more_training_data_keeps_test_and_validation():
    spec = L.ListOpsSpec(min_length=30, max_length=120)
    small, _ = L.generate_listops({"train": 10, "validation": 5, "test": 5}, seed=0, spec=spec, shard_size=8)
    big, _ = L.generate_listops({"train": 50, "validation": 5, "test": 5}, seed=0, spec=spec, shard_size=8)
    for split in ("test", "validation"):
        np.testing.assert_array_equal(small[split].inputs[0].tokens, big[split].inputs[0].tokens)
    np.testing.assert_array_equal(
        small["train"].inputs[0].tokens, big["train"].inputs[0].tokens[: len(small["train"].inputs[0].tokens)]
    )


def test_duplicates_are_dropped_keeping_the_first_occurrence():
    # tiny expressions (3 < length < 6: one operator over 2-4 digits) repeat often
    spec = L.ListOpsSpec(max_depth=2, max_args=3, min_length=3, max_length=6)
    splits, report = L.generate_listops({"train": 60, "validation": 20, "test": 20}, seed=0, spec=spec, shard_size=32)
    assert report["duplicates_dropped"] > 0
    everything = [
        bytes(s.inputs[0][i]) for name in ("test", "validation", "train") for s in [splits[name]] for i in range(len(s))
    ]
    assert len(set(everything)) == len(everything) == 100  # distinct across splits: no test leaks into train
    # order preserved: the stream of accepted expressions, first occurrences only
    stream, seen = [], set()
    for shard in range(100):
        for expr, _ in L.generate_shard(0, shard, 32, spec)[0]:
            if expr not in seen:
                seen.add(expr)
                stream.append(expr)
        if len(stream) >= 100:
            break
    assert everything == stream[:100]


def test_lra_tsv_round_trip(tmp_path):
    # the published spelling: every (node, argument) pair in parentheses
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( ( [SM 5 ) ( ( ( [MIN 3 ) 4 ) ] ) ) 8 ) ] )", 6)]
    path = tmp_path / "basic_test.tsv"
    path.write_text("Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in rows))
    seqs, labels = L.read_lra_tsv(path)
    assert labels == [9, 6]
    assert [L.evaluate(s) for s in seqs] == labels
    assert [L.to_lra_source(s) for s in seqs] == [s for s, _ in rows]
    assert L.to_text(seqs[1]) == "[SM 5 [MIN 3 4 ] 8 ]"


def test_lra_tsv_errors(tmp_path):
    bad_header = tmp_path / "a.tsv"
    bad_header.write_text("src\ttgt\n[MAX 1 2 ]\t2\n")
    with pytest.raises(ValueError, match="header"):
        L.read_lra_tsv(bad_header)
    bad_token = tmp_path / "b.tsv"
    bad_token.write_text("Source\tTarget\n( [MAX 1 x ] )\t2\n")
    with pytest.raises(ValueError, match=r"b.tsv:2: unknown token 'x'"):
        L.read_lra_tsv(bad_token)


def test_spec_errors():
    with pytest.raises(ValueError, match="max_args=1"):
        L.ListOpsSpec(max_args=1)
    with pytest.raises(ValueError, match="min_length=10, max_length=5"):
        L.ListOpsSpec(min_length=10, max_length=5)


def test_load_task_generates_caches_and_reads_the_release(tmp_path):
    from latte.data.lra import load_task

    sizes = {"train": 30, "validation": 5, "test": 5}
    spec = L.ListOpsSpec(min_length=30, max_length=120)
    logs = []
    first, info = load_task(
        "listops", sizes=sizes, cache_dir=tmp_path, num_workers=1, listops_spec=spec, log=logs.append
    )
    again, info2 = load_task(
        "listops", sizes=sizes, cache_dir=tmp_path, num_workers=1, listops_spec=spec, log=logs.append
    )
    assert len(logs) == 1 and "generated and cached" in logs[0]  # the second call read the cache
    np.testing.assert_array_equal(first["train"].inputs[0].tokens, again["train"].inputs[0].tokens)
    assert info["vocab_size"] == L.VOCAB_SIZE and info["num_classes"] == 10 and info["max_length"] < 120
    assert sum(info["label_counts"]["train"]) == 30 and info2["generator"]["candidates_drawn"] > 0
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        (tmp_path / name).write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n")
    release, info3 = load_task("listops", path=str(tmp_path))
    assert release["test"].inputs[0][0].tolist() == [L.MAX_ID, D[2], D[9], END] and info3["source"] == str(tmp_path)
    with pytest.raises(ValueError, match=r"sizes needs a positive count for \['test'\]"):
        load_task("listops", sizes={"train": 3, "validation": 1}, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="task='lisstops': expected one of listops, pathfinder"):
        load_task("lisstops")
    with pytest.raises(ValueError, match="set data.path"):
        load_task("text")
