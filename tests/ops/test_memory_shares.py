"""The shares of Macchiato's joint normaliser on the window, the sinks, the
memory slots and the latents (latte/ops/reference.py:
macchiato_memory_shares, docs/math.md §4.2): by hand on a tiny case, summing
to 1, and against what the op computes."""

import math

import pytest
import torch

from latte.ops import latte_causal, macchiato
from latte.ops import reference as ref
from latte.ops.window.memory import Memory

f64 = torch.float64


def test_shares_of_a_tiny_case_by_hand():
    """One head of width 1, window 1, one sink, one slot (key_norm), scale
    1: query 3 sees itself, the sink 0 and the held token 2 (|k_2| = 3 beats
    |k_1| = 2); query 1 sees itself and the sink, no candidate yet."""
    k = torch.tensor([1.0, 2.0, -3.0, 0.5], dtype=f64).view(1, 4, 1, 1)
    q = torch.tensor([0.3, -0.6, 0.9, 0.7], dtype=f64).view(1, 4, 1, 1)
    a = torch.tensor([[0.0, 0.0], [0.1, -1.0], [0.0, 0.0], [0.2, -0.4]], dtype=f64).view(1, 4, 1, 2)
    b, v = torch.zeros_like(a), torch.ones(1, 4, 1, 1, dtype=f64)
    kw = dict(slots=1, rule="key_norm", num_sinks=1, scale=1.0)
    got = ref.macchiato_memory_shares(a, b, v, q, k, 1, **kw)[0, 0]  # [T, 4]
    parts3 = [math.exp(0.7 * 0.5), math.exp(0.7 * 1.0), math.exp(0.7 * -3.0), math.exp(0.2) + math.exp(-0.4)]
    parts1 = [math.exp(-0.6 * 2.0), math.exp(-0.6 * 1.0), 0.0, math.exp(0.1) + math.exp(-1.0)]
    for t, parts in ((3, parts3), (1, parts1)):
        want = torch.tensor([p / sum(parts) for p in parts], dtype=f64)
        torch.testing.assert_close(got[t], want, atol=1e-14, rtol=0)
    gate = torch.full((1, 4, 1), 0.25, dtype=f64)  # mix "gate": the local part's mass is exp(gate)
    got = ref.macchiato_memory_shares(a, b, v, q, k, 1, mix="gate", gate=gate, **kw)[0, 0, 3]
    local = math.exp(0.25) / (math.exp(0.25) + parts3[3])
    want = [local * p / sum(parts3[:3]) for p in parts3[:3]] + [1 - local]
    torch.testing.assert_close(got, torch.tensor(want, dtype=f64), atol=1e-14, rtol=0)


def inputs(T, B=2, H=4, K=2, L=3, E=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(B, T, H, L, generator=g, dtype=f64), torch.randn(B, T, H, L, generator=g, dtype=f64) * 2
    q, k = torch.randn(B, T, H, E, generator=g, dtype=f64), torch.randn(B, T, K, E, generator=g, dtype=f64) * 1.5
    mark = torch.rand(B, T, generator=g) < 0.4
    return a, b, q, k, mark, g


@pytest.mark.parametrize("mix", ["joint", "gate"])
def test_shares_sum_to_one_and_no_slots_hold_no_mass(mix):
    T, W = 19, 4
    a, b, q, k, _, g = inputs(T)
    v = torch.randn(2, T, 2, 3, generator=g, dtype=f64)
    gate = torch.randn(2, T, 4, generator=g, dtype=f64) if mix == "gate" else None
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :5] = False  # left padding
    kw = dict(num_sinks=2, mix=mix, gate=gate, mask=mask, beta=torch.randn(4, generator=g, dtype=f64))
    shares = ref.macchiato_memory_shares(a, b, v, q, k, W, slots=3, rule="key_norm", **kw)
    torch.testing.assert_close(shares.sum(-1), torch.ones(2, 4, T, dtype=f64), atol=1e-12, rtol=0)
    assert (shares >= 0).all() and shares[..., 2].max() > 0.05 and shares[..., 1].max() > 0.05
    none = ref.macchiato_memory_shares(a, b, v, q, k, W, slots=0, rule="key_norm", **kw)
    assert (none[..., 2] == 0).all()
    torch.testing.assert_close(none.sum(-1), torch.ones(2, 4, T, dtype=f64), atol=1e-12, rtol=0)


def rotary(pos):
    """Llama's rotary tables of width 6 at integer positions (float64)."""
    inv = 1.0 / 10000 ** (torch.arange(0, 6, 2, dtype=f64) / 6)
    ang = pos.to(f64)[:, None] * inv
    emb = torch.cat([ang, ang], -1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("rule, positions", [("key_norm", None), ("oracle", None), ("attention", "cache")])
def test_shares_are_those_of_the_op(rule, positions):
    """With one-hot values (D = T) the op's output is p(s|t) itself. The op
    at beta = -1e4 gives the local branch's distribution (its latents' mass
    exp(-1e4)), latte_causal the latents'; the op at beta = 0 mixes the two,
    y = w y_local + (1 - w) y_latents, and w is the local share. The window,
    sink and slot shares are w times the local distribution's mass on each
    part: a shares function that dropped a branch (or the op one) fails."""
    T, W, S, M, H, K = 16, 3, 2, 3, 4, 2
    a, b, q, k, mark, g = inputs(T, H=H, K=K)
    v = torch.eye(T, dtype=f64)[None, :, None, :].expand(2, T, K, T).contiguous()
    memory_q = torch.randn(2, T, H, 6, generator=g, dtype=f64) if positions else None
    mk = dict(mark=mark) if rule == "oracle" else {}
    shares = ref.macchiato_memory_shares(
        a, b, v, q, k, W, slots=M, rule=rule, num_sinks=S, memory_q=memory_q, rotary=rotary if positions else None, **mk
    )
    memory = Memory(M, rule, 0, rotary if positions else None)
    op = dict(window_size=W, num_sinks=S, memory=memory, memory_q=memory_q)
    op.update(memory_mark=mark) if rule == "oracle" else None
    y, _ = macchiato(a, b, v, q, k, beta=torch.zeros(H, dtype=f64), **op)
    y_loc, _ = macchiato(a, b, v, q, k, beta=torch.full((H,), -1e4, dtype=f64), **op)
    y_lat, _ = latte_causal(a, b, v.repeat_interleave(H // K, 2))
    y, y_loc, y_lat = (x[:, 1:] for x in (y, y_loc, y_lat))  # query 0 sees token 0 only, in both branches
    d = y_loc - y_lat
    w = ((y - y_lat) * d).sum(-1) / (d * d).sum(-1)  # [B, T, H]
    torch.testing.assert_close((y - y_lat), w[..., None] * d, atol=1e-10, rtol=0)  # y is on that line
    t = torch.arange(1, T)[:, None]
    s = torch.arange(T)[None, :]
    window = ((s <= t) & (s > t - W)).to(f64)  # [T(t), T(s)]
    sinks = ((s < S) & (s <= t - W)).to(f64)
    want = torch.stack(
        [
            w * torch.einsum("bths,ts->bth", y_loc, window),
            w * torch.einsum("bths,ts->bth", y_loc, sinks),
            w * torch.einsum("bths,ts->bth", y_loc, 1 - window - sinks),
            1 - w,
        ],
        -1,
    ).transpose(1, 2)  # [B, H, T, 4]
    torch.testing.assert_close(shares[:, :, 1:], want, atol=1e-10, rtol=0)
    assert shares[..., 2].max() > 0.05 and shares[..., 1].max() > 0.05 and shares[..., 3].mean() > 0.05
