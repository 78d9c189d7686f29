"""The slot coverage diagnostic (latte.eval.memory_coverage): the share of
a prompt's needle that the memory slots hold after one prefill, and each
needle token's rank under the rule's score, checked against what the rule
must hold (oracle: every needle token that left the window; none of the
tokens it was not handed) and against ranks computed from the float64
reference's scores (rule "random": a hash of seed, layer, head, position)."""

import json

import pytest
import torch

from latte.eval import memory_coverage as C
from latte.eval import needle as N
from latte.eval import retrieval as R
from latte.ops import reference as ref
from latte.ops.window.memory import layer_seed
from tests.convert.test_decode_and_io import W, trained_like
from tests.eval.test_needle import DOCS, CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def prompt():
    ids = TOK.encode(N.haystack_text(DOCS, 0) * 3)
    return R.build_prompt(
        TOK.encode, ids, N.sentence_ends(TOK, ids), 300, 0.4, R.make_item("passkey", 2), R.FORMATS["bare"]
    )


def _left(p) -> list[int]:
    """The needle's tokens that have left the window before the next query."""
    return [s for s in range(len(p.ids) - W + 1) if p.marks[s]]


def test_the_oracle_holds_the_whole_needle_and_nothing_it_was_not_handed(prompt):
    model = trained_like("llama", memory_slots=64, memory_rule="oracle")
    digits = C.digit_marks(prompt.ids, prompt.marks, TOK.decode)
    assert 0 < int(digits.sum()) < int(prompt.marks.sum())
    recs = C.slot_coverage(model, prompt.ids, prompt.marks, digits)
    n = len(_left(prompt))
    assert len(recs) == model.num_layers * model.converted[0].spec.num_kv_heads and n > 0
    for r in recs:
        assert (r["needle"], r["held_needle"], r["ranks"], r["agrees"]) == (n, n, list(range(n)), True)
        assert r["held_digits"] == r["digits"] > 0
    s = C.coverage_summary(recs)
    assert (s["needle_held"], s["digits_held"], s["heads_with_every_digit"], s["best_rank"]) == (1.0, 1.0, 1.0, 0.0)
    assert s["whole_needle"] == 1.0  # the needle is every candidate the oracle has
    # the haystack's own digits are no needle: the oracle holds none of them
    hay_digits = C.digit_marks(prompt.ids, ~prompt.marks, TOK.decode)
    if hay_digits[: len(prompt.ids) - W + 1].any():
        assert all(r["held_digits"] == 0 for r in C.slot_coverage(model, prompt.ids, prompt.marks, hay_digits))
    half = prompt.marks.clone()
    half[prompt.starts[0] : prompt.starts[0] + n // 2] = False  # marks handed for the second half only
    recs = C.slot_coverage(model, prompt.ids, half, prompt.marks)
    assert all(r["held_digits"] == r["digits"] - n // 2 for r in recs)


@pytest.mark.parametrize("slots", [1, 8])
def test_ranks_and_held_tokens_follow_the_reference_scores(prompt, slots):
    """Rule "random": the ranks equal those of the float64 reference's scores
    (bfloat16-rounded, ties to the older position), and the slots hold the
    needle tokens ranked below the slot count: a share that is neither 0 nor
    1 for one slot, so the check can fail both ways."""
    model = trained_like("llama", memory_slots=slots, memory_rule="random")
    recs = C.slot_coverage(model, prompt.ids, prompt.marks)
    T, n = len(prompt.ids), len(prompt.ids) - W + 1
    x = torch.zeros(1, T, 1, 1, dtype=torch.float64)
    for r in recs:
        K = model.converted[r["layer"]].spec.num_kv_heads
        seed = layer_seed(0, r["layer"])
        S = model.converted[r["layer"]].num_sinks
        scores = ref.memory_scores(
            "random", x.expand(1, T, K, 1), x.expand(1, T, K, 1), x, None, W, num_sinks=S, seed=seed
        )
        rank = C._ranks(scores[0, :n].to(torch.bfloat16).double())[:, r["head"]]
        want = [int(rank[s]) for s in _left(prompt)]
        assert r["ranks"] == want and r["agrees"]
        assert r["held_needle"] == sum(x < slots for x in want)
    assert any(r["held_needle"] < r["needle"] for r in recs)


def test_summary_over_heads():
    def head(ranks, held, digits=2, held_digits=1):
        return {"candidates": 100, "needle": len(ranks), "held_needle": held, "digits": digits}, ranks, held_digits

    recs = []
    for r, ranks, hd in (head([0, 9, 49], 2), head([19, 99, None], 1, held_digits=2), head([3, 4, 5], 3)):
        recs.append({**r, "ranks": ranks, "held_digits": hd, "agrees": True})
    s = C.coverage_summary(recs)
    assert s["needle_held"] == pytest.approx((2 / 3 + 1 / 3 + 1) / 3)
    assert s["digits_held"] == pytest.approx((0.5 + 1 + 0.5) / 3) and s["heads_with_every_digit"] == pytest.approx(
        1 / 3
    )
    assert (s["best_rank"], s["median_rank"]) == (
        pytest.approx(0.03),
        pytest.approx(0.09),
    )  # medians of 0/.19/.03, .09/.59/.04
    assert (
        s["whole_needle"] == pytest.approx(0.5) and s["agrees"]
    )  # median of 0.5, 1 (a needle token no candidate), 0.06


def test_slots_summary_averages_prompts_and_splits_the_layers():
    def cell(held, per_layer):
        heads = [{"candidates": 10, "needle": 2, "held_needle": held, "digits": 1, "held_digits": 1, "ranks": [0, 9]}]
        return {"task": "passkey", "context": 1024, "heads": [{**h, "agrees": True} for h in heads], **per_layer}

    a = cell(2, {"digits_held_per_layer": [0.0, 0.5, 1.0, None]})
    b = cell(1, {"digits_held_per_layer": [0.5, None, 0.0, 1.0]})
    records, table = C.slots_summary([({"model": "m"}, "m [x]", [a, b])])
    (r,) = records
    assert r["prompts"] == 2 and r["needle_held"] == pytest.approx(0.75) and r["whole_needle"] == 1.0
    assert r["digits_held_by_layer"] == [0.25, 0.5, 0.5, 1.0]
    assert "| m [x] | passkey | 1,024 | 2 | 75.0 | 100.0 | 100.0 | 0.0 | 45.0 | 100.0 | 37.5 | 75.0 |" in table


def test_a_model_without_slots_is_refused(prompt):
    with pytest.raises(ValueError, match="memory_slots = 0"):
        C.slot_coverage(trained_like("llama"), prompt.ids, prompt.marks)


def test_suite_slots(tmp_path):
    """`latte eval RUN --suite slots` on a converted run: one record per
    model with slots (none for the model without them), the oracle holding
    every needle token, a random rule fewer; a model without any set is
    refused with exit 2."""
    from latte.cli import main
    from tests.eval.test_runner import convert_tiny_llama

    run = convert_tiny_llama(tmp_path)
    out = tmp_path / "eval"
    cmd = ["eval", str(run), "--suite", "slots", "--tasks", "passkey", "--lengths", "256", "--threads", "1"]
    assert main([*cmd, "--out", str(tmp_path / "none")]) == 2
    cmd += ["--out", str(out)]
    for rule, slots in (("oracle", 64), ("random", 2)):
        cmd += ["--set", f"{rule}:model.memory_slots={slots},model.memory_positions=cache,model.memory_rule={rule}"]
    assert main(cmd) == 0
    records = [r for r in json.loads((out / "results.json").read_text())["records"] if r["suite"] == "slots"]
    by = {r["subject"]: r for r in records}
    assert set(by) == {"oracle", "random"} and all(r["agrees"] and r["prompts"] == 3 for r in records)
    assert by["oracle"]["needle_held"] == 1.0 and by["oracle"]["best_rank"] == 0.0
    assert by["random"]["needle_held"] < 0.5
    assert "## slots" in (out / "results.md").read_text()
