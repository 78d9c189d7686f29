"""Needle retrieval (latte.eval.needle): prompts of exactly the asked length
with the needle after a sentence end at the asked depth, greedy answers
through a chunked cache equal to greedy decoding without one, exact-match
scoring."""

import pytest
import torch

from latte.data import Document, load_documents, train_bpe
from latte.eval import needle as N
from tests.convert.test_decode_and_io import ids, trained_like


@pytest.fixture(scope="module")
def tok():
    return train_bpe((d.text for d in load_documents("pydoc")[:30]), vocab_size=400)


DOCS = [
    Document("b", "The river runs north. Boats carry grain! Who pays the toll? " * 12),
    Document("a", "Rain fell on the hills. The roads were closed for days. " * 12),
    Document("c", "A short note about lamps. They were bright." * 8),
]


def test_haystack_order_is_fixed_by_the_seed():
    one, again, other = N.haystack_text(DOCS, 0), N.haystack_text(DOCS, 0), N.haystack_text(DOCS, 1)
    assert one == again and sorted(one.split(N.SEPARATOR)) == sorted(other.split(N.SEPARATOR))
    assert N.make_key(3) == N.make_key(3) and 10_000 <= N.make_key(3) < 100_000


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_prompt_has_the_context_length_and_the_needle_at_a_sentence_end(tok, depth):
    hay = tok.encode(N.haystack_text(DOCS, 0))
    ends = N.sentence_ends(tok, hay)
    p = N.needle_prompt(tok, hay, ends, 300, depth, 12345)
    assert p.ids.shape == (300,) and p.key == 12345
    text = tok.decode(p.ids.tolist())
    assert N.NEEDLE.format(key=12345) in text and text.endswith(N.QUESTION)
    assert p.ids[p.needle_start : p.needle_end].tolist() == tok.encode(N.NEEDLE.format(key=12345))
    assert p.needle_start == 0 or ends[p.needle_start - 1]  # right after a sentence end
    n_hay = 300 - (p.needle_end - p.needle_start) - len(tok.encode(N.QUESTION))
    assert p.needle_start <= round(depth * n_hay)  # at or before the asked depth ...
    assert p.needle_start >= round(depth * n_hay) - 40  # ... within a sentence of it
    if depth == 0:
        assert p.needle_start == 0
    if depth == 1:
        assert p.distance < 40 + len(tok.encode(N.QUESTION))


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_kept_tokens_stay_first(tok, depth):
    """A beginning-of-sequence token (Gemma's) heads the haystack and stays
    first whatever the depth; the rest is the prompt without it, shifted."""
    bos = tok.eos_id
    hay = tok.encode(N.haystack_text(DOCS, 0))
    ends = N.sentence_ends(tok, hay)
    p = N.needle_prompt(tok, [bos] + hay, [False] + ends, 300, depth, 12345, keep=1)
    q = N.needle_prompt(tok, hay, ends, 299, depth, 12345)
    assert p.ids.shape == (300,) and int(p.ids[0]) == bos
    assert p.ids[1:].tolist() == q.ids.tolist()
    assert (p.needle_start, p.needle_end, p.distance) == (q.needle_start + 1, q.needle_end + 1, q.distance)
    if depth == 0:
        assert p.needle_start == 1
    with pytest.raises(ValueError, match="keep=300"):
        N.needle_prompt(tok, [bos] + hay, [False] + ends, 300, depth, 12345, keep=300)


def test_prompt_errors_name_the_problem(tok):
    hay = tok.encode(N.haystack_text(DOCS, 0))
    ends = N.sentence_ends(tok, hay)
    with pytest.raises(ValueError, match="depth=1.5"):
        N.needle_prompt(tok, hay, ends, 300, 1.5, 12345)
    with pytest.raises(ValueError, match="the haystack has only"):
        N.needle_prompt(tok, hay, ends, len(hay) + 100, 0.5, 12345)
    with pytest.raises(ValueError, match="too short"):
        N.needle_prompt(tok, hay, ends, 10, 0.5, 12345)


def test_exact_match_takes_the_first_number(tok, monkeypatch):
    assert N.first_number(" 12345. Remember") == 12345 and N.first_number("no digits") is None
    prompt = N.NeedlePrompt(torch.zeros(50, dtype=torch.long), 12345, 10, 20)
    for answer, correct in ((" 12345.", 1), (" 1234 5", 0), (" 123456", 0), ("", 0)):
        monkeypatch.setattr(N, "greedy_answer", lambda model, ids, chunk, answer=answer: tok.encode(answer))
        rec = N.run_trial(None, tok, prompt)
        assert rec["correct"] == correct and rec["distance"] == 30 and rec["answer"] == answer


def test_greedy_answer_through_chunks_equals_greedy_decoding():
    model = trained_like("llama")  # latents with weight: the state matters
    x = ids(B=1, T=37)[0]
    with torch.no_grad():
        want = model.generate(x[None], max_new_tokens=5, do_sample=False)[0, 37:].tolist()
        assert N.greedy_answer(model, x, 5, chunk=16) == want == N.greedy_answer(model, x, 5, chunk=64)
        with model.as_original() as base:  # a plain transformers model: its DynamicCache
            want = base.generate(x[None], max_new_tokens=5, do_sample=False)[0, 37:].tolist()
            assert N.greedy_answer(base, x, 5, chunk=16) == want


class CharTokenizer:
    """97 printable characters, one id each: the tiny test models' vocabulary."""

    ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n\t"

    def encode(self, text):
        return [self.ALPHABET.find(ch) if ch in self.ALPHABET else 0 for ch in text]

    def decode(self, ids):
        return "".join(self.ALPHABET[i] for i in ids)


@pytest.mark.parametrize("reverse", [False, True])
def test_prompts_continued_from_a_shared_haystack_state_answer_as_alone(reverse):
    model, tok = trained_like("llama"), CharTokenizer()
    hay = tok.encode(N.haystack_text(DOCS, 0))[:400]
    ends = N.sentence_ends(tok, hay)
    prompts = [N.needle_prompt(tok, hay, ends, c, d, 31337) for c in (150, 260) for d in (0.0, 0.5, 1.0)]
    prompts.sort(key=lambda p: p.needle_start, reverse=reverse)  # reversed: the feeder starts over
    feeder = N.PrefixFeeder(model, hay, chunk=64)
    for p in prompts:
        alone = N.run_trial(model, tok, p, chunk=64)
        shared = N.run_trial(model, tok, p, chunk=64, feeder=feeder)
        assert shared["answer"] == alone["answer"] and len(shared["answer"]) == N.ANSWER_TOKENS
    # the check can fail: a state fed from another haystack answers otherwise
    wrong = N.PrefixFeeder(model, tok.encode(N.haystack_text(DOCS, 1))[:400], chunk=64)
    answers = [
        (N.run_trial(model, tok, p, 64, wrong)["answer"], N.run_trial(model, tok, p, 64)["answer"]) for p in prompts
    ]
    assert any(a != b for a, b in answers)
