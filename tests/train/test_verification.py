"""Stricter verification (issue 10, items 5-7): a manifest must list every
file that loading reads; generate and eval read (and check) only what they
need; non-finite weights are refused on load with a message naming them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from latte.cli import main
from latte.files import sha256_file
from latte.models.weights import read_weights, save_weights
from latte.train.checkpoint import CheckpointError, load_checkpoint, verify_checkpoint
from latte.train.loop import train
from latte.train.runs import open_run


@pytest.fixture
def run(make_config, tmp_path):
    """A 2-step run with checkpoints at steps 1 and 2."""
    train(make_config(**{"train.steps": 2, "train.save_every": 1, "optim.warmup_steps": 1, "train.sample_tokens": 0}))
    return tmp_path / "run"


def rewrite_manifest(step_dir, edit) -> None:
    manifest = json.loads((step_dir / "manifest.json").read_text())
    edit(manifest["files"])
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def rehash(step_dir, name) -> None:
    """What a tamperer who controls the folder does: make the manifest agree."""
    rewrite_manifest(
        step_dir,
        lambda files: files.__setitem__(
            name, {"size": (step_dir / name).stat().st_size, "sha256": sha256_file(step_dir / name)}
        ),
    )


# --------------------------------------------------------------------------- item 5


@pytest.mark.parametrize(
    "omit", ["model.safetensors", "optimizer.pt", "trainer_state.json", "config.yaml", "rng-rank0.pt", "ALL"]
)
def test_manifest_must_list_every_file_loading_reads(run, omit):
    step = run / "step-00000002"
    rewrite_manifest(step, lambda files: files.clear() if omit == "ALL" else files.pop(omit))
    listed = "model.safetensors" if omit == "ALL" else omit
    with pytest.raises(CheckpointError, match=rf"does not list .*{listed}.*which loading reads"):
        verify_checkpoint(step)
    with pytest.raises(CheckpointError, match="does not list"):
        open_run(step)


def test_a_file_the_manifest_omits_is_never_read(run):
    step = run / "step-00000002"
    (step / "tokenizer.json").write_text('{"not": "a tokenizer"}')  # tampered ...
    rewrite_manifest(step, lambda files: files.pop("tokenizer.json"))  # ... and dropped from the manifest
    verify_checkpoint(step)  # the required files are all fine
    with pytest.raises(ValueError, match="holds no tokenizer file listed in its manifest"):
        open_run(step)
    with pytest.raises(CheckpointError, match="tokenizer.json is not listed in manifest.json"):
        load_checkpoint(step).file("tokenizer.json")


# --------------------------------------------------------------------------- item 6


def test_generate_and_eval_do_not_need_the_optimizer(run, capsys):
    step = run / "step-00000002"
    (step / "optimizer.pt").write_bytes(b"garbage, not a torch file")
    rehash(step, "optimizer.pt")  # the manifest agrees: only loading it would fail
    assert main(["generate", "--run", str(run), "--max-new-tokens", "4", "--prompt", "a"]) == 0
    assert "step-00000002, step 2" in capsys.readouterr().err  # the newest step, not an older one
    assert main(["eval", "--run", str(step), "--lengths", "1", "--max-tokens", "256"]) == 0
    capsys.readouterr()
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: cannot be read"):
        _ = load_checkpoint(step).optimizer_state  # resuming training does need it, and says why
    # a truncated optimizer (the manifest disagrees) does not stop inference either,
    # while resuming skips that step and takes the one before
    (step / "optimizer.pt").write_bytes(b"x")
    assert main(["generate", "--run", str(step), "--max-new-tokens", "2"]) == 0
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: 1 bytes but the manifest says"):
        verify_checkpoint(step)


def test_damaged_weights_fall_back_to_the_previous_step_for_a_run_folder(run, capsys):
    weights = run / "step-00000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    assert main(["generate", "--run", str(run), "--max-new-tokens", "2"]) == 0
    assert "step-00000001, step 1" in capsys.readouterr().err
    assert main(["generate", "--run", str(run / "step-00000002"), "--max-new-tokens", "2"]) == 2
    assert "model.safetensors" in capsys.readouterr().err


# --------------------------------------------------------------------------- item 7


def poison(step_dir) -> None:
    state = read_weights(step_dir / "model.safetensors")
    name = sorted(k for k in state if "norm" in k)[0]  # not a tied tensor: exactly one is poisoned
    state[name].view(-1)[:3] = float("nan")
    save_weights(state, step_dir / "model.safetensors")
    rehash(step_dir, "model.safetensors")


def test_nan_weights_are_refused_by_generate_eval_and_resume(run, make_config, capsys):
    step = run / "step-00000002"
    poison(step)
    assert main(["generate", "--run", str(step), "--prompt", "x", "--max-new-tokens", "4"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "non-finite weights in 1 tensor" in out.err and "3 NaN" in out.err
    assert main(["eval", "--run", str(step), "--lengths", "1"]) == 2
    assert "non-finite weights" in capsys.readouterr().err
    with pytest.raises(ValueError, match="non-finite weights in 1 tensor"):
        train(make_config(**{"train.steps": 3, "train.resume": str(step)}))


def test_sample_from_non_finite_weights_is_a_message_not_a_crash(run):
    trained = open_run(run)
    trained.config.train.sample_tokens = 4
    with torch.no_grad():
        next(trained.model.parameters()).fill_(math.inf)
    text = trained.task.sample(trained.model)
    assert "no sample: the weights hold NaN or inf values" in text


# --------------------------------------------------------------------------- issue 23, item 15


def test_a_step_folder_whose_manifest_names_another_step_is_refused(run, capsys):
    import shutil

    copy = run / "step-00000003"  # step 2's files under step 3's name: training refuses it
    shutil.copytree(run / "step-00000002", copy)
    for argv in (["generate", "--max-new-tokens", "2"], ["eval", "--lengths", "1", "--max-tokens", "64"]):
        assert main([*argv, "--run", str(copy)]) == 2
        out = capsys.readouterr()
        assert "manifest.json: says step 2 but the folder is step-00000003" in out.err and out.out == ""
    assert main(["generate", "--run", str(run), "--max-new-tokens", "2"]) == 0  # a run folder skips it
    assert "step-00000002, step 2" in capsys.readouterr().err


def test_a_trainer_state_that_fails_its_hash_is_refused(run, capsys):
    step = run / "step-00000002"
    (step / "trainer_state.json").write_text('{"step": 7}')
    for argv in (["generate", "--max-new-tokens", "2"], ["eval", "--lengths", "1", "--max-tokens", "64"]):
        assert main([*argv, "--run", str(step)]) == 2
        assert "trainer_state.json" in capsys.readouterr().err
    assert main(["generate", "--run", str(run), "--max-new-tokens", "2"]) == 0
    assert "step-00000001, step 1" in capsys.readouterr().err


def test_generate_refuses_up_front_what_learned_positions_cannot_hold(make_config, tmp_path, capsys):
    overrides = {"model.position_embedding": "learned", "model.max_position_embeddings": 32, "model.mixer": "softmax"}
    train(make_config(**overrides, **{"train.steps": 1, "optim.warmup_steps": 0, "train.sample_tokens": 0}))
    run = str(tmp_path / "run")
    assert main(["generate", "--run", run, "--prompt", "a", "--max-new-tokens", "60", "--seed", "1"]) == 2
    out = capsys.readouterr()
    assert out.out == ""  # nothing echoed or streamed before the refusal
    assert "max_new_tokens=60: a 1-token prompt leaves room for at most 32 new tokens" in out.err
    assert "max_position_embeddings=32 (position_embedding='learned')" in out.err
    assert main(["generate", "--run", run, "--prompt", "a", "--max-new-tokens", "32"]) == 0  # the edge fits
