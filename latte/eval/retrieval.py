"""RULER-style synthetic retrieval in a haystack of held-out essays
(docs/evaluation.md §7.2.1): facts planted where only a state that carries
them can answer, read back by greedy decoding.

Haystacks (HAYSTACKS): `essays` (the default), the held-out essays in an
order fixed by the trial; `noise`, one five-sentence filler repeated (the
pass-key filler of Mohtashami and Jaggi, arXiv 2305.16300, which RULER's
first single-needle task also uses): a haystack in which the needle is the
only new text, so that a rule choosing tokens by how new they are can be
told apart from one that cannot choose at all.

Tasks (one asked question each):

  passkey     one needle "The pass key is K. Remember it. K is the pass key."
              (K: 5 digits); asked "What is the pass key?"
  multikey    MULTI_KEYS needles "One of the special magic numbers for W is:
              V." with different words W (V: 7 digits); one W is asked
  multivalue  MULTI_VALUES needles of the same word W with different V;
              all values of W are asked, correct iff every one is named

The asked needle lies at `depth` (a fraction of the haystack, moved back to
the end of a sentence); the other needles at seeded depths before it, so
that every needle lies at least as far from the question. A cell whose
nearest needle is more than the window from the end of the prompt is one
the window cannot pass.

Formats (FORMATS): how the prompt wraps the haystack. `chat` puts the whole
prompt in the model's own chat template (its tokenizer's, as the user's
turn) and starts the assistant's turn with the answer's first words;
`question_first` states the question before the haystack as well as after
it; `colon` writes the pass key as "The pass key is: K" and ends every
answer's first words with a colon. Every format ends with the answer's first words ("The pass key is"),
so the first number decoded is the answer. Calibrate the format on the
original model first (python -m experiments.convert --stages calibrate): an
evaluation the original cannot pass says nothing about a conversion.

The prompt is exactly `context` tokens long. Prompts of one (format, task,
trial) share the haystack's tokens up to their first needle: SharedPrefix
feeds that prefix once per state and hands out copies.
"""

from __future__ import annotations

import copy
import random
import re
import statistics
import time
from dataclasses import dataclass

import torch

from latte.data.heldout import eval_essays
from latte.reporting import md_table

from .needle import _feed, greedy_and_likelihood, haystack_text, new_cache, sentence_ends

TASKS = ("passkey", "multikey", "multivalue")
HAYSTACKS = ("essays", "noise")
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_REPEATS = 1600  # about 35,000 tokens: longer than the longest context asked of the suite (32K)
MULTI_KEYS = 4  # needles of the multikey task (one asked)
MULTI_VALUES = 4  # values of the one key of the multivalue task
INSTRUCTION = (
    "Some important numbers are hidden in the following text. Find them and memorize them. "
    "I will quiz you about them afterwards."
)
# words of the multikey and multivalue needles: never names, never two-word
# values (the up-training retrieval data's format, latte.data.retrieval)
WORDS = (
    "ladder", "violin", "pepper", "glacier", "saddle", "tunnel", "magnet", "walrus",
    "blanket", "cactus", "lobster", "pyramid", "teapot", "volcano", "whistle", "zipper",
)  # fmt: skip
ANSWER_TOKENS = {"passkey": 8, "multikey": 12, "multivalue": 48}


@dataclass(frozen=True)
class Format:
    name: str
    chat: bool  # inside the tokenizer's chat template
    question_first: bool  # the question also before the haystack
    instruction: bool = True  # INSTRUCTION before the haystack
    colon: bool = False  # "The pass key is: K" and the answer "...is:" (a value follows, not a definition)


FORMATS = {
    f.name: f
    for f in (
        Format("plain", chat=False, question_first=False),
        Format("plain-qfirst", chat=False, question_first=True),
        Format("chat", chat=True, question_first=False),
        Format("chat-qfirst", chat=True, question_first=True),
        Format("bare", chat=False, question_first=False, instruction=False),
        Format("plain-qfirst-colon", chat=False, question_first=True, colon=True),
        Format("chat-qfirst-colon", chat=True, question_first=True, colon=True),
    )
}


@dataclass(frozen=True)
class Item:
    """What one prompt plants and asks: needle texts in the order they
    appear, the index of the asked one (the last, for multivalue all), the
    question, the answer's first words and the expected numbers."""

    needles: tuple[str, ...]
    question: str
    answer_prefix: str
    expected: tuple[int, ...]


def make_item(task: str, seed) -> Item:
    """The needles, question and expected answer of one prompt (seeded)."""
    rng = random.Random(f"retrieval-{task}-{seed}")
    if task == "passkey":
        k = rng.randrange(10_000, 100_000)
        needle = f"The pass key is {k}. Remember it. {k} is the pass key."
        return Item((needle,), "What is the pass key?", "The pass key is", (k,))
    if task == "multikey":
        words = rng.sample(WORDS, MULTI_KEYS)
        values = [rng.randrange(1_000_000, 10_000_000) for _ in words]
        needles = tuple(f"One of the special magic numbers for {w} is: {v}." for w, v in zip(words, values))
        w = words[-1]  # the asked needle is the last one planted (the nearest to the question)
        q = f"What is the special magic number for {w} mentioned in the text?"
        return Item(needles, q, f"The special magic number for {w} mentioned in the text is", (values[-1],))
    if task == "multivalue":
        w = rng.choice(WORDS)
        values = rng.sample(range(1_000_000, 10_000_000), MULTI_VALUES)
        needles = tuple(f"One of the special magic numbers for {w} is: {v}." for v in values)
        q = f"What are all the special magic numbers for {w} mentioned in the text?"
        return Item(needles, q, f"The special magic numbers for {w} mentioned in the text are", tuple(values))
    raise ValueError(f"task={task!r}: expected one of {TASKS}")


def chat_frame(hf_tokenizer) -> tuple[str, str]:
    """(text before, text after) the user's message in the tokenizer's chat
    template, the assistant's turn opened: what `chat` formats wrap around."""
    if not getattr(hf_tokenizer, "chat_template", None):
        raise ValueError("a chat format needs a tokenizer with a chat template (tokenizer.chat_template is empty)")
    mark = "\x00MESSAGE\x00"
    text = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=True
    )
    pre, sep, post = text.partition(mark)
    if not sep:
        raise ValueError("the tokenizer's chat template does not render the user's message as given")
    return pre, post


def with_colon(item: Item) -> Item:
    """The item as `colon` formats state it: the pass key's needle "The pass
    key is: K. ..." and every answer opened with "...is:"."""
    needles = tuple(n.replace("The pass key is ", "The pass key is: ", 1) for n in item.needles)
    return Item(needles, item.question, item.answer_prefix + ":", item.expected)


def frame_texts(fmt: Format, item: Item, frame: tuple[str, str] | None) -> tuple[str, str]:
    """(head, tail): the text before and after the haystack."""
    head = (INSTRUCTION + " " if fmt.instruction else "") + (item.question if fmt.question_first else "")
    head = head.strip() + "\n\n" if head.strip() else ""
    tail = "\n\n" + item.question
    if fmt.chat:
        if frame is None:
            raise ValueError(f"format {fmt.name!r}: needs the chat template's frame (chat_frame)")
        return frame[0] + head, tail + frame[1] + item.answer_prefix
    return head, tail + " " + item.answer_prefix


@dataclass
class RetrievalPrompt:
    ids: torch.Tensor  # [context]
    expected: tuple[int, ...]
    starts: tuple[int, ...]  # first token of each needle
    ends: tuple[int, ...]  # one past the last token of each needle
    # the asked value as the answer writes it (" K" after the answer's first
    # words), whose likelihood is scored; empty for multivalue (any order)
    target: tuple[int, ...] = ()
    # a value of as many digits planted nowhere in the prompt, scored the
    # same way: the control for what the model expects of any such number
    decoy: tuple[int, ...] = ()

    @property
    def distance(self) -> int:
        """Tokens from the end of the nearest needle to the end of the prompt."""
        return len(self.ids) - max(self.ends)

    @property
    def shared(self) -> int:
        """Tokens before the first needle: shared with other prompts."""
        return min(self.starts)

    @property
    def marks(self) -> torch.Tensor:
        """[context] bool: the tokens of every needle, which memory rule
        "oracle" keeps (docs/math.md §4.2, for diagnosis)."""
        at = torch.arange(len(self.ids))
        out = torch.zeros(len(self.ids), dtype=torch.bool)
        for a, b in zip(self.starts, self.ends):
            out |= (at >= a) & (at < b)
        return out


def _depths(item: Item, depth: float, seed) -> list[float]:
    """The depth of each needle in planting order: the last at `depth`, the
    others at seeded depths before it (sorted)."""
    rng = random.Random(f"retrieval-depths-{seed}")
    return sorted(rng.uniform(0.0, depth) for _ in item.needles[1:]) + [depth]


def build_prompt(
    encode,
    hay_ids: list[int],
    ends: list[bool],
    context: int,
    depth: float,
    item: Item,
    fmt: Format,
    *,
    frame: tuple[str, str] | None = None,
    bos: list[int] | None = None,
    seed=0,
) -> RetrievalPrompt:
    """The prompt of exactly `context` tokens: bos, the format's head, the
    haystack with the item's needles planted after sentence ends, the tail.
    encode(text) -> ids without special tokens added; ends from
    needle.sentence_ends(hay_ids)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth}: expected a fraction in [0, 1]")
    item = with_colon(item) if fmt.colon else item
    head_text, tail_text = frame_texts(fmt, item, frame)
    head, tail = list(bos or []) + encode(head_text), encode(tail_text)
    needles = [encode(" " + n) for n in item.needles]
    n_hay = context - len(head) - len(tail) - sum(map(len, needles))
    if n_hay < 1:
        raise ValueError(f"context={context}: too short for format {fmt.name!r} ({context - n_hay + 1} tokens needed)")
    if n_hay > len(hay_ids):
        raise ValueError(f"context={context}: the haystack has only {len(hay_ids):,} tokens, {n_hay:,} needed")
    ats = []
    for d in _depths(item, depth, seed):
        at = round(d * n_hay)
        while at > 0 and not ends[at - 1]:  # back to the end of a sentence
            at -= 1
        ats.append(at)
    ids, starts, stops, prev = list(head), [], [], 0
    for at, needle in zip(ats, needles):
        ids += hay_ids[prev:at]
        starts.append(len(ids))
        ids += needle
        stops.append(len(ids))
        prev = at
    ids += hay_ids[prev:n_hay] + tail
    target = decoy = ()
    if len(item.expected) == 1:
        target = tuple(encode(f" {item.expected[0]}"))
        decoy = tuple(encode(f" {decoy_value(item, seed)}"))
    return RetrievalPrompt(torch.tensor(ids), item.expected, tuple(starts), tuple(stops), target, decoy)


def decoy_value(item: Item, seed) -> int:
    """A number of as many digits as the asked value, seeded, that no needle
    of the item states (nor any digit string of the needles contains)."""
    digits = len(str(item.expected[0]))
    rng = random.Random(f"retrieval-decoy-{item.expected[0]}-{seed}")
    planted = " ".join(item.needles)
    while True:
        v = rng.randrange(10 ** (digits - 1), 10**digits)
        if str(v) not in planted:
            return v


def numbers(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"\d+", text)]


def score(task: str, expected: tuple[int, ...], answer: str) -> dict:
    """correct: the first number is the asked value (passkey, multikey), or
    every value is among the numbers named (multivalue); recall: the
    fraction of expected values named."""
    found = numbers(answer)
    recall = sum(v in found for v in expected) / len(expected)
    correct = recall == 1.0 if task == "multivalue" else bool(found) and found[0] == expected[0]
    return {"correct": int(correct), "recall": recall}


class SharedPrefix:
    """Feeds prompts that share leading tokens through one cache: the state
    after a prompt's first `upto` tokens is reached by continuing the state
    already fed when that is a prefix of it, else from the beginning.
    `state(ids, upto)` returns a copy (the shared state stays as it was)."""

    def __init__(self, model, chunk: int = 1024):
        self.model, self.chunk = model, chunk
        self.cache, self.fed = new_cache(model), torch.zeros(0, dtype=torch.long)

    @torch.no_grad()
    def state(self, ids: torch.Tensor, upto: int):
        n = self.fed.shape[0]
        if n > upto or not torch.equal(ids[:n], self.fed):
            self.cache, self.fed, n = new_cache(self.model), ids[:0], 0
        if upto > n:
            _feed(self.model, self.cache, ids[n:upto], self.chunk)
        self.fed = ids[:upto].clone()
        return copy.deepcopy(self.cache)


def answer_prompt(model, decode, task: str, prompt: RetrievalPrompt, shared: SharedPrefix | None = None) -> dict:
    """One prompt answered greedily (from the shared prefix's state when
    given): the cell's record. With a target (passkey, multikey) it also
    records `answer_nll`, the asked value's mean negative log-likelihood in
    nats per token as the prompt's continuation (teacher-forced), and
    `decoy_nll`, the same for a value planted nowhere: decoy minus answer is
    a graded measure of what the state holds about the value (about 0 for a
    model that cannot see the needle, whatever its prior over numbers),
    where greedy decoding only says right or wrong. The needles' tokens go
    with the prompt as the marks of memory rule "oracle" (prompt.marks; the
    shared prefix holds no needle); a model without it ignores them."""
    t0, c0 = time.perf_counter(), time.process_time()
    new = ANSWER_TOKENS[task]
    targets = [prompt.target, prompt.decoy] if prompt.target else []
    if shared is None:
        tokens, nlls = greedy_and_likelihood(model, prompt.ids, targets, new, marks=prompt.marks)
    else:
        cache = shared.state(prompt.ids, prompt.shared)
        tokens, nlls = greedy_and_likelihood(
            model, prompt.ids, targets, new, cache=cache, start=prompt.shared, marks=prompt.marks
        )
    answer = decode(tokens)
    graded = {}
    if nlls:
        graded = {"answer_nll": round(nlls[0], 4), "decoy_nll": round(nlls[1], 4), "answer_tokens": len(prompt.target)}
    return {
        "expected": list(prompt.expected),
        "answer": answer,
        **score(task, prompt.expected, answer),
        **graded,
        "distance": prompt.distance,
        "first_needle": prompt.shared,
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(time.process_time() - c0, 2),
    }


class Reader:
    """Text <-> ids for the retrieval prompts of one subject
    (latte/eval/subjects.py): its transformers tokenizer (no special tokens
    added), its beginning-of-sequence ids, its chat frame, the haystacks."""

    def __init__(self, subject):
        self.hf, self.bos = subject.hf_tokenizer, subject.bos
        self.frame = chat_frame(self.hf) if getattr(self.hf, "chat_template", None) else None
        self._hay: dict[tuple, tuple[list[int], list[bool]]] = {}

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.hf.decode(ids)

    def hay(self, trial: int, haystack: str = "essays") -> tuple[list[int], list[bool]]:
        """The haystack's ids and sentence ends: the essays in the trial's
        order, or the noise filler (the same in every trial)."""
        if haystack not in HAYSTACKS:
            raise ValueError(f"haystack={haystack!r}: expected one of {', '.join(HAYSTACKS)}")
        key = (haystack, trial if haystack == "essays" else 0)
        if key not in self._hay:
            text = haystack_text(eval_essays(), seed=trial) if haystack == "essays" else noise_text()
            ids = self.encode(text)
            self._hay[key] = (ids, sentence_ends(self.hf, ids))
        return self._hay[key]

    def prompt(self, cell: dict) -> RetrievalPrompt:
        """The prompt of a cell {task, format, context, depth, trial} and
        optionally haystack (default "essays"): the planted numbers come from
        (context, depth, trial), so every model, format and haystack sees the
        same facts."""
        item = make_item(cell["task"], f"{cell['context']}-{cell['depth']}-{cell['trial']}")
        fmt = FORMATS[cell["format"]]
        hay, ends = self.hay(cell["trial"], cell.get("haystack", "essays"))
        return build_prompt(
            self.encode, hay, ends, cell["context"], cell["depth"], item, fmt, frame=self.frame, bos=self.bos
        )


def noise_text() -> str:
    """The noise haystack: NOISE repeated NOISE_REPEATS times."""
    return " ".join([NOISE] * NOISE_REPEATS)


def length_summary(lengths: list[int], window: int) -> dict:
    """The prompt-length distribution of a task, beside its scores: tokens,
    and tokens beyond the window (min, median, max), and the fraction of
    prompts longer than the window."""
    if not lengths:
        return {"prompts": 0}
    beyond = [max(0, n - window) for n in lengths]
    return {
        "prompts": len(lengths),
        "tokens_min": min(lengths),
        "tokens_median": statistics.median(lengths),
        "tokens_max": max(lengths),
        "beyond_window_median": statistics.median(beyond),
        "beyond_window_max": max(beyond),
        "longer_than_window": sum(n > window for n in lengths) / len(lengths),
    }


def retrieval_summary(groups, window: int, fmt: str, haystack: str = "essays") -> tuple[list[dict], str]:
    """(records, markdown table) of retrieval cells. `groups`: per model,
    (the fields naming it in records, its label, its cells). One record per
    (model, task, context): prompts, those whose nearest needle lies beyond
    the window (all of them when window is 0), found among them, mean recall,
    and `gap`: the mean of decoy_nll - answer_nll over them (nats per token;
    passkey and multikey, None for multivalue: answer_prompt)."""
    records, rows = [], []
    for fields, name, cells in groups:
        for task, context in dict.fromkeys((c["task"], c["context"]) for c in cells):
            cs = [c for c in cells if (c["task"], c["context"]) == (task, context)]
            far = [c for c in cs if c["distance"] >= window]
            k = sum(c["correct"] for c in far)
            recall = sum(c["recall"] for c in far) / len(far) if far else None
            graded = [c["decoy_nll"] - c["answer_nll"] for c in far if "answer_nll" in c]
            gap = sum(graded) / len(graded) if graded else None
            r = {**fields, "task": task, "context": context, "prompts": len(cs), "beyond_window": len(far)}
            records.append({**r, "found_beyond": k, "recall": recall, "gap": gap})
            rows.append([name, task, f"{context:,}", f"{k}/{len(far)}", _fmt(recall, "{:.2f}"), _fmt(gap, "{:+.3f}")])
    head = ["model", "task", "context", "found (needle beyond the window)", "mean recall", "mean gap (nats)"]
    note = (
        f"Format {fmt}; haystack {haystack}; window {window} tokens. Gap: the decoy's minus the asked value's mean "
        "negative log-likelihood per token, teacher-forced after the prompt (about 0 for a model that cannot see "
        "the needle)."
    )
    return records, note + "\n\n" + md_table(head, rows)


def _fmt(x, form: str) -> str:
    return "-" if x is None else form.format(x)
