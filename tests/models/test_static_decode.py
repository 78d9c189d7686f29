"""The static decoding state and step (latte/models/static_decode.py): one
state allocated per generation, a fixed-shape step updating it in place,
equal to the step-by-step loop over the cache as a value (static=False)."""

import pytest
import torch

from latte.layers import StaticKVCache
from latte.layers.states import _leaves
from latte.models import MIXERS
from latte.models.static_decode import StaticState, allocate, decode_step, reorder
from latte.ops.window.sliding_window import RingWindowState

CASES = [(m, {}) for m in MIXERS] + [
    ("macchiato", dict(num_sinks=2)),
    ("macchiato", dict(memory_slots=3)),
    ("macchiato", dict(num_sinks=2, memory_slots=3, memory_rule="attention")),
    ("macchiato", dict(num_sinks=1, memory_slots=2, memory_positions="cache")),
    ("swa", dict(window_size=4)),
    ("swa", dict(window_size=2)),
    ("macchiato", dict(window_size=3, num_sinks=2, memory_slots=2, memory_rule="attention")),
    ("macchiato", dict(window_size=2, memory_slots=0)),
    ("macchiato", dict(num_sinks=1, memory_slots=4, memory_rule="random")),
]


def _id(case):
    return case[0] + "".join(f"-{k}={v}" for k, v in case[1].items())


def _left_padded(make_ids):
    x = make_ids(3, 9, seed=5)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :7] = 0
    return x, mask


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_static_greedy_equals_the_value_loop_token_by_token(make_lm, make_ids, case):
    mixer, overrides = case
    model = make_lm(mixer, **({"window_size": 6} | overrides))
    x, mask = _left_padded(make_ids)
    n = 14  # beyond the window: the buffers wrap
    static = list(model.stream(x, n, temperature=0, attention_mask=mask, eos_check_every=3))
    value = list(model.stream(x, n, temperature=0, attention_mask=mask, static=False))
    assert len(static) == len(value) == n
    for i, (a, b) in enumerate(zip(static, value)):
        assert torch.equal(a, b), (i, a, b)


@pytest.mark.parametrize("mixer", ["macchiato", "softmax"])
def test_seeded_sampling_equals_the_value_loop(make_lm, make_ids, mixer):
    model = make_lm(mixer, num_sinks=1 if mixer == "macchiato" else 0)
    x = make_ids(2, 5)
    kw = dict(temperature=1.3, top_k=20, top_p=0.9)
    a = model.generate(x, 12, generator=torch.Generator().manual_seed(7), **kw)
    b = model.generate(x, 12, generator=torch.Generator().manual_seed(7), static=False, **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, model.generate(x, 12, temperature=0))


@pytest.mark.parametrize("every", [1, 2, 5, 64])
def test_eos_read_every_k_tokens_cuts_the_output_like_the_value_loop(make_lm, make_ids, every):
    model = make_lm("latte")
    x = make_ids(2, 6)
    free = model.generate(x, 12, temperature=0, static=False)
    eos = [int(free[0, 8]), int(free[1, 9])]
    want = model.generate(x, 12, temperature=0, eos_token_id=eos, static=False)
    got = model.generate(x, 12, temperature=0, eos_token_id=eos, eos_check_every=every)
    assert want.shape[1] < free.shape[1] and torch.equal(got, want)


def test_eos_check_every_is_checked_up_front(make_lm, make_ids):
    model = make_lm("latte")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="eos_check_every"):
            model.stream(make_ids(1, 3), 4, eos_check_every=bad)


def _static_state(model, x, mask, max_new):
    """The static state after a prefill of x, as `stream` builds it."""
    with torch.no_grad():
        hidden, cache = model.model(x, attention_mask=mask.bool(), use_cache=True)
    windows = [getattr(b.mixer, "window_size", None) for b in model.model.blocks]
    return model.lm_head(hidden[:, -1]), allocate(cache.layers, windows, cache.pos, x.shape[1], max_new)


def _feed(model):
    from latte.models.modeling import LatteCache

    def feed(tok, layers, pos):
        hidden, state = model.model(tok[:, None], state=LatteCache(layers, 0, pos), use_cache=True, inputs_checked=True)
        return model.lm_head(hidden[:, -1]), state.layers, state.pos

    return feed


@pytest.mark.parametrize("mixer", ["macchiato", "softmax", "swa"])
def test_the_step_writes_in_place_at_fixed_shapes(make_lm, make_ids, mixer):
    model = make_lm(mixer, num_sinks=1 if mixer == "macchiato" else 0)
    x, mask = _left_padded(make_ids)
    _, state = _static_state(model, x, mask, 6)
    before = [(t.data_ptr(), tuple(t.shape)) for t in _leaves(state.layers)]
    tok = torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        for _ in range(5):
            tok = decode_step(_feed(model), state, tok, lambda logits: logits.argmax(-1), None)
    assert [(t.data_ptr(), tuple(t.shape)) for t in _leaves(state.layers)] == before
    assert int(state.index) == 5 and torch.equal(state.pos, mask.sum(1) + 5)
    if mixer == "softmax":
        kv = state.layers[0]
        assert isinstance(kv, StaticKVCache) and kv.k.shape[1] == 9 + 6 and int(kv.index) == 9 + 5


def _window_slots(state) -> set:
    """The slot counts of every window buffer in a nested state."""
    if isinstance(state, RingWindowState):
        return {state.mask.shape[1]}
    if isinstance(state, (tuple, list)):
        return set().union(*(_window_slots(s) for s in state)) if state else set()
    return set()


@pytest.mark.parametrize("mixer", ["swa", "macchiato"])
def test_a_window_beyond_the_generation_sizes_its_buffers_by_the_generation(make_lm, make_ids, mixer):
    # issue 59, case 4: the static state holds min(W - 1, prompt + new - 1)
    # window slots, not W - 1, and the output is still the value loop's
    model = make_lm(mixer, window_size=10**6)
    x, mask = _left_padded(make_ids)
    _, state = _static_state(model, x, mask, 6)
    assert _window_slots(state.layers) == {9 + 6 - 1}
    static = list(model.stream(x, 6, temperature=0, attention_mask=mask, eos_check_every=2))
    value = list(model.stream(x, 6, temperature=0, attention_mask=mask, static=False))
    assert all(torch.equal(a, b) for a, b in zip(static, value)) and len(static) == 6


def _rings(state) -> list:
    """Every RingWindowState in a nested state."""
    if isinstance(state, RingWindowState):
        return [state]
    if isinstance(state, (tuple, list)):
        return [r for s in state for r in _rings(s)]
    return []


@pytest.mark.parametrize("mixer", ["swa", "macchiato"])
def test_a_step_writes_one_slot_of_the_ring_at_its_write_index(make_lm, make_ids, mixer):
    # the window buffer is a ring: a step overwrites the slot at the write
    # index (the oldest column) and advances it; no other slot moves
    extra = dict(num_sinks=1, memory_slots=2) if mixer == "macchiato" else {}
    model = make_lm(mixer, window_size=5, **extra)
    x, mask = _left_padded(make_ids)
    _, state = _static_state(model, x, mask, 8)
    rings = _rings(state.layers)
    assert rings and all(r.mask.shape[1] == 4 and int(r.index) == 9 % 4 for r in rings)
    tok = torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        for _ in range(6):
            before = [(int(r.index), r.k.clone(), r.mask.clone(), r.k.data_ptr()) for r in rings]
            tok = decode_step(_feed(model), state, tok, lambda logits: logits.argmax(-1), None)
            for r, (at, k, m, ptr) in zip(rings, before):
                assert r.k.data_ptr() == ptr and int(r.index) == (at + 1) % 4
                others = torch.arange(4) != at
                assert torch.equal(r.k[:, others], k[:, others]) and not torch.equal(r.k[:, at], k[:, at])
                assert bool(r.mask[:, at].all()) and torch.equal(r.mask[:, others], m[:, others])


def test_beam_reorder_through_the_static_state(make_lm, make_ids):
    # rows reordered in place (ring write index shared by every row) decode
    # as the prompts reordered before the prefill
    model = make_lm("macchiato", window_size=4, num_sinks=1, memory_slots=2)
    x = make_ids(3, 8)
    mask = torch.ones(3, 8, dtype=torch.long)
    order = torch.tensor([2, 0, 0])
    _, state = _static_state(model, x, mask, 7)
    _, ref = _static_state(model, x[order], mask, 7)
    reorder(state, order)
    assert isinstance(state, StaticState) and torch.equal(state.pos, ref.pos)
    tok = torch.tensor([5, 6, 7])
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    with torch.no_grad():
        for _ in range(6):
            got = decode_step(_feed(model), state, tok, pick, None)
            assert torch.equal(got, decode_step(_feed(model), ref, tok, pick, None))
            tok = got
    for a, b in zip(_leaves(state.layers), _leaves(ref.layers)):
        torch.testing.assert_close(a, b)


COMPILED = [(m, {}) for m in MIXERS] + [("macchiato", dict(num_sinks=1, memory_slots=2, memory_rule="attention"))]


@pytest.mark.parametrize("case", COMPILED, ids=_id)
def test_the_step_compiles_without_a_graph_break(make_lm, make_ids, case):
    model = make_lm(case[0], window_size=4, **case[1])
    x, mask = _left_padded(make_ids)
    _, state = _static_state(model, x, mask, 4)
    _, ref = _static_state(model, x, mask, 4)
    pick = lambda logits: logits.argmax(-1)  # noqa: E731
    step = torch.compile(
        lambda t: decode_step(_feed(model), state, t, pick, None), fullgraph=True, backend="aot_eager", dynamic=False
    )
    tok = torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        got = step(tok)
        want = decode_step(_feed(model), ref, tok, pick, None)
    assert torch.equal(got, want)
    for a, b in zip(_leaves(state.layers), _leaves(ref.layers)):
        torch.testing.assert_close(a, b)
