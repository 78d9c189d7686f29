"""Memory slots on the from-scratch `macchiato` mixer (LatteConfig
memory_slots / memory_rule, docs/math.md §4.2): decode == forward, left
padding invisible, the fields validated, saved and read back, and settable
on a saved model without retraining."""

import json

import pytest
import torch

from latte.config_io import ConfigError
from latte.models import LatteConfig
from latte.train.config import ModelConfig
from tests.models.test_model_decode import decode_logits

ATOL = 1e-4


@pytest.mark.parametrize("rule", ["recall", "attention", "random"])
@pytest.mark.parametrize("splits", [[1], [10, 21], [33]])
def test_prefill_then_decode_equals_full_forward(make_lm, make_ids, rule, splits):
    model = make_lm("macchiato", num_sinks=1, memory_slots=3, memory_rule=rule)  # window 8
    x = make_ids(2, 40)
    with torch.no_grad():
        full = model(x).logits
        dec, state = decode_logits(model, x, splits)
        plain = make_lm("macchiato", num_sinks=1)(x).logits  # the same weights without slots
    torch.testing.assert_close(dec, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(full[:, :9], plain[:, :9], atol=1e-6, rtol=0)  # nothing has left the window yet
    assert (full[:, 12:] - plain[:, 12:]).abs().max() > 1e-3
    assert all(s.attn.memory.k.shape[1] == 3 for s in state.layers)


def test_left_padded_batch_matches_each_sequence_alone(make_lm, make_ids):
    model = make_lm("macchiato", memory_slots=2, memory_rule="key_norm")
    lengths, T, K = [20, 9], 20, 6
    seqs = [make_ids(1, n + K, seed=10 + i)[0] for i, n in enumerate(lengths)]
    x = torch.zeros(2, T + K, dtype=torch.long)
    mask = torch.zeros(2, T + K, dtype=torch.bool)
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        x[i, T - n :], mask[i, T - n :] = s, True
    with torch.no_grad():
        dec, _ = decode_logits(model, x, [7, T], mask)
        for i, (n, s) in enumerate(zip(lengths, seqs)):
            torch.testing.assert_close(dec[i, T - n :], model(s[None]).logits[0], atol=ATOL, rtol=0)


def test_config_fields_are_validated_and_carried_by_the_run_config():
    with pytest.raises(ConfigError, match=r"memory_slots: got -1 \(int\), expected an integer in \[0, 4096\]"):
        LatteConfig.tiny(mixer="macchiato", memory_slots=-1)
    with pytest.raises(ConfigError, match="memory_slots: got 4097"):
        LatteConfig.tiny(mixer="macchiato", memory_slots=4097)
    with pytest.raises(ConfigError, match="memory_rule: got 'best'"):
        LatteConfig.tiny(mixer="macchiato", memory_rule="best")
    with pytest.raises(ConfigError, match="memory_slots: got 2 .*without a 'macchiato' layer"):
        LatteConfig.tiny(mixer="latte", memory_slots=2)
    assert LatteConfig().memory_slots == 0 == ModelConfig().memory_slots  # existing configs unchanged
    assert ModelConfig(mixer="macchiato", memory_slots=4).to_latte_config(300).memory_slots == 4


def test_saved_model_takes_the_slots_without_retraining(tmp_path, make_lm, make_ids):
    from latte.models import from_pretrained

    model = make_lm("macchiato", memory_slots=4, memory_rule="attention")
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (saved["memory_slots"], saved["memory_rule"]) == (4, "attention")
    x = make_ids(1, 30)
    with torch.no_grad():
        assert torch.equal(from_pretrained(tmp_path / "m").eval()(x).logits, model(x).logits)
        saved["memory_slots"] = 0  # the same weights without slots: the model before the fields
        (tmp_path / "m" / "config.json").write_text(json.dumps(saved))
        plain = make_lm("macchiato")
        assert torch.equal(from_pretrained(tmp_path / "m").eval()(x).logits, plain(x).logits)


def test_hugging_face_config_round_trips_the_slots(tmp_path, make_lm):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from latte.models import hf

    hf.register()
    model = make_lm("macchiato", memory_slots=2, memory_rule="random")
    model.save_pretrained(tmp_path / "native")
    hfm = AutoModelForCausalLM.from_pretrained(tmp_path / "native")
    assert (hfm.config.memory_slots, hfm.config.memory_rule) == (2, "random")
    assert hfm.config.to_latte_config() == model.config


def test_layer_slots_at_fixed_positions_decode_like_the_full_forward():
    """memory_positions "cache" on the native layer: slot i read at position
    num_sinks + i, the query at num_sinks + M + window_size - 1."""
    from latte.layers import MacchiatoAttention

    torch.manual_seed(0)
    layer = MacchiatoAttention(16, 2, 4, window_size=4, num_sinks=1, num_kv_heads=1, chunk_size=4).eval()
    layer.use_memory(3, "key_norm")
    x = torch.randn(2, 24, 16)
    with torch.no_grad():
        absolute, _ = layer(x)
        layer.memory_positions = "cache"
        full, _ = layer(x)
        y, state = layer(x[:, :9])
        ys = [y]
        for t in range(9, 24):
            y, state = layer(x[:, t : t + 1], state=state)
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), full, atol=1e-5, rtol=0)
    assert (full - absolute).abs().max() > 1e-3
    assert torch.equal(full[:, :5], absolute[:, :5])  # nothing has left the window yet


def test_model_slots_at_fixed_positions_decode_like_the_full_forward(make_lm, make_ids):
    model = make_lm("macchiato", num_sinks=1, memory_slots=3, memory_rule="key_norm", memory_positions="cache")
    assert all(b.mixer.memory_positions == "cache" for b in model.model.blocks)
    x = make_ids(2, 40)
    with torch.no_grad():
        full = model(x).logits
        dec, _ = decode_logits(model, x, [13])
        absolute = make_lm("macchiato", num_sinks=1, memory_slots=3, memory_rule="key_norm")(x).logits
    torch.testing.assert_close(dec, full, atol=ATOL, rtol=0)
    assert (full - absolute).abs().max() > 1e-3
