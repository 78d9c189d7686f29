"""LatteConfig: validation reports every problem at once, dict/JSON round
trips, presets."""

import json

import pytest

from latte.config_io import ConfigError
from latte.models import LatteConfig


def lines(excinfo):
    return [line.strip() for line in str(excinfo.value).splitlines()[1:]]


def test_every_problem_reported_at_once_naming_field_value_allowed():
    with pytest.raises(ValueError) as e:
        LatteConfig(
            dim=30,
            num_heads=4,
            latents_per_head=0,
            mixer=["latte", "bogus"],
            num_layers=3,
            dropout=1.5,
            mlp="relu",
            tie_embeddings=1,
            num_kv_heads=3,
        )
    got = lines(e)
    assert isinstance(e.value, ConfigError)
    expected = {
        "dim": "got 30 (int), expected a multiple of num_heads (4)",
        "latents_per_head": "got 0 (int), expected an integer >= 1",
        "num_kv_heads": "a divisor of num_heads (4)",
        "mixer[1]": "got 'bogus' (str), expected one of 'latte', 'macchiato', 'softmax', 'linear', 'swa'",
        "dropout": "got 1.5 (float), expected in [0, 1)",
        "mlp": "got 'relu' (str), expected one of 'swiglu', 'gelu'",
        "tie_embeddings": "got 1 (int), expected true or false",
        "mixer": "a list of num_layers (3) names",
    }
    for field, text in expected.items():
        assert any(line.startswith(f"{field}:") and text in line for line in got), (field, got)
    assert len(got) == len(expected)


@pytest.mark.parametrize(
    "kwargs, field, text",
    [
        (dict(num_layers=0), "num_layers", "an integer >= 1"),
        (dict(vocab_size=2.5), "vocab_size", "an integer >= 1"),
        (dict(mixer=["latte", "swa", "latte"], num_layers=2), "mixer", "list of num_layers (2)"),
        (dict(mixer="swa", causal=False), "mixer", "no bidirectional form of 'swa'"),
        (dict(mixer="latte", causal=False, qk_mixer="rglru"), "qk_mixer", "causal only"),
        (dict(mixer="linear", causal=False, linear_qk_mixer="conv_rglru"), "linear_qk_mixer", "causal only"),
        (dict(linear_qk_mixer="lstm"), "linear_qk_mixer", "'none', 'conv', 'rglru', 'conv_rglru'"),
        (dict(position_embedding="rotary"), "position_embedding", "'none', 'learned', 'sinusoidal'"),
        (dict(pooling="max"), "pooling", "'mean', 'cls'"),
        (dict(norm_eps=0), "norm_eps", "> 0"),
        (dict(ffn_dim=0), "ffn_dim", "None or an integer >= 1"),
        (dict(mix="sum"), "mix", "'joint', 'gate'"),
    ],
)
def test_single_problem_messages(kwargs, field, text):
    with pytest.raises(ValueError) as e:
        LatteConfig(**kwargs)
    assert len(lines(e)) == 1 and lines(e)[0].startswith(f"{field}:") and text in lines(e)[0], lines(e)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        (dict(window_size=10**12), "got 1000000000000 (int), expected an integer in [1, 16777216] (2^24)"),
        (dict(window_size=2**24 + 1), "expected an integer in [1, 16777216] (2^24)"),
        (
            dict(mixer="swa", position_embedding="learned", max_position_embeddings=64, window_size=65),
            "expected <= max_position_embeddings (64) with learned positions",
        ),
    ],
)
def test_a_window_beyond_any_sequence_is_refused(kwargs, text):
    """Issue 59: LatteConfig(window_size=10**12) was accepted (window-sized buffers followed)."""
    with pytest.raises(ValueError) as e:
        LatteConfig(**kwargs)
    assert len(lines(e)) == 1 and lines(e)[0].startswith("window_size:") and text in lines(e)[0], lines(e)


def test_the_largest_windows_allowed_are_accepted():
    assert LatteConfig(window_size=2**24).window_size == 2**24
    learned = dict(position_embedding="learned", max_position_embeddings=64)
    assert LatteConfig(mixer="swa", window_size=64, **learned).window_size == 64
    assert LatteConfig(mixer="latte", window_size=128, **learned).window_size == 128  # no window in use


def test_the_trainer_and_conversion_configs_refuse_it_too(tmp_path, capsys):
    from latte.train.config import ModelConfig

    with pytest.raises(
        ValueError, match=r"window_size: got 100000000000 \(int\), expected an integer in \[1, 16777216\]"
    ):
        ModelConfig(window_size=10**11)
    convert_config = pytest.importorskip("latte.convert.config")
    with pytest.raises(
        ValueError, match=r"window_size: got 100000000000 \(int\), expected an integer in \[1, 16777216\]"
    ):
        convert_config.ConversionConfig(window_size=10**11)
    from latte.cli import main

    run = tmp_path / "run"  # the command of the report: exit 2 at config time, nothing written
    assert main(["convert", "--conversion.window_size=100000000000", "--train.run_dir", str(run)]) == 2
    assert "conversion.window_size: got 100000000000" in capsys.readouterr().err and not run.exists()


def test_saved_num_latents_maps_exactly_to_latents_per_head_with_a_warning(tmp_path):
    """Configs saved before latents_per_head was the one name hold num_latents,
    the total over heads: from_dict, JSON and YAML map it to total / num_heads."""
    saved = LatteConfig(mixer="macchiato", num_heads=4, latents_per_head=16).to_dict()
    old = {k: v for k, v in saved.items() if k != "latents_per_head"} | {"num_latents": 64}
    with pytest.warns(FutureWarning, match="num_latents=64 over num_heads=4 is latents_per_head=16"):
        assert LatteConfig.from_dict(old) == LatteConfig.from_dict(saved)
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.warns(FutureWarning):
        assert LatteConfig.load_json(tmp_path / "config.json").latents_per_head == 16
    with pytest.raises(ValueError, match=r"num_latents: got 66 \(int\), expected a multiple of num_heads \(4\)"):
        LatteConfig.from_dict({**old, "num_latents": 66})  # never built: refused, not rounded
    with pytest.raises(ValueError, match="num_latents: got 64 beside latents_per_head; give latents_per_head alone"):
        LatteConfig.from_dict({**saved, "num_latents": 64})
    unused = {"mixer": "softmax", "num_heads": 6, "dim": 48, "num_latents": 256}  # softmax has no latents
    assert LatteConfig.from_dict(unused).latents_per_head == LatteConfig.latents_per_head


def test_from_dict_reports_unknown_keys_types_and_ranges_together():
    with pytest.raises(ValueError) as e:
        LatteConfig.from_dict({"dimm": 32, "num_heads": "two", "mixer": "latte", "dropout": 2}, where="cfg.json")
    msg = str(e.value)
    assert msg.startswith("cfg.json: 3 config problems")
    assert "dimm: unknown key (did you mean 'dim'?)" in msg
    assert "num_heads: got 'two' (str), expected an integer >= 1" in msg
    assert "dropout: got 2.0 (float), expected in [0, 1)" in msg


def test_dict_and_json_round_trip(tmp_path):
    cfg = LatteConfig.tiny(mixer=["latte", "swa"], rope_theta=500, ffn_dim=40)
    assert cfg.rope_theta == 500.0 and isinstance(cfg.rope_theta, float)
    assert LatteConfig.from_dict(cfg.to_dict()) == cfg
    cfg.save_json(tmp_path / "c.json")
    assert LatteConfig.load_json(tmp_path / "c.json") == cfg
    (tmp_path / "bad.json").write_text('{"dim": 32,}')
    with pytest.raises(ValueError, match="bad.json: invalid JSON"):
        LatteConfig.load_json(tmp_path / "bad.json")
    (tmp_path / "unk.json").write_text(json.dumps({**cfg.to_dict(), "heads": 2}))
    with pytest.raises(ValueError, match=r"unk.json: 1 config problem:\n  heads: unknown key"):
        LatteConfig.load_json(tmp_path / "unk.json")


def test_derived_values():
    assert LatteConfig(mixer="latte", causal=True).qk_mixer == "conv_rglru"
    assert LatteConfig(mixer="latte", causal=False).qk_mixer == "none"
    assert LatteConfig.tiny(mixer=["latte", "swa"]).mixers == ["latte", "swa"]
    assert LatteConfig.tiny(mixer="swa").mixers == ["swa", "swa"]
    assert LatteConfig(dim=512, mlp="gelu").ffn_hidden == 2048
    assert LatteConfig(dim=512, mlp="swiglu").ffn_hidden == 1368  # 2/3 * 2048 rounded up to 8
    assert LatteConfig(ffn_dim=100).ffn_hidden == 100


def test_paper_table6_preset():
    cfg = LatteConfig.paper_table6(mixer="macchiato")
    assert (cfg.num_layers, cfg.num_heads, cfg.dim, cfg.ffn_hidden, cfg.mlp) == (8, 8, 512, 2048, "gelu")
    assert (cfg.latents_per_head, cfg.window_size, cfg.conv_size, cfg.qk_mixer) == (32, 128, 3, "conv")
    assert (cfg.dropout, cfg.position_embedding, cfg.vocab_size) == (0.1, "learned", 50257)
    assert LatteConfig.paper_table6(dropout=0.0).dropout == 0.0


@pytest.mark.parametrize("mixer", ["softmax", "latte"])
def test_mlp_none_builds_attention_only_blocks(mixer):
    """mlp "none" (the Zoology MQAR blocks): no MLP, no second norm; the
    mixer weights are those of the same model with an MLP, and the output is
    x + mixer(norm(x)) per block, checked against a hand-written forward."""
    import torch

    from latte.models import LatteForCausalLM

    torch.manual_seed(0)
    plain = LatteForCausalLM(LatteConfig.tiny(mixer=mixer, mlp="none")).eval()
    torch.manual_seed(0)
    full = LatteForCausalLM(LatteConfig.tiny(mixer=mixer)).eval()
    assert all(b.mlp is None and b.mlp_norm is None for b in plain.model.blocks)
    mlp_params = sum(p.numel() for b in full.model.blocks for m in (b.mlp, b.mlp_norm) for p in m.parameters())
    assert plain.num_parameters() == full.num_parameters() - mlp_params
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = plain.model.embed(ids)
        for b in plain.model.blocks:
            x = x + b.mixer(b.mixer_norm(x))[0]
        expected = plain.lm_head(plain.model.norm(x))
        assert torch.allclose(plain(ids).logits, expected, atol=1e-5)
        # decoding with a cache continues the same function
        out = plain(ids[:, :7], use_cache=True)
        step = plain(ids[:, 7:], state=out.state)
        assert torch.allclose(torch.cat([out.logits, step.logits], 1), plain(ids).logits, atol=1e-4)


def test_linear_qk_mixer_defaults_to_the_original_baseline_and_builds_the_conv():
    """The linear baseline has no qk mixer unless asked (old configs keep
    their meaning); "conv" gives its q/k the conv of Latte's "conv" variant."""
    import torch

    from latte.models import LatteForCausalLM

    assert LatteConfig(mixer="linear").linear_qk_mixer == "none"
    torch.manual_seed(0)
    plain = LatteForCausalLM(LatteConfig.tiny("linear"))
    torch.manual_seed(0)
    conv = LatteForCausalLM(LatteConfig.tiny("linear", linear_qk_mixer="conv"))
    extra = set(dict(conv.named_parameters())) - set(dict(plain.named_parameters()))
    assert extra and all(".mixer.conv." in name for name in extra)
    ids = torch.randint(0, 64, (2, 12))
    assert not torch.allclose(plain(ids).logits, conv(ids).logits)


def test_backend_is_saved_with_the_model_and_reaches_the_layers(tmp_path, monkeypatch):
    """config.backend: "auto" (saved so unless set) leaves the choice to the
    process (layers get None); "torch" fixes it; a saved "fla" where CUDA or
    fla-core is missing is refused when the model is built, naming the override."""
    from latte.layers import LatteAttention, MacchiatoAttention
    from latte.models import LatteForCausalLM

    assert LatteConfig().to_dict()["backend"] == "auto"
    old = {k: v for k, v in LatteConfig.tiny().to_dict().items() if k != "backend"}  # saved before the field
    assert LatteConfig.from_dict(old).backend == "auto"
    with pytest.raises(ValueError, match="backend: got 'cuda'"):
        LatteConfig(backend="cuda")
    for backend, given in (("auto", None), ("torch", "torch")):
        model = LatteForCausalLM(LatteConfig.tiny(["latte", "macchiato"], backend=backend))
        layers = [m for m in model.modules() if isinstance(m, (LatteAttention, MacchiatoAttention))]
        assert len(layers) == 2 and all(m.backend == given for m in layers)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "backend": "fla"}))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # the same on a GPU machine
    with pytest.raises(ValueError, match=r"model.backend: got 'fla'.*no CUDA.*--set model.backend=auto"):
        LatteForCausalLM.from_pretrained(tmp_path)
