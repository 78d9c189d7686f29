import numpy as np
import pytest
import torch

from latte.data import SampleLoader, TokenWindows, iter_eval_batches, unigram_perplexity


def windows(num_tokens=101, seq_len=4):
    return TokenWindows(np.arange(num_tokens, dtype=np.uint16), seq_len)


def test_token_windows_layout():
    w = windows(101, 4)  # 100 targets -> 25 windows
    assert len(w) == 25
    np.testing.assert_array_equal(w[0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(w[24], [96, 97, 98, 99, 100])
    x, y = w.batch([2, 0])
    assert x.dtype == y.dtype == torch.int64 and x.shape == (2, 4)
    assert x.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert y.tolist() == [[9, 10, 11, 12], [1, 2, 3, 4]]
    assert len(windows(100, 4)) == 24  # the last target would be missing
    with pytest.raises(IndexError):
        w[25]


def test_token_windows_too_short_says_counts():
    with pytest.raises(ValueError, match=r"7 tokens, but seq_len=8 needs at least 9"):
        TokenWindows(np.arange(7), 8)
    with pytest.raises(ValueError, match="seq_len=0"):
        TokenWindows(np.arange(7), 0)


def take(loader, steps):
    return [next(loader) for _ in range(steps)]


def test_loader_shapes_and_labels_are_shifted_inputs():
    loader = SampleLoader(windows(), global_batch_size=6, seed=1)
    x, y = next(loader)
    assert x.shape == y.shape == (6, 4) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    assert loader.state_dict() == {"sample_index": 6}


def test_resume_from_state_equals_continuing():
    a = SampleLoader(windows(), global_batch_size=6, seed=7)
    take(a, 3)
    state = a.state_dict()
    rest_a = take(a, 10)  # crosses epoch boundaries (25 windows per epoch)
    b = SampleLoader(windows(), global_batch_size=6, seed=7)
    b.load_state_dict(state)
    rest_b = take(b, 10)
    c = SampleLoader(windows(), global_batch_size=6, seed=7, start_index=state["sample_index"])
    rest_c = take(c, 10)
    for (xa, ya), (xb, yb), (xc, _) in zip(rest_a, rest_b, rest_c):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(xa, xc)


def test_two_ranks_union_equals_one_rank():
    one = SampleLoader(windows(), global_batch_size=8, seed=3)
    r0 = SampleLoader(windows(), global_batch_size=8, seed=3, rank=0, world_size=2)
    r1 = SampleLoader(windows(), global_batch_size=8, seed=3, rank=1, world_size=2)
    for _ in range(7):
        x, y = next(one)
        x0, y0 = next(r0)
        x1, y1 = next(r1)
        assert x0.shape == (4, 4)
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
        assert not torch.equal(x0, x1)


def test_resume_on_a_different_world_size():
    one = SampleLoader(windows(), global_batch_size=8, seed=5)
    take(one, 4)
    state = one.state_dict()
    expected = torch.cat([next(one)[0] for _ in range(3)])
    ranks = []
    for r in range(4):
        loader = SampleLoader(windows(), global_batch_size=8, seed=5, rank=r, world_size=4)
        loader.load_state_dict(state)
        ranks.append(take(loader, 3))
    got = torch.cat([torch.cat([ranks[r][k][0] for r in range(4)]) for k in range(3)])
    assert torch.equal(got, expected)


def test_epoch_boundaries_each_window_once_per_epoch():
    w = windows(101, 4)  # 25 windows; batches of 10 straddle epochs
    loader = SampleLoader(w, global_batch_size=10, seed=11)
    firsts = torch.cat([next(loader)[0][:, 0] for _ in range(5)]).tolist()  # 50 samples
    epoch0, epoch1 = firsts[:25], firsts[25:]
    assert sorted(epoch0) == sorted(epoch1) == [4 * i for i in range(25)]
    assert epoch0 != epoch1  # a new permutation per epoch
    assert epoch0 != sorted(epoch0)  # shuffled
    assert loader.epoch == 2
    again = SampleLoader(w, global_batch_size=10, seed=11)
    assert torch.cat([next(again)[0][:, 0] for _ in range(5)]).tolist() == firsts
    other = SampleLoader(w, global_batch_size=10, seed=12)
    assert torch.cat([next(other)[0][:, 0] for _ in range(3)]).tolist()[:25] != epoch0


def test_no_shuffle_is_sequential():
    loader = SampleLoader(windows(21, 4), global_batch_size=3, shuffle=False)
    firsts = torch.cat([next(loader)[0][:, 0] for _ in range(3)]).tolist()
    assert firsts == [0, 4, 8, 12, 16, 0, 4, 8, 12]


def test_loader_argument_errors():
    w = windows()
    with pytest.raises(ValueError, match=r"global_batch_size=6 must be divisible by world_size=4"):
        SampleLoader(w, global_batch_size=6, world_size=4)
    with pytest.raises(ValueError, match=r"rank=2: must be an int in \[0, world_size=2\)"):
        SampleLoader(w, global_batch_size=4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="global_batch_size=0"):
        SampleLoader(w, global_batch_size=0)
    loader = SampleLoader(w, global_batch_size=2)
    with pytest.raises(ValueError, match="sample_index=-3"):
        loader.load_state_dict({"sample_index": -3})
    with pytest.raises(ValueError, match="sample_index=None"):
        loader.load_state_dict({"step": 3})


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_batches_cover_each_window_once(world_size):
    w = windows(101, 4)
    seen = []
    for rank in range(world_size):
        for x, y in iter_eval_batches(w, 4, rank, world_size):
            assert x.shape[0] <= 4 and torch.equal(y[:, :-1], x[:, 1:])
            seen += x[:, 0].tolist()
    assert sorted(seen) == [4 * i for i in range(25)]


def test_unigram_perplexity_exact_and_sane(small_tokenizer, pydoc_docs):
    # counts+1 = [3, 2, 1] over 6 -> p(0) = 1/2 -> perplexity 2
    assert unigram_perplexity(np.array([0, 0, 1]), np.array([0]), 3) == pytest.approx(2.0)
    vocab = small_tokenizer.vocab_size

    def ids(text):
        return np.array(small_tokenizer.encode(text))

    prose = unigram_perplexity(ids(pydoc_docs[40].text + pydoc_docs[41].text), ids(pydoc_docs[42].text), vocab)
    chant = "the cat sat on the mat. " * 200
    repetitive = unigram_perplexity(ids(chant), ids(chant[:1000]), vocab)
    assert 1.0 < repetitive < 10 < prose < vocab
    with pytest.raises(ValueError, match="val_tokens: token id 512"):
        unigram_perplexity(ids(chant), np.array([512]), vocab)
    with pytest.raises(ValueError, match="val_tokens is empty"):
        unigram_perplexity(ids(chant), np.array([], dtype=np.int64), vocab)
