"""Memory slots of Macchiato (docs/math.md §4.2): the chunked sequence and the
decoding steps against the float64 reference, per rule, across window, sink
and slot boundaries, with states, padding, packing and beam reordering."""

import pytest
import torch

from latte.ops import macchiato, macchiato_step
from latte.ops import reference as ref
from latte.ops.window import memory as mem
from latte.ops.window.memory import MEMORY_RULES, Memory

f64 = torch.float64
B, H, K, L, E = 2, 4, 2, 3, 5


def inputs(T, dtype=f64, seed=0, batch=B):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g, dtype=f64) * s).to(dtype)

    a, b = r(batch, T, H, L), r(batch, T, H, L, s=2.0)
    v, q, k = r(batch, T, K, E), r(batch, T, H, E), r(batch, T, K, E, s=1.5)
    mark = torch.rand(batch, T, generator=g) < 0.3
    return a, b, v, q, k, mark


def run_steps(a, b, v, q, k, mark, W, memory, mask=None, state=None, **kw):
    ys = []
    for t in range(a.shape[1]):
        y, state = macchiato_step(
            a[:, t],
            b[:, t],
            v[:, t],
            q[:, t],
            k[:, t],
            state,
            window_size=W,
            memory=memory,
            mask_t=None if mask is None else mask[:, t],
            memory_mark_t=mark[:, t] if memory.rule == "oracle" else None,
            **kw,
        )
        ys.append(y)
    return torch.stack(ys, 1), state


def reference(a, b, v, q, k, mark, W, memory, **kw):
    m = mark if memory.rule == "oracle" else None
    return ref.macchiato_memory(a, b, v, q, k, W, slots=memory.slots, rule=memory.rule, seed=memory.seed, mark=m, **kw)


@pytest.mark.parametrize("rule", MEMORY_RULES)
@pytest.mark.parametrize("num_sinks", [0, 2])
@pytest.mark.parametrize("W, M", [(4, 3), (1, 2), (6, 1)])
def test_sequence_and_steps_equal_reference(rule, num_sinks, W, M):
    T = 23
    a, b, v, q, k, mark = inputs(T)
    memory = Memory(M, rule, 7)
    m = {"memory_mark": mark} if rule == "oracle" else {}
    want = reference(a, b, v, q, k, mark, W, memory, num_sinks=num_sinks)
    assert (want - ref.macchiato(a, b, v, q, k, W, num_sinks=num_sinks)).abs().max() > 1e-2  # the slots matter
    for chunk in (1, 3, 5, 64):
        y, _ = macchiato(a, b, v, q, k, window_size=W, memory=memory, chunk_size=chunk, num_sinks=num_sinks, **m)
        torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)
    y, _ = run_steps(a, b, v, q, k, mark, W, memory, num_sinks=num_sinks)
    torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("rule", MEMORY_RULES)
def test_prefill_then_steps_carry_the_same_state(rule):
    """A prefill cut anywhere (inside the window, at the sinks, past the slots)
    then decoding equals one pass; the state equals the steps' state."""
    T, W, M, S = 20, 4, 3, 1
    a, b, v, q, k, mark = inputs(T, seed=1)
    memory = Memory(M, rule, 3)
    want = reference(a, b, v, q, k, mark, W, memory, num_sinks=S)
    _, st_steps = run_steps(a, b, v, q, k, mark, W, memory, num_sinks=S)
    for cut in (1, 3, 5, 9, 17):
        m = {"memory_mark": mark[:, :cut]} if rule == "oracle" else {}
        y1, st = macchiato(
            *(x[:, :cut] for x in (a, b, v, q, k)),
            window_size=W,
            memory=memory,
            chunk_size=4,
            num_sinks=S,
            output_final_state=True,
            **m,
        )
        rest = (x[:, cut:] for x in (a, b, v, q, k, mark))
        y2, st2 = run_steps(*rest, W, memory, state=st, num_sinks=S)
        torch.testing.assert_close(torch.cat([y1, y2], 1), want, atol=1e-12, rtol=1e-12)
        for x, x_steps in zip(st2.memory, st_steps.memory):
            torch.testing.assert_close(x, x_steps, atol=1e-12, rtol=1e-12)


def test_zero_slots_is_the_model_without_memory_bit_for_bit():
    a, b, v, q, k, _ = inputs(17, torch.float32)
    y0, st0 = macchiato(a, b, v, q, k, window_size=4, num_sinks=2, output_final_state=True)
    y, st = macchiato(a, b, v, q, k, window_size=4, num_sinks=2, memory=Memory(0), output_final_state=True)
    assert torch.equal(y, y0) and st.memory is None
    yt0, _ = macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st0, window_size=4, num_sinks=2)
    yt, _ = macchiato_step(
        a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st, window_size=4, num_sinks=2, memory=Memory(0)
    )
    assert torch.equal(yt, yt0)


@pytest.mark.parametrize("rule", MEMORY_RULES)
def test_left_padding_is_never_a_candidate(rule):
    T, W, M = 18, 3, 4
    a, b, v, q, k, mark = inputs(T, seed=2)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :5] = False
    mark = mark | ~mask  # the oracle's marks on padding must not count either
    memory = Memory(M, rule, 1)
    m = {"memory_mark": mark} if rule == "oracle" else {}
    want = reference(a, b, v, q, k, mark, W, memory, mask=mask, num_sinks=1)
    y, st = macchiato(
        a, b, v, q, k, window_size=W, memory=memory, mask=mask, num_sinks=1, chunk_size=4, output_final_state=True, **m
    )
    torch.testing.assert_close(y[mask], want[mask], atol=1e-12, rtol=1e-12)
    ys, st_steps = run_steps(a, b, v, q, k, mark, W, memory, mask=mask, num_sinks=1)
    torch.testing.assert_close(ys[mask], want[mask], atol=1e-12, rtol=1e-12)
    for x, x_steps in zip(st.memory, st_steps.memory):
        torch.testing.assert_close(x, x_steps)
    held = st.memory.pos[0][st.memory.mask[0]]
    assert held.numel() and (held >= 1).all()  # absolute positions count real tokens; the sink (0) is never held


@pytest.mark.parametrize("rule", ["recall", "attention", "random"])
def test_packed_documents_reset_the_slots(rule):
    W, M, lengths = 3, 2, [7, 12, 5]
    a, b, v, q, k, mark = inputs(sum(lengths), seed=3, batch=1)
    memory = Memory(M, rule, 5)
    cu = torch.tensor([0, 7, 19, 24])
    y, st = macchiato(
        a, b, v, q, k, window_size=W, memory=memory, cu_seqlens=cu, chunk_size=4, num_sinks=1, output_final_state=True
    )
    for i in range(3):
        part = [x[:, cu[i] : cu[i + 1]] for x in (a, b, v, q, k, mark)]
        want = reference(*part, W, memory, num_sinks=1)
        torch.testing.assert_close(y[:, cu[i] : cu[i + 1]], want, atol=1e-12, rtol=1e-12)
        _, st_doc = run_steps(*part, W, memory, num_sinks=1)
        for x, x_doc in zip(st.memory, st_doc.memory):
            torch.testing.assert_close(x[i : i + 1], x_doc)


@pytest.mark.parametrize("rule", ["key_norm", "attention", "random"])
def test_prefill_blocks_drop_tokens_that_cannot_be_held(monkeypatch, rule):
    """Once the slots are full, a prefill block reads the M held tokens and
    only the new ones that beat the worst of them (memory._COMPACT, on CPU):
    fewer keys than M + block, the same outputs and state as reading all."""
    T, W, M, S, chunk = 60, 3, 2, 1, 8
    a, b, v, q, k, mark = inputs(T, seed=9)
    memory = Memory(M, rule, 2)
    want = reference(a, b, v, q, k, mark, W, memory, num_sinks=S)
    attend, widths = mem.attend, []

    def spy(q, ks, *args):
        widths.append(ks.shape[2])
        return attend(q, ks, *args)

    monkeypatch.setattr(mem, "attend", spy)
    got = {}
    for devices in ((), ("cpu",)):
        monkeypatch.setattr(mem, "_COMPACT", devices)
        widths.clear()
        kw = dict(window_size=W, memory=memory, num_sinks=S, chunk_size=chunk, output_final_state=True)
        y, st = macchiato(a, b, v, q, k, **kw)
        torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)
        got[devices] = (st.memory, list(widths))
    assert all(w == M + chunk for w in got[()][1][:-1])
    assert min(got[("cpu",)][1]) < M + chunk  # some blocks read fewer keys
    for x, z in zip(got[()][0], got[("cpu",)][0]):
        torch.testing.assert_close(x, z, atol=0, rtol=0)


def test_beam_reordering_of_the_state():
    T, W, M, cut = 16, 3, 3, 9
    a, b, v, q, k, mark = inputs(T, seed=4)
    memory = Memory(M, "key_norm")
    _, st = macchiato(*(x[:, :cut] for x in (a, b, v, q, k)), window_size=W, memory=memory, output_final_state=True)
    beams = torch.tensor([1, 1, 0])
    st = type(st)(*(None if s is None else type(s)(*(x.index_select(0, beams) for x in s)) for s in st))
    rest = [x[beams, cut:] for x in (a, b, v, q, k, mark)]
    y, _ = run_steps(*rest, W, memory, state=st)
    want = reference(*(x[beams] for x in (a, b, v, q, k, mark)), W, memory)
    torch.testing.assert_close(y, want[:, cut:], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("rule", ["recall", "attention", "key_norm"])
def test_float32_selections_differ_rarely(rule):
    """float32 picks the same tokens as float64 but where two scores are
    closer than its rounding: a bounded share of the held slots."""
    T, W, M = 96, 8, 6
    a, b, v, q, k, mark = inputs(T, seed=5)
    memory = Memory(M, rule)
    held = {}
    for dtype in (f64, torch.float32):
        x = [t.to(dtype) for t in (a, b, v, q, k)]
        _, st = macchiato(*x, window_size=W, memory=memory, chunk_size=16, output_final_state=True)
        held[dtype] = torch.where(st.memory.mask, st.memory.pos, -1)
    assert (held[f64] >= 0).all()
    assert (held[f64] != held[torch.float32]).double().mean() <= 0.05


@pytest.mark.parametrize("rule", MEMORY_RULES)
def test_every_tensor_takes_its_device_from_the_inputs(rule):
    a, b, v, q, k, mark = (x.to("meta") for x in inputs(9, torch.float32))
    memory = Memory(2, rule)
    m = {"memory_mark": mark} if rule == "oracle" else {}
    y, st = macchiato(a, b, v, q, k, window_size=3, memory=memory, num_sinks=1, output_final_state=True, **m)
    assert y.device.type == "meta" and all(x.device.type == "meta" for x in st.memory)
    mt = {"memory_mark_t": mark[:, 0]} if rule == "oracle" else {}
    y, st = macchiato_step(
        a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st, window_size=3, memory=memory, num_sinks=1, **mt
    )
    assert y.device.type == "meta" and all(x.device.type == "meta" for x in st.memory)


def test_state_size_is_constant_in_the_context():
    a, b, v, q, k, mark = inputs(30, torch.float32)
    memory = Memory(4, "random")
    _, st = run_steps(a[:, :3], b[:, :3], v[:, :3], q[:, :3], k[:, :3], mark, 5, memory)
    sizes = [x.shape for x in st.memory]
    _, st = run_steps(a, b, v, q, k, mark, 5, memory)
    assert [x.shape for x in st.memory] == sizes


@pytest.mark.parametrize(
    "memory, match",
    [
        (Memory(-1), r"memory.slots: expected an integer in \[0, 4096\]"),
        (Memory(4097), "memory.slots"),
        (Memory(2, "best"), "memory.rule: expected one of"),
        (Memory(2, "random", -3), "memory.seed"),
        ((2, "random"), "memory: expected None or a Memory"),
    ],
)
def test_bad_memory_settings_are_named(memory, match):
    a, b, v, q, k, _ = inputs(5, torch.float32)
    with pytest.raises(ValueError, match=match):
        macchiato(a, b, v, q, k, window_size=3, memory=memory)


def test_memory_inputs_without_slots_and_a_state_of_other_slots_are_refused():
    a, b, v, q, k, mark = inputs(5, torch.float32)
    with pytest.raises(ValueError, match="memory_mark: only used with memory slots"):
        macchiato(a, b, v, q, k, window_size=3, memory_mark=mark)
    _, st = macchiato(a, b, v, q, k, window_size=3, memory=Memory(2), output_final_state=True)
    with pytest.raises(ValueError, match=r"state.memory.k: expected shape"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st, window_size=3, memory=Memory(3))
    with pytest.raises(ValueError, match="state.memory: a MemoryState needs memory slots"):
        macchiato_step(a[:, 0], b[:, 0], v[:, 0], q[:, 0], k[:, 0], st, window_size=3)


def rotary(pos):
    """Llama's rotary tables of width 6 at integer positions (float64)."""
    inv = 1.0 / 10000 ** (torch.arange(0, 6, 2, dtype=f64) / 6)
    ang = pos.to(f64)[:, None] * inv
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("rule", ["key_norm", "attention", "recall"])
@pytest.mark.parametrize("num_sinks", [0, 2])
def test_slots_at_fixed_positions_equal_reference(rule, num_sinks):
    """memory_positions "cache": a held key is scored at its slot's position
    num_sinks + i, whatever its own; prefill, steps and their states agree."""
    T, W, M = 22, 4, 3
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(B, T, H, L, generator=g, dtype=f64), torch.randn(B, T, H, L, generator=g, dtype=f64) * 2
    v, q, k = (torch.randn(B, T, n, 6, generator=g, dtype=f64) for n in (K, H, K))
    memory_q = torch.randn(B, T, H, 6, generator=g, dtype=f64)
    memory = Memory(M, rule, 0, rotary)
    want = ref.macchiato_memory(
        a, b, v, q, k, W, slots=M, rule=rule, memory_q=memory_q, rotary=rotary, num_sinks=num_sinks
    )
    absolute = ref.macchiato_memory(a, b, v, q, k, W, slots=M, rule=rule, memory_q=memory_q, num_sinks=num_sinks)
    assert (want - absolute).abs().max() > 1e-3  # the positions matter
    kw = dict(window_size=W, memory=memory, num_sinks=num_sinks)
    for chunk in (1, 5, 64):
        y, st = macchiato(a, b, v, q, k, memory_q=memory_q, chunk_size=chunk, output_final_state=True, **kw)
        torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)
    y1, st = macchiato(*(x[:, :9] for x in (a, b, v, q, k)), memory_q=memory_q[:, :9], output_final_state=True, **kw)
    ys = [y1]
    for t in range(9, T):
        y, st = macchiato_step(a[:, t], b[:, t], v[:, t], q[:, t], k[:, t], st, memory_q_t=memory_q[:, t], **kw)
        ys.append(y[:, None])
    torch.testing.assert_close(torch.cat(ys, 1), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("rule", ["key_norm", "recall", "attention"])
def test_gradients_equal_reference(rule):
    """The selection is discrete; through the held keys, values and the
    queries the gradients are the reference's (training with the slots)."""
    T, W, M = 17, 4, 3
    leaves = [x.requires_grad_() for x in inputs(T, seed=7)[:5]]
    memory = Memory(M, rule)
    g = torch.randn(B, T, H, E, dtype=f64, generator=torch.Generator().manual_seed(8))
    y, _ = macchiato(*leaves, window_size=W, memory=memory, num_sinks=1, chunk_size=5)
    got = torch.autograd.grad((y * g).sum(), leaves)
    want = torch.autograd.grad((reference(*leaves, None, W, memory, num_sinks=1) * g).sum(), leaves)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
