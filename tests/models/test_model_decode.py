"""Prefill + token-by-token decode == one full forward, for every mixer,
with and without a left-padded batch; decoding state constant in context."""

import pytest
import torch

from latte.models import MIXERS, LatteCache

CONSTANT_STATE = [m for m in MIXERS if m != "softmax"]
ATOL = 1e-4


def decode_logits(model, ids, splits, mask=None):
    """Logits of `ids` fed as chunks ending at `splits`, then one token at a
    time, each call continuing the returned state."""
    bounds = [0, *splits, *range(splits[-1] + 1, ids.shape[1] + 1)]
    state, out = None, []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = None if mask is None else mask[:, a:b]
        o = model(ids[:, a:b], state=state, use_cache=True, attention_mask=m)
        state = o.state
        out.append(o.logits)
    return torch.cat(out, 1), state


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("splits", [[1], [7], [8, 21], [30]])
def test_prefill_then_decode_equals_full_forward(make_lm, make_ids, mixer, splits):
    model = make_lm(mixer)  # window 8, chunk 8: the splits cross both
    x = make_ids(2, 40)
    with torch.no_grad():
        full = model(x).logits
        dec, state = decode_logits(model, x, splits)
    assert state.seen_tokens == 40 and state.pos.tolist() == [40, 40]
    torch.testing.assert_close(dec, full, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "mixer, extra",
    [
        *((m, {}) for m in MIXERS),
        (["latte", "swa"], {}),
        (["macchiato", "softmax"], dict(position_embedding="learned")),
        ("latte", dict(position_embedding="sinusoidal")),
    ],
)
def test_left_padded_batch_matches_each_sequence_alone(make_lm, make_ids, mixer, extra):
    """Prompts of 25, 11 and 3 tokens, left padded to 25, prefilled in two
    chunks, then 12 decoded tokens: every real position equals the row's own
    unpadded forward (positions count real tokens only)."""
    model = make_lm(mixer, **extra)
    lengths, T, K = [25, 11, 3], 25, 12
    seqs = [make_ids(1, n + K, seed=10 + i)[0] for i, n in enumerate(lengths)]
    x = torch.zeros(3, T + K, dtype=torch.long)
    mask = torch.zeros(3, T + K, dtype=torch.bool)
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        x[i, T - n :] = s
        mask[i, T - n :] = True
    with torch.no_grad():
        dec, _ = decode_logits(model, x, [13, T], mask)
        for i, (n, s) in enumerate(zip(lengths, seqs)):
            ref = model(s[None]).logits[0]
            torch.testing.assert_close(dec[i, T - n :], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mixer", ["latte", "macchiato"])
def test_gate_mix_and_qk_mixers_decode(make_lm, make_ids, mixer):
    for kw in (
        dict(mix="gate"),
        dict(qk_mixer="none"),
        dict(qk_mixer="conv"),
        dict(qk_mixer="rglru"),
        dict(num_kv_heads=1, num_heads=2),
    ):
        model = make_lm(mixer, **kw)
        x = make_ids(2, 30)
        with torch.no_grad():
            dec, _ = decode_logits(model, x, [9])
            torch.testing.assert_close(dec, model(x).logits, atol=ATOL, rtol=0)


def test_a_state_is_not_mutated_and_can_be_reused(make_lm, make_ids):
    model = make_lm("macchiato")
    x = make_ids(2, 20)
    with torch.no_grad():
        state = model(x[:, :12], use_cache=True).state
        a = model(x[:, 12:], state=state).logits
        b = model(x[:, 12:], state=state).logits
    assert state.seen_tokens == 12
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("mixer", CONSTANT_STATE)
def test_state_bytes_do_not_grow_with_context(make_lm, mixer):
    model = make_lm(mixer, chunk_size=64, num_layers=1)
    sizes = []
    with torch.no_grad():
        for T in (1024, 8192):
            state = model(torch.randint(0, 64, (1, T)), use_cache=True).state
            state = model(torch.tensor([[3]]), state=state).state  # and after a decode step
            sizes.append(state.nbytes())
    assert sizes[0] == sizes[1] > 0


def test_softmax_state_grows_so_the_size_check_can_fail(make_lm):
    model = make_lm("softmax", num_layers=1)
    with torch.no_grad():
        small = model(torch.randint(0, 64, (1, 64)), use_cache=True).state.nbytes()
        large = model(torch.randint(0, 64, (1, 512)), use_cache=True).state.nbytes()
    assert large > 4 * small


def test_cache_select_and_repeat(make_lm, make_ids):
    model = make_lm("macchiato")
    x = make_ids(3, 16)
    with torch.no_grad():
        st = model(x, use_cache=True).state
        nxt = make_ids(3, 1, seed=5)
        ref = model(nxt, state=st).logits
        picked = st.select(torch.tensor([2, 0]))
        assert isinstance(picked, LatteCache) and picked.batch_size == 2
        torch.testing.assert_close(model(nxt[[2, 0]], state=picked).logits, ref[[2, 0]], atol=ATOL, rtol=0)
        rep = st.repeat_interleave(2)
        torch.testing.assert_close(
            model(nxt.repeat_interleave(2, 0), state=rep).logits, ref.repeat_interleave(2, 0), atol=ATOL, rtol=0
        )


def test_state_errors(make_lm, make_ids):
    model = make_lm("latte")
    x = make_ids(2, 5)
    st = model(x, use_cache=True).state
    with pytest.raises(ValueError, match="batch"):
        model(make_ids(3, 1), state=st)
    with pytest.raises(ValueError, match="LatteCache"):
        model(x, state=(1, 2))
