"""The from-scratch `macchiato` mixer with attention sinks (LatteConfig
num_sinks, docs/math.md §4.1): decode == forward, left padding invisible,
constant state, the run config and the Hugging Face config carry it."""

import json

import pytest
import torch

from latte.config_io import ConfigError
from latte.layers import state_nbytes
from latte.models import LatteConfig, LatteForCausalLM
from latte.train.config import ModelConfig
from tests.models.test_model_decode import decode_logits

ATOL = 1e-4


@pytest.mark.parametrize("splits", [[1], [3, 10], [20]])
def test_prefill_then_decode_equals_full_forward(make_lm, make_ids, splits):
    model = make_lm("macchiato", num_sinks=2)  # window 8: the sinks leave it from token 9 on
    x = make_ids(2, 30)
    with torch.no_grad():
        full = model(x).logits
        dec, state = decode_logits(model, x, splits)
        plain = make_lm("macchiato")(x).logits  # the same weights without sinks
    torch.testing.assert_close(dec, full, atol=ATOL, rtol=0)
    # the first 8 positions see no sink outside their window (rounding only: the latent
    # kernel's chunk-wide maxima see the later tokens, which differ in layer 2)
    torch.testing.assert_close(full[:, :8], plain[:, :8], atol=1e-6, rtol=0)
    assert (full[:, 9:] - plain[:, 9:]).abs().max() > 1e-3
    assert all(s.attn.sinks.k.shape[1] == 2 for s in state.layers)


def test_left_padded_batch_matches_each_sequence_alone(make_lm, make_ids):
    model = make_lm("macchiato", num_sinks=3, mix="gate")
    lengths, T, K = [20, 9, 2], 20, 10
    seqs = [make_ids(1, n + K, seed=10 + i)[0] for i, n in enumerate(lengths)]
    x = torch.zeros(3, T + K, dtype=torch.long)
    mask = torch.zeros(3, T + K, dtype=torch.bool)
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        x[i, T - n :], mask[i, T - n :] = s, True
    with torch.no_grad():
        dec, _ = decode_logits(model, x, [7, T], mask)
        for i, (n, s) in enumerate(zip(lengths, seqs)):
            torch.testing.assert_close(dec[i, T - n :], model(s[None]).logits[0], atol=ATOL, rtol=0)


def test_state_holds_the_sinks_once_whatever_the_context(make_lm):
    model = make_lm("macchiato", num_sinks=4, num_layers=1)
    with torch.no_grad():
        sizes = [state_nbytes(model(torch.randint(0, 64, (1, T)), use_cache=True).state.layers) for T in (20, 300)]
    plain = make_lm("macchiato", num_layers=1)
    with torch.no_grad():
        base = state_nbytes(plain(torch.randint(0, 64, (1, 20)), use_cache=True).state.layers)
    assert sizes[0] == sizes[1] == base + 4 * (2 * 2 * 16 * 4 + 1 + 8)  # k, v (2 heads x 16, float32), mask, offset


def test_config_field_is_validated_and_carried_by_the_run_config():
    with pytest.raises(ConfigError, match=r"num_sinks: got -1 \(int\), expected an integer >= 0"):
        LatteConfig.tiny(mixer="macchiato", num_sinks=-1)
    with pytest.raises(ConfigError, match="num_sinks: got 1.5"):
        LatteConfig.tiny(mixer="macchiato", num_sinks=1.5)
    assert LatteConfig().num_sinks == 0 == ModelConfig().num_sinks  # existing configs unchanged
    assert ModelConfig(mixer="macchiato", num_sinks=4).to_latte_config(300).num_sinks == 4


def test_hugging_face_config_round_trips_the_sinks(tmp_path, make_lm, make_ids):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from latte.models import from_pretrained, hf

    hf.register()
    model = make_lm("macchiato", num_sinks=2)
    model.save_pretrained(tmp_path / "native")
    hfm = AutoModelForCausalLM.from_pretrained(tmp_path / "native")
    assert hfm.config.num_sinks == 2 and hfm.config.to_latte_config() == model.config
    hfm.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["num_sinks"] == 2
    x = make_ids(2, 20)
    native = from_pretrained(tmp_path / "hf").eval()
    assert native.config.num_sinks == 2 and torch.equal(native(x).logits, model(x).logits)
    with torch.no_grad():
        assert torch.equal(hfm(x).logits, model(x).logits)
    assert isinstance(model, LatteForCausalLM)
