"""Issue 57's up-training: a NEW run whose weights start from an existing
conversion's (`train.init_from`, latte/train/init_from.py), with memory
slots on or off, beside a control. The new run's step-0 weights are the
checkpoint's exactly; its optimizer and schedule are fresh; the init
checkpoint's weight files are recorded inputs, so a resume after they
changed is refused; a resumed run never loads init_from again; bad paths,
other tensors and another base exit 2 naming them. The tiny random Llama
of test_convert.py stands in for SmolLM2."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from latte.data import train_bpe
from latte.files import sha256_file
from latte.train.checkpoint import load_checkpoint
from latte.train.distributed import DistEnv
from latte.train.inputs import InputsChanged, read_record
from latte.train.loop import train
from latte.train.runs import check_run_inputs, open_run
from latte.train.setup import setup
from tests.train.runs import losses, write_config
from tests.train.test_convert import base, cli, config  # noqa: F401  (base: the module's fixture)

SHORT = {"steps": 2, "save_every": 2, "eval_every": 0, "sample_tokens": 0}


@pytest.fixture(scope="module")
def source(base, tmp_path_factory):  # noqa: F811
    """A 2-step conversion (its step-00000002 and its RUN_DIR/model export)."""
    run = tmp_path_factory.mktemp("init-source") / "run"
    train(config(base, run, **SHORT))
    return run


def up_config(base, run_dir, init, slots=0, **train_fields):  # noqa: F811
    cfg = config(base, run_dir, **{**SHORT, "init_from": str(init), **train_fields})
    cfg.conversion.memory_slots = slots  # no parameters: the same tensors as without memory
    cfg.conversion.memory_positions = "cache"
    return cfg


def start_weights(cfg) -> dict[str, torch.Tensor]:
    """The trained tensors of `cfg`'s run at step 0 (setup as `latte train`
    runs it, nothing trained), by checkpoint key."""
    run = setup(cfg, DistEnv())
    run.logger.close()
    run.lock.release()
    keys = run.task.checkpoint_keys(run.weights.raw_model)
    state = run.weights.raw_model.state_dict()
    return {k: v.detach().clone() for k, v in state.items() if keys is None or k in keys}


def test_a_new_run_starts_from_the_checkpoint_exactly_with_and_without_memory(base, source, tmp_path):  # noqa: F811
    step = source / "step-00000002"
    saved = load_checkpoint(step).model_state
    fresh = start_weights(config(base, tmp_path / "fresh", **SHORT))
    assert fresh.keys() == saved.keys() and any(not torch.equal(fresh[k], saved[k]) for k in saved)
    for slots in (0, 4):
        got = start_weights(up_config(base, tmp_path / f"start-{slots}", step, slots))
        assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    # the export RUN_DIR/model starts the same weights (its sha256 checked against its config.json)
    got = start_weights(up_config(base, tmp_path / "from-export", source / "model", 4))
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    # a run folder: its newest verified step
    got = start_weights(up_config(base, tmp_path / "from-run", source, 4))
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    # the control and the memory run train 2 steps from there, fresh optimizer and schedule
    for slots in (0, 4):
        run = tmp_path / f"run-{slots}"
        summary = train(up_config(base, run, step, slots))
        assert [s for s, _ in losses(run)] == [1, 2] and summary["step"] == 2
        assert all(torch.isfinite(torch.tensor(float(loss))) for _, loss in losses(run))
        assert load_checkpoint(run / "step-00000002").trainer_state["step"] == 2
        entry = read_record(run)["inputs"]["init_from:model.safetensors"]
        assert entry["sha256"] == sha256_file(step / "model.safetensors") == entry["sha256"]
        assert entry["path"] == str((step / "model.safetensors").resolve())
    assert losses(tmp_path / "run-0") != losses(tmp_path / "run-4")  # the memory changes what is trained


def test_a_resumed_init_run_equals_an_uninterrupted_one(base, source, tmp_path):  # noqa: F811
    """A resume never loads init_from over the resumed weights: it would
    reset step 1's update and change every later loss."""
    step = source / "step-00000002"
    train(up_config(base, tmp_path / "straight", step, 4, steps=3, save_every=1))
    train(up_config(base, tmp_path / "cut", step, 4, steps=3, save_every=1, time_budget_minutes=1e-9))
    assert [s for s, _ in losses(tmp_path / "cut")] == [1]
    train(up_config(base, tmp_path / "cut", step, 4, steps=3, save_every=1))
    assert losses(tmp_path / "cut") == losses(tmp_path / "straight")


def test_resuming_after_the_init_checkpoint_changed_is_refused(base, source, tmp_path):  # noqa: F811
    init = tmp_path / "init" / "step-00000002"
    shutil.copytree(source / "step-00000002", init)
    train(up_config(base, tmp_path / "run", init, time_budget_minutes=1e-9))  # stops after step 1
    weights = load_file(init / "model.safetensors")
    save_file({k: v + 1 for k, v in weights.items()}, init / "model.safetensors")
    with pytest.raises(InputsChanged, match=r"init_from:model.safetensors: recorded .*init/step-00000002"):
        train(up_config(base, tmp_path / "run", init))
    # evaluating the run does not read the init weights: not compared there
    check_run_inputs(open_run(tmp_path / "run"))
    summary = train(up_config(base, tmp_path / "run", init, accept_changed_inputs=True))
    assert summary["step"] == 2 and read_record(tmp_path / "run")["accepted"]


def test_bad_init_from_exits_2_naming_the_field_the_path_and_the_tensor(base, source, tmp_path, capsys):  # noqa: F811
    import transformers as tf

    step = source / "step-00000002"
    path = write_config(up_config(base, tmp_path / "run", step), tmp_path / "up.yaml")
    code, err = cli(["convert", "--config", str(path), f"--train.init_from={tmp_path / 'nowhere'}"], capsys)
    assert code == 2 and f"train.init_from='{tmp_path / 'nowhere'}': no such folder (or not a folder)" in err
    code, err = cli(["convert", "--config", str(path), "--conversion.latents_per_head=2"], capsys)
    assert code == 2 and f"train.init_from='{step}'" in err and str(step / "model.safetensors") in err
    assert "shape mismatch for model.base.model.layers.0.self_attn." in err
    code, err = cli(["convert", "--config", str(path), "--conversion.lora_rank=2"], capsys)
    assert code == 2 and "missing tensor model.base.model.layers.0.self_attn." in err
    other = tmp_path / "other-base"
    shutil.copytree(base[0], other)
    torch.manual_seed(7)  # same architecture, other weights
    tf.LlamaForCausalLM(tf.AutoConfig.from_pretrained(other)).save_pretrained(other)
    code, err = cli(["convert", "--config", str(path), f"--base.path={other}"], capsys)
    assert code == 2 and f"{step} was converted from the base {base[0].resolve()}" in err
    assert f"base.path='{other}' is {other.resolve()} (sha256 differs for model.safetensors)" in err
    texts = [p.read_text()[::-1] for p in sorted(base[2].glob("*.txt"))]  # same size, other merges
    other_tok = train_bpe(texts, vocab_size=320).save(tmp_path / "other-tok")
    code, err = cli(["convert", "--config", str(path), f"--data.tokenizer={other_tok}"], capsys)
    assert code == 2 and f"{step / 'tokenizer.json'} is not this run's tokenizer" in err
    assert not list((tmp_path / "run").glob("step-*"))  # nothing was trained for any of them


def test_an_export_without_a_base_reference_or_with_a_replaced_file_is_refused(base, source, tmp_path):  # noqa: F811
    export = tmp_path / "export"
    shutil.copytree(source / "model", export)
    weights = load_file(export / "model.safetensors")
    save_file({k: v * 2 for k, v in weights.items()}, export / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors has sha256 .* not the .* its config.json recorded"):
        train(up_config(base, tmp_path / "a", export))
    config_json = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config_json, "base_weights": None}))
    with pytest.raises(ValueError, match=r"holds every tensor and no reference to its base"):
        train(up_config(base, tmp_path / "b", export))


def test_latte_train_starts_a_language_model_from_a_run_folder(make_config, tmp_path):
    """The trainer's option, not the conversion's: the LM task too."""
    train(make_config(run_dir=tmp_path / "src", **{"train.steps": 2, "train.save_every": 2}))
    saved = load_checkpoint(tmp_path / "src" / "step-00000002").model_state
    cfg = make_config(run_dir=tmp_path / "new", **{"train.steps": 2, "train.init_from": str(tmp_path / "src")})
    got = start_weights(cfg)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    wider = make_config(run_dir=tmp_path / "w", **{"model.dim": 48, "train.init_from": str(tmp_path / "src")})
    with pytest.raises(ValueError, match=r"(?s)train.init_from=.*src.*: .*shape mismatch for "):
        train(wider)
    export = tmp_path / "export"  # what `latte export` of a language model writes: not a start of `latte train`
    export.mkdir()
    save_file({k: v.clone() for k, v in saved.items()}, export / "model.safetensors")
    (export / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"an exported model folder; task 'lm' starts only from a checkpoint"):
        train(make_config(run_dir=tmp_path / "e", **{"train.init_from": str(export)}))


def test_a_run_dir_holding_another_run_is_never_resumed_as_the_new_one(base, source, tmp_path):  # noqa: F811
    """A forgotten train.run_dir (the shipped config's is the source run's):
    the run there did not start from init_from, so it is not resumed."""
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    before = losses(copy)
    with pytest.raises(ValueError, match=r"train.run_dir holds a run that did not start from it .*task's own"):
        train(up_config(base, copy, copy / "step-00000002", steps=3))
    other = tmp_path / "other-init"
    shutil.copytree(source / "step-00000002", other / "step-00000002")
    train(up_config(base, tmp_path / "new", source / "step-00000002", time_budget_minutes=1e-9))
    with pytest.raises(ValueError, match=r"did not start from it .*started from train.init_from=.*init-source"):
        train(up_config(base, tmp_path / "new", other / "step-00000002"))
    assert losses(copy) == before and [s for s, _ in losses(tmp_path / "new")] == [1]
