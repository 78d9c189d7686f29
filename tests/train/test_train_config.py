"""Run configs: the shipped YAML files, overrides, and errors that name every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from latte.config_io import build, load_yaml, save_yaml, to_dict
from latte.models import LatteConfig
from latte.train.config import (
    ARCHITECTURE_FIELDS,
    DEFAULT_CONFIG,
    LMRunConfig,
    ModelConfig,
    check_world_size,
    resolve_config,
    shipped_configs,
)
from latte.train.task import load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "latte" / "configs"
MIXERS = ("latte", "macchiato", "softmax", "linear", "swa")


def test_default_job_is_tiny_yaml():
    assert DEFAULT_CONFIG == CONFIGS / "tiny.yaml"
    cfg = load_run_config()
    assert cfg.data.source == "shakespeare" and cfg.data.tokenizer == "bpe"
    assert 4096 <= cfg.data.vocab_size <= 8192
    assert cfg.model.to_latte_config(cfg.data.vocab_size).mixers  # builds a valid LatteConfig


def test_configs_by_name_or_path():
    assert resolve_config("tiny") == resolve_config("tiny.yaml") == DEFAULT_CONFIG
    assert resolve_config("mixers/latte") == CONFIGS / "mixers" / "latte.yaml"
    assert resolve_config(str(CONFIGS / "mixers" / "swa.yaml")) == CONFIGS / "mixers" / "swa.yaml"
    assert {"tiny", "mixers/latte", "paper-table6"} <= set(shipped_configs())
    with pytest.raises(ValueError, match="shipped: .*mixers/latte"):
        resolve_config("no-such-config")


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_builds(path):
    cfg = load_run_config(path)
    if cfg.task == "lm":  # other tasks check their model section when it is built
        cfg.model.to_latte_config(cfg.model.vocab_size or cfg.data.vocab_size)


def test_mixer_configs_are_like_for_like():
    """One recipe, one difference: the mixer (and the run folder; no time
    budget, so that a slower mixer is not stopped earlier)."""
    tiny = to_dict(load_run_config())
    variants = {m: (m, "conv_rglru") for m in MIXERS}  # None resolves to the causal default
    variants |= {"latte-none": ("latte", "none"), "latte-conv": ("latte", "conv")}
    assert {p.stem for p in (CONFIGS / "mixers").glob("*.yaml")} == set(variants)
    for name, (mixer, qk_mixer) in variants.items():
        cfg = to_dict(load_run_config(CONFIGS / "mixers" / f"{name}.yaml"))
        assert (cfg["model"]["mixer"], cfg["model"]["qk_mixer"]) == (mixer, qk_mixer)
        assert cfg["train"]["run_dir"] == f"runs/mixers/{name}"
        for section in ("data", "optim"):
            assert cfg[section] == tiny[section], section
        strip = lambda d, keys: {k: v for k, v in d.items() if k not in keys}  # noqa: E731
        assert strip(cfg["model"], {"mixer", "qk_mixer"}) == strip(tiny["model"], {"mixer", "qk_mixer"})
        assert cfg["train"]["time_budget_minutes"] is None
        assert strip(cfg["train"], {"run_dir", "time_budget_minutes"}) == strip(
            tiny["train"], {"run_dir", "time_budget_minutes"}
        )


def test_mixer_configs_are_overrides_of_the_default_job():
    """Each mixers/NAME.yaml extends tiny and states only what it
    changes: the mixer (and qk mixer), the run folder and the time budget."""
    for path in sorted((CONFIGS / "mixers").glob("*.yaml")):
        data = load_yaml(path)
        assert data.pop("extends") == "tiny", path.name
        assert set(data) == {"model", "train"} and set(data["model"]) <= {"mixer", "qk_mixer"}, path.name
        assert set(data["train"]) == {"run_dir", "time_budget_minutes"}, path.name


def test_a_config_extends_another(tmp_path):
    """`extends:` names a shipped config or a file beside; the file's fields win,
    mappings merge key by key; a bad or circular base is refused naming the file."""
    (tmp_path / "a.yaml").write_text("extends: tiny\ntrain:\n  steps: 70\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nmodel:\n  mixer: softmax\n")
    cfg = load_run_config(tmp_path / "b.yaml")
    tiny = load_run_config()
    assert (cfg.train.steps, cfg.model.mixer, cfg.model.dim) == (70, "softmax", tiny.model.dim)
    assert cfg.data == tiny.data and cfg.train.run_dir == tiny.train.run_dir
    (tmp_path / "c.yaml").write_text("extends: d.yaml\n")
    (tmp_path / "d.yaml").write_text("extends: c.yaml\n")
    with pytest.raises(ValueError, match=r"d\.yaml: extends: c\.yaml comes back to a config it extends"):
        load_run_config(tmp_path / "c.yaml")
    (tmp_path / "e.yaml").write_text("extends: 3\n")
    with pytest.raises(ValueError, match=r"e\.yaml: extends: got 3, expected a shipped config name"):
        load_run_config(tmp_path / "e.yaml")
    (tmp_path / "f.yaml").write_text("extends: no-such-config\n")
    with pytest.raises(ValueError, match="--config no-such-config: no such file"):
        load_run_config(tmp_path / "f.yaml")


def test_paper_table6_config_matches_the_paper():
    """docs/math.md section 6: the OpenWebText recipe of the paper."""
    cfg = load_run_config(CONFIGS / "paper-table6.yaml")
    m, o, t, d = cfg.model, cfg.optim, cfg.train, cfg.data
    assert (m.num_layers, m.num_heads, m.dim, m.ffn_dim, m.window_size) == (8, 8, 512, 2048, 128)
    assert m.latents_per_head == 32  # the paper's 256 over the 8 heads
    assert (m.conv_size, m.dropout) == (3, 0.1)
    assert (d.seq_len, t.global_batch_size, t.steps) == (512, 64, 200_000)
    assert (o.lr, o.warmup_steps, o.weight_decay, o.decay) == (5e-4, 4000, 0.01, "linear")
    assert d.source == "hf:openwebtext" and d.tokenizer.endswith("gpt2.tiktoken")
    paper = LatteConfig.paper_table6(mixer=m.mixer)
    ours = m.to_latte_config(50257)
    assert ours == paper


def test_model_section_is_latte_config():
    assert issubclass(ModelConfig, LatteConfig)  # no mirror to keep in step
    assert "dropout" not in ARCHITECTURE_FIELDS and "dim" in ARCHITECTURE_FIELDS
    # speed and initialisation knobs may change on resume; shapes and meaning may not
    assert not {"chunk_size", "initializer_range"} & set(ARCHITECTURE_FIELDS)
    assert {"latents_per_head", "window_size", "mixer", "qk_mixer", "rope_theta"} <= set(ARCHITECTURE_FIELDS)
    assert ModelConfig().vocab_size is None  # the tokenizer's
    assert ModelConfig().to_latte_config(300) == LatteConfig(vocab_size=300)
    with pytest.raises(ValueError, match=r"model.causal: got False, expected True"):
        load_run_config(None, ["--model.causal=false"])


def test_old_num_latents_override_and_saved_run_config_still_work(tmp_path):
    """--model.num_latents (the total over heads) keeps working for one
    release: mapped exactly to latents_per_head, with a FutureWarning."""
    with pytest.warns(FutureWarning, match="latents_per_head=8"):
        cfg = load_run_config(None, ["--model.num_heads=4", "--model.num_latents=32"])
    assert (
        cfg.model.latents_per_head == 8
        and cfg.model == load_run_config(None, ["--model.num_heads=4", "--model.latents_per_head=8"]).model
    )
    saved = to_dict(load_run_config(None, []))
    saved["model"]["num_latents"] = saved["model"].pop("latents_per_head") * saved["model"]["num_heads"]
    save_yaml(saved, tmp_path / "config.yaml")
    with pytest.warns(FutureWarning):
        assert load_run_config(tmp_path / "config.yaml", []) == load_run_config(None, [])
    with pytest.raises(ValueError, match=r"model.num_latents: got 30 \(int\), expected a multiple of num_heads \(4\)"):
        load_run_config(None, ["--model.num_heads=4", "--model.num_latents=30"])


def test_non_finite_numbers_are_refused_in_any_section():
    with pytest.raises(ValueError) as e:
        load_run_config(None, ["--optim.lr=.inf", "--model.dropout=.nan", "--train.time_budget_minutes=.inf"])
    msg = str(e.value)
    assert "3 config problems" in msg and "optim.lr: got inf (float), expected a finite number" in msg
    assert "model.dropout: got nan" in msg and "train.time_budget_minutes: got inf" in msg


def test_overrides_are_typed_and_applied():
    cfg = load_run_config(
        None, ["--train.steps=70", "--optim.lr", "3e-4", "model.mixer=softmax", "--optim.betas=[0.8, 0.9]"]
    )
    assert cfg.train.steps == 70 and cfg.optim.lr == 3e-4 and cfg.model.mixer == "softmax"
    assert cfg.optim.betas == (0.8, 0.9)


def test_bad_config_lists_every_problem_with_field_names():
    with pytest.raises(ValueError) as e:
        load_run_config(
            None,
            [
                "--train.stepz=5",
                "--optim.lr=-1",
                "--model.num_heads=5",
                "--train.precision=fp16",
                "--data.seq_len=zero",
            ],
        )
    msg = str(e.value)
    assert "5 config problems" in msg
    assert "train.stepz: unknown key (did you mean 'steps'?)" in msg
    assert "optim.lr: got -1" in msg and "> 0" in msg
    assert "train.precision: got 'fp16'" in msg and "'bf16'" in msg
    assert "data.seq_len: got 'zero'" in msg and "model.dim: got 192" in msg


def test_model_range_problems_are_named_under_model():
    with pytest.raises(ValueError) as e:
        load_run_config(None, ["--model.num_heads=5"])
    assert "model.dim: got 192" in str(e.value) and "multiple of num_heads (5)" in str(e.value)


def test_cross_section_checks():
    with pytest.raises(ValueError, match=r"optim.warmup_steps: got 500 .*<= train.steps \(100\)"):
        load_run_config(None, ["--train.steps=100", "--optim.warmup_steps=500"])
    with pytest.raises(ValueError, match="multiple of optim.grad_accum"):
        load_run_config(None, ["--optim.grad_accum=3"])
    cfg = load_run_config(None, ["--train.global_batch_size=6"])
    with pytest.raises(ValueError, match=r"multiple of world_size \(4\)"):
        check_world_size(cfg, 4)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="nope.yaml: no such file"):
        load_run_config(tmp_path / "nope.yaml")


def test_resolved_config_round_trips(tmp_path):
    from latte.config_io import save_yaml

    cfg = load_run_config()
    save_yaml(cfg, tmp_path / "c.yaml")
    assert build(LMRunConfig, load_yaml(tmp_path / "c.yaml")) == cfg
