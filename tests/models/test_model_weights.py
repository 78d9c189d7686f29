"""The one weight format (latte.models.weights): tied tensors stored once and
given back under every name, ordinary file permissions, one name/shape check,
and training checkpoints written and read with the same functions."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from latte.models import LatteConfig, LatteForCausalLM, load_weights, read_weights, save_weights
from latte.models.weights import TIED_KEY, tied_aliases
from latte.train.checkpoint import Snapshot, load_checkpoint, save_checkpoint


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_tied_weights_stored_once_and_read_back_under_both_names(make_lm, tmp_path, umask_022):
    model = make_lm("latte")
    assert tied_aliases(model) == {"lm_head.weight": "model.embed.weight"}
    save_weights(model.state_dict(), tmp_path / "w.safetensors", metadata={"note": "x"})
    stored = load_file(tmp_path / "w.safetensors")
    assert "lm_head.weight" not in stored and "model.embed.weight" in stored
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta[TIED_KEY]) == {"lm_head.weight": "model.embed.weight"} and meta["note"] == "x"
    got = read_weights(tmp_path / "w.safetensors")
    assert got.keys() == model.state_dict().keys()
    assert got["lm_head.weight"] is got["model.embed.weight"]
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]  # no temporary file left


def test_save_pretrained_and_checkpoint_write_the_same_format(make_lm, tmp_path, umask_022):
    model = make_lm("macchiato")
    model.save_pretrained(tmp_path / "pretrained")
    step = save_checkpoint(
        tmp_path / "run",
        3,
        Snapshot(
            model_state=model.state_dict(), optimizer_state={}, trainer_state={"step": 3}, rng_state={}, config={}
        ),
    )
    a = load_file(tmp_path / "pretrained" / "model.safetensors")
    b = load_file(step / "model.safetensors")
    assert a.keys() == b.keys() and "lm_head.weight" not in b  # tied weight stored once in both
    assert all(torch.equal(a[k], b[k]) for k in a)
    for path in (tmp_path / "pretrained" / "model.safetensors", step / "model.safetensors"):
        assert path.stat().st_mode & 0o777 == 0o644
    ckpt = load_checkpoint(step)
    fresh = LatteForCausalLM(model.config)
    fresh.load_state_dict(ckpt.model_state)  # every name is there again, strict load
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    load_weights(fresh, step / "model.safetensors")  # the checkpoint's file loads as a pretrained one


def test_tie_stored_under_the_other_name_or_twice_loads(make_lm, tmp_path):
    model = make_lm("swa")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for drop in ("model.embed.weight", None):  # only lm_head.weight stored; both stored (old checkpoints)
        path = tmp_path / f"{drop}.safetensors"
        save_file({k: v for k, v in state.items() if k != drop}, str(path))
        fresh = LatteForCausalLM(model.config)
        load_weights(fresh, path)
        assert torch.equal(fresh.model.embed.weight, model.model.embed.weight)
        assert fresh.lm_head.weight is fresh.model.embed.weight


def test_bad_tied_metadata_and_bad_aliases_name_the_file(make_lm, tmp_path):
    model = make_lm("latte")
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(2)}, str(path), metadata={TIED_KEY: json.dumps({"b": "c"})})
    with pytest.raises(ValueError, match=r"w.safetensors: tied tensor 'b' refers to 'c'"):
        read_weights(path)
    with pytest.raises(ValueError, match="tied name"):
        save_weights(model.state_dict(), path, aliases={"lm_head.weight": "nowhere"})
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        read_weights(tmp_path / "nothing.safetensors")


def test_write_failure_names_the_file_and_keeps_the_old_one(make_lm, tmp_path, monkeypatch):
    from latte.models import weights

    model = make_lm("latte")
    path = tmp_path / "w.safetensors"
    save_weights(model.state_dict(), path)
    before = path.read_bytes()

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(weights, "save_file", full_disk)
    with pytest.raises(OSError) as e:
        save_weights(model.state_dict(), path)
    assert e.value.errno == 28 and str(path) in str(e.value)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]


def test_untied_model_round_trips_without_metadata(tmp_path):
    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(tie_embeddings=False))
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        assert TIED_KEY not in (f.metadata() or {})
    fresh = LatteForCausalLM(model.config)
    load_weights(fresh, tmp_path / "w.safetensors")
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
