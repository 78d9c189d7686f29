"""save_pretrained / from_pretrained: exact round trip, tied weights stored
once, every loading problem reported at once and naming the file."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from latte.models import LatteConfig, LatteForCausalLM, LatteForSequenceClassification, from_pretrained, load_weights


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_is_exact(make_lm, make_ids, tmp_path, tie):
    model = make_lm(["macchiato", "latte"], tie_embeddings=tie, position_embedding="learned")
    with torch.no_grad():
        for p in model.parameters():  # move away from the init so a fresh model cannot pass
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "latte" and config["architectures"] == ["LatteForCausalLM"]
    stored = load_file(tmp_path / "model.safetensors")
    assert ("lm_head.weight" in stored) == (not tie) and "model.embed.weight" in stored
    for loaded in (from_pretrained(tmp_path), LatteForCausalLM.from_pretrained(tmp_path)):
        assert isinstance(loaded, LatteForCausalLM) and loaded.config == model.config
        for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
            assert k == k2 and torch.equal(a, b), k
        assert (loaded.lm_head.weight is loaded.model.embed.weight) == tie
        x = make_ids(2, 12)
        assert torch.equal(loaded.eval()(x).logits, model(x).logits)


def test_classifier_round_trip(tmp_path, make_ids):
    torch.manual_seed(0)
    model = LatteForSequenceClassification(
        LatteConfig.tiny(causal=False, num_labels=3, position_embedding="sinusoidal")
    ).eval()
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path)
    assert isinstance(loaded, LatteForSequenceClassification)
    x = make_ids(2, 7)
    assert torch.equal(loaded.eval()(x).logits, model(x).logits)


def test_every_mismatch_is_listed_in_one_error(make_lm, tmp_path):
    model = make_lm("latte")
    model.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    t = load_file(path)
    del t["model.norm.weight"], t["model.blocks.1.mlp.up.weight"]
    t["model.blocks.0.mlp.down.weight"] = torch.zeros(3, 3)
    t["extra.weight"] = torch.zeros(2)
    save_file(t, path)
    with pytest.raises(ValueError) as e:
        from_pretrained(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: 4 problems loading into LatteForCausalLM")
    for text in (
        "missing tensor model.norm.weight (32,)",
        "missing tensor model.blocks.1.mlp.up.weight",
        "unexpected tensor extra.weight (2,)",
        "shape mismatch for model.blocks.0.mlp.down.weight: file (3, 3), model (32, 48)",
    ):
        assert text in msg, msg


def test_not_safetensors_and_bad_config_name_the_file(make_lm, tmp_path):
    model = make_lm("swa")
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors header")
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file"):
        from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file"):
        load_weights(model, tmp_path / "model.safetensors")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_head": 2, "dim": 33}))
    with pytest.raises(ValueError) as e:
        from_pretrained(tmp_path)
    assert "config.json: 2 config problems" in str(e.value) and "num_head: unknown key" in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ValueError, match="config.json: model_type is 'llama'"):
        from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path / "nowhere")


def test_loading_into_a_different_config_fails(make_lm, tmp_path):
    make_lm("latte").save_pretrained(tmp_path)
    other = LatteForCausalLM(LatteConfig.tiny(mixer="latte", dim=48, num_heads=2))
    with pytest.raises(
        ValueError, match="shape mismatch for model.embed.weight: file \\(64, 32\\), model \\(64, 48\\)"
    ):
        load_weights(other, tmp_path / "model.safetensors")
