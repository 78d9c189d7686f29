"""Conversion up-training as a trainer task (`task: convert`, `latte
convert`): a tiny random Llama stands in for the pretrained model; the run
trains only the new parameters, checkpoints only them, resumes bitwise (also
after kill -9) and exports a converted model that loads back."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
import torch

from latte.convert.task import ConvertRunConfig
from latte.data import train_bpe
from latte.train.checkpoint import find_latest_checkpoint, load_checkpoint
from latte.train.loop import train
from latte.train.task import build_run_config
from tests.helpers import tiny_llama
from tests.train.runs import losses, run_cli, write_config, write_corpus


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(base model folder, tokenizer.json) of a tiny random Llama."""

    root = tmp_path_factory.mktemp("convert-base")
    (root / "corpus").mkdir()
    corpus = write_corpus(root / "corpus")
    texts = [p.read_text() for p in sorted(corpus.glob("*.txt"))]
    tok_path = train_bpe(texts, vocab_size=320).save(root / "tok")
    tiny_llama(320).save_pretrained(root / "base")
    return root / "base", tok_path, corpus


def config(base, run_dir, objective="end_to_end", lora_rank=0, **train_fields) -> ConvertRunConfig:
    folder, tok, corpus = base
    data = {
        "task": "convert",
        "base": {"path": str(folder)},
        "data": {
            "source": str(corpus),
            "val_fraction": 0.2,
            "tokenizer": str(tok),
            "seq_len": 32,
            "cache_dir": str(run_dir.parent / "cache"),
        },
        "conversion": {"window_size": 8, "latents_per_head": 4, "chunk_size": 8, "lora_rank": lora_rank},
        "distill": {"objective": objective},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "weight_decay": 0.0},
        "train": {
            "steps": 6,
            "global_batch_size": 2,
            "eval_every": 3,
            "eval_batches": 2,
            "save_every": 3,
            "log_every": 1,
            "sample_tokens": 5,
            "run_dir": str(run_dir),
            "tensorboard": False,
            "num_threads": 1,
            **train_fields,
        },
    }
    cfg = build_run_config(data, where="test")
    assert isinstance(cfg, ConvertRunConfig)
    return cfg


def test_up_training_trains_only_the_new_parameters_and_exports(base, tmp_path):
    from latte.convert import load_converted

    summary = train(config(base, tmp_path / "run"))
    run = tmp_path / "run"
    ckpt = load_checkpoint(find_latest_checkpoint(run))
    assert ckpt.step == 6 and ckpt.config["task"] == "convert"
    names = set(ckpt.model_state)
    assert names and all(
        ".self_attn." in n and n.split(".self_attn.")[1].split(".")[0] in {"mixer", "a_proj", "b_proj", "beta"}
        for n in names
    )
    exported = load_converted(summary["export"])
    state = {k.removeprefix("model."): v for k, v in ckpt.model_state.items()}
    for name, p in exported.new_parameters().items():
        assert torch.equal(p, state[name])
    # the base is untouched: the exported model's pretrained weights equal the base folder's
    import transformers as tf

    original = tf.AutoModelForCausalLM.from_pretrained(base[0])
    assert torch.equal(
        exported.base.model.layers[1].self_attn.q_proj.weight, original.model.layers[1].self_attn.q_proj.weight
    )
    assert (run / "model" / "tokenizer.json").is_file()
    assert json.loads((run / "summary.json").read_text())["val_ppl"] == summary["val_ppl"]


@pytest.mark.parametrize("objective,lora_rank", [("end_to_end", 0), ("layerwise", 0), ("end_to_end", 2)])
def test_up_training_resumes_bitwise(base, tmp_path, objective, lora_rank):
    """LoRA (the shipped SmolLM2 recipe) included: its adapters are in the checkpoint."""
    train(config(base, tmp_path / "straight", objective, lora_rank))
    train(config(base, tmp_path / "cut", objective, lora_rank, time_budget_minutes=1e-9))  # stops after step 1
    assert [s for s, _ in losses(tmp_path / "cut")] == [1]
    train(config(base, tmp_path / "cut", objective, lora_rank))
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")


@pytest.mark.slow
def test_latte_convert_survives_kill_9(base, tmp_path):
    train(config(base, tmp_path / "straight"))
    path = write_config(config(base, tmp_path / "killed"), tmp_path / "convert.yaml")
    proc = run_cli(["convert", "--config", str(path)], faults="kill_after_save=3")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    proc = run_cli(["convert", "--config", str(path)])
    assert proc.returncode == 0, proc.stderr
    assert losses(tmp_path / "killed") == losses(tmp_path / "straight")


def test_conversion_sections_are_validated(base, tmp_path):
    from latte.config_io import ConfigError

    with pytest.raises(ConfigError) as e:
        build_run_config(
            {
                "task": "convert",
                "conversion": {"window_size": 0, "qk_mixer": "lstm"},
                "distill": {"objective": "kl", "start_latent_mass": 2.0},
            },
            where="x",
        )
    msg = str(e.value)
    assert "conversion.qk_mixer" in msg and "distill.objective" in msg
    with pytest.raises(ConfigError, match=r"conversion.window_size: got 0"):
        build_run_config({"task": "convert", "conversion": {"window_size": 0}}, where="x")
    with pytest.raises(ConfigError, match=r"distill.start_latent_mass: got 2.0"):
        build_run_config({"task": "convert", "distill": {"start_latent_mass": 2.0}}, where="x")


def test_resuming_on_other_base_weights_of_the_same_shapes_is_refused(base, tmp_path):
    import transformers as tf

    folder, tok, corpus = base
    copy = tmp_path / "base-copy"
    shutil.copytree(folder, copy)
    cfg = config((copy, tok, corpus), tmp_path / "run", time_budget_minutes=1e-9)  # stops after step 1
    train(cfg)
    torch.manual_seed(7)  # same architecture, other weights, same place
    tf.LlamaForCausalLM(tf.AutoConfig.from_pretrained(copy)).save_pretrained(copy)
    # the run's record of its inputs names the file first (latte/train/inputs.py) ...
    with pytest.raises(ValueError, match=r"base:model.safetensors: recorded .*base-copy/model.safetensors, .* sha256"):
        train(config((copy, tok, corpus), tmp_path / "run"))
    # ... and accepting changed inputs never accepts another base: the checkpoint's base reference refuses it
    with pytest.raises(ValueError, match=r"base.path=.* is not the base .*step-00000001 was trained on"):
        train(config((copy, tok, corpus), tmp_path / "run", accept_changed_inputs=True))


def cli(args, capsys) -> tuple[int, str]:
    """`latte ARGS` in this process (the same code path as the command): (exit code, stderr)."""
    from latte.cli import main

    capsys.readouterr()
    code = main(args)
    return code, capsys.readouterr().err


def test_a_hub_name_fails_at_once_naming_base_path_and_bpe_is_explained(base, tmp_path, capsys):
    from latte.config_io import ConfigError

    path = write_config(config(base, tmp_path / "run"), tmp_path / "convert.yaml")
    code, err = cli(["convert", "--config", str(path), "--base.path=HuggingFaceTB/SmolLM2-135M"], capsys)
    assert code == 2 and "base.path='HuggingFaceTB/SmolLM2-135M': no such local folder" in err
    code, err = cli(["convert", "--config", str(path), "--base.gguf_file=missing.gguf"], capsys)
    assert code == 2 and "base.gguf_file='missing.gguf': no such file" in err
    with pytest.raises(ConfigError, match=r"data.tokenizer: got 'bpe'.*base model's own tokenizer"):
        build_run_config({"task": "convert", "data": {"tokenizer": "bpe"}}, where="x")


def test_latte_export_of_a_conversion_is_portable(base, tmp_path, capsys):
    from latte.convert import load_converted

    folder, tok, corpus = base
    copy = tmp_path / "base-copy"
    shutil.copytree(folder, copy)
    summary = train(config((copy, tok, corpus), tmp_path / "run", sample_tokens=0))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        ref = load_converted(summary["export"])(ids, use_cache=False).logits
    code, err = cli(["export", str(tmp_path / "run"), str(tmp_path / "run" / "out")], capsys)
    assert code == 2 and "inside the folder being exported" in err
    code, err = cli(["export", str(tmp_path / "run"), str(tmp_path / "portable")], capsys)
    assert code == 0, err
    shutil.rmtree(copy)  # the base the run recorded is gone
    code, err = cli(["export", summary["export"], str(tmp_path / "again")], capsys)
    assert code == 2 and "base_path=DIR" in err  # names what to pass
    shutil.move(tmp_path / "portable", tmp_path / "moved")
    assert (tmp_path / "moved" / "tokenizer.json").is_file()
    with torch.no_grad():
        assert torch.equal(load_converted(tmp_path / "moved")(ids, use_cache=False).logits, ref)
