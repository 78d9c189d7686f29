"""generate: chunked prefill then O(1) steps, left padding, eos, sampling."""

import pytest
import torch

from latte.models import MIXERS


def greedy_by_hand(model, x, n):
    """Reference: n greedy tokens, each by a full forward over everything so far."""
    for _ in range(n):
        nxt = model(x).logits[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return x


@pytest.mark.parametrize("mixer", MIXERS)
def test_greedy_matches_full_recompute_and_steps_one_token(make_lm, make_ids, mixer):
    model = make_lm(mixer)
    x = make_ids(2, 11)
    lengths = []
    model.model.register_forward_pre_hook(lambda m, a, kw: lengths.append(a[0].shape[1]), with_kwargs=True)
    out = model.generate(x, 10, temperature=0)
    assert lengths == [11] + [1] * 9  # one prefill, then single tokens from the state
    with torch.no_grad():
        assert torch.equal(out, greedy_by_hand(model, x, 10))


@pytest.mark.parametrize("mixer", MIXERS)
def test_left_padded_batch_generates_like_each_prompt_alone(make_lm, make_ids, mixer):
    model = make_lm(mixer)
    prompts = [make_ids(1, n, seed=20 + n) for n in (13, 5, 9)]
    T = 13
    x = torch.zeros(3, T, dtype=torch.long)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, p in enumerate(prompts):
        x[i, T - p.shape[1] :] = p[0]
        mask[i, T - p.shape[1] :] = 1
    out = model.generate(x, 8, temperature=0, attention_mask=mask)
    for i, p in enumerate(prompts):
        alone = model.generate(p, 8, do_sample=False)
        assert torch.equal(out[i, T:], alone[0, p.shape[1] :]), i


def test_eos_stops_each_row_and_pads_with_eos(make_lm, make_ids):
    model = make_lm("latte")
    x = make_ids(2, 6)
    free = model.generate(x, 12, temperature=0)
    eos = int(free[0, 6 + 2])  # the third token row 0 generates
    out = model.generate(x, 12, temperature=0, eos_token_id=eos)
    first = (free[0, 6:] == eos).nonzero()[0, 0]
    assert torch.equal(out[0, : 6 + first + 1], free[0, : 6 + first + 1])
    assert (out[0, 6 + first :] == eos).all()
    hit1 = (free[1, 6:] == eos).nonzero()
    n1 = int(hit1[0, 0]) if len(hit1) else 12
    assert torch.equal(out[1, : 6 + n1], free[1, : 6 + n1])
    # every row finished -> generation stops early
    all_eos = model.generate(x, 12, temperature=0, eos_token_id=[int(free[0, 6]), int(free[1, 6])])
    assert all_eos.shape == (2, 7)


def test_sampling_is_reproducible_and_top_k_1_is_greedy(make_lm, make_ids):
    model = make_lm("macchiato")
    x = make_ids(2, 5)
    a = model.generate(x, 10, generator=torch.Generator().manual_seed(3))
    b = model.generate(x, 10, generator=torch.Generator().manual_seed(3))
    c = model.generate(x, 10, generator=torch.Generator().manual_seed(4), top_p=0.9, temperature=1.5)
    assert torch.equal(a, b) and a.shape == c.shape == (2, 15)
    greedy = model.generate(x, 10, temperature=0)
    assert torch.equal(model.generate(x, 10, top_k=1, generator=torch.Generator().manual_seed(0)), greedy)
    assert torch.equal(model.generate(x, 10, top_p=1e-6, generator=torch.Generator().manual_seed(0)), greedy)
    assert not torch.equal(a, greedy)  # with 64 tokens and a flat random model, sampling differs


def test_generate_restores_training_mode_and_zero_tokens(make_lm, make_ids):
    model = make_lm("swa", dropout=0.2).train()
    x = make_ids(1, 4)
    assert torch.equal(model.generate(x, 0), x)
    assert torch.equal(model.generate(x, 5, temperature=0), model.eval().generate(x, 5, temperature=0))
    model.train()
    model.generate(x, 2, temperature=0)
    assert model.training


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(max_new_tokens=-3), r"max_new_tokens: expected an integer >= 0, got -3"),
        (dict(max_new_tokens=3, temperature=-1.0), "temperature"),
        (dict(max_new_tokens=3, temperature=float("nan")), r"temperature: expected a finite number >= 0"),
        (dict(max_new_tokens=3, temperature=float("inf")), r"temperature: expected a finite number >= 0"),
        (dict(max_new_tokens=3, top_k=-5), r"top_k: expected None or an integer >= 0 \(0 = off\), got -5"),
        (dict(max_new_tokens=3, top_k=2.5), "top_k"),
        (dict(max_new_tokens=3, top_p=1.5), "top_p"),
        (dict(max_new_tokens=3, top_p=2), "top_p"),
        (dict(max_new_tokens=3, top_p=0), r"top_p: expected None or a number in \(0, 1\]"),
        (dict(max_new_tokens=3, top_p=-0.5), "top_p"),
        (dict(max_new_tokens=3, top_p=float("nan")), "top_p"),
        (dict(max_new_tokens=3, do_sample=True, temperature=0), "do_sample"),
        (dict(max_new_tokens=3, eos_token_id=64), r"eos_token_id: expected None, an id or a list of ids in \[0, 63\]"),
        (dict(max_new_tokens=3, eos_token_id=[]), "eos_token_id"),
        (dict(max_new_tokens=3, attention_mask=torch.tensor([[1, 1, 1, 0]])), "LEFT padding"),
        (dict(max_new_tokens=3, attention_mask=torch.tensor([[1, 2, 1, 1]])), "0/1"),
    ],
)
def test_generate_argument_errors(make_lm, make_ids, kwargs, match):
    """generate and its streaming form share one validation, and `stream`
    raises when called, before a token (or a printed prompt) is produced."""
    model = make_lm("latte")
    with pytest.raises(ValueError, match=match):
        model.generate(make_ids(1, 4), **kwargs)
    with pytest.raises(ValueError, match=match):
        model.stream(make_ids(1, 4), **kwargs)
    if not {"attention_mask", "do_sample"} & kwargs.keys():  # what stream_tokens takes
        from latte.eval.generation import stream_tokens

        with pytest.raises(ValueError, match=match):
            stream_tokens(model, [1, 2, 3, 4], **kwargs)


def test_stream_yields_what_generate_returns_and_feeds_a_streamer(make_lm, make_ids):
    model = make_lm("macchiato")
    x = make_ids(2, 6)
    eos = int(model.generate(x, 8, temperature=0)[0, 6 + 2])
    whole = model.generate(x, 8, temperature=0, eos_token_id=eos)
    streamed = torch.stack(list(model.stream(x, 8, temperature=0, eos_token_id=eos)), 1)
    assert torch.equal(torch.cat([x, streamed], 1), whole)
    seen = []
    sampled = model.generate(x, 8, streamer=seen.append, generator=torch.Generator().manual_seed(5), top_k=5)
    assert torch.equal(torch.stack(seen, 1), sampled[:, 6:])
    # top_k=0 and top_p=1 are "off": the same draws as plain sampling
    for off in (dict(top_k=0), dict(top_p=1.0), dict(top_k=64)):
        again = model.generate(x, 8, generator=torch.Generator().manual_seed(5), **off)
        assert torch.equal(again, model.generate(x, 8, generator=torch.Generator().manual_seed(5))), off
