"""Crash-safe checkpoints: each failure case of docs/reliability.md is a test here."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from latte.files import sha256_file
from latte.models import weights
from latte.train import checkpoint as ck
from latte.train.checkpoint import (
    Ranks,
    Snapshot,
    check_state_against,
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from latte.train.rng import capture_rng_state, restore_rng_state
from tests.train.runs import KILLED

REPO = Path(__file__).resolve().parents[2]


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 11))
    model[1].weight = model[0].weight  # tied, like an LM head
    return model


def train_state(model: nn.Module) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    opt.step()
    return opt.state_dict()


def save(run_dir, step, model=None, **kw):
    model = model or tiny_model()
    args = dict(
        model_state=model.state_dict(),
        optimizer_state=train_state(model),
        trainer_state={"step": step, "tokens_seen": 96 * step, "data_position": 3 * step},
        rng_state=capture_rng_state(),
        config={"model": {"dim": 8}, "train": {"lr": 1e-3}},
    )
    args.update(kw)
    ranks = Ranks(**{k: args.pop(k) for k in ("rank", "world_size", "barrier") if k in args})
    options = {k: args.pop(k) for k in ("keep", "protect", "before_commit") if k in args}
    return save_checkpoint(run_dir, step, Snapshot(**args), ranks=ranks, **options)


def steps_on_disk(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("step-"))


def test_round_trip(tmp_path):
    model = tiny_model()
    opt_state = train_state(model)
    tok = tmp_path / "tokenizer.json"
    tok.write_text('{"vocab": {}}')
    rng = capture_rng_state()
    path = save_checkpoint(
        tmp_path / "run",
        7,
        Snapshot(
            model_state=model.state_dict(),
            optimizer_state=opt_state,
            trainer_state={"step": 7, "skips": 0},
            rng_state=rng,
            config={"model": {"dim": 8}},
            extra_files={"tokenizer.json": tok},
        ),
    )
    assert path.name == "step-00000007" and find_latest_checkpoint(tmp_path / "run") == path
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        "model.safetensors",
        "optimizer.pt",
        "trainer_state.json",
        "config.yaml",
        "rng-rank0.pt",
        "tokenizer.json",
    }
    assert manifest["step"] == 7 and set(manifest["versions"]) == {"torch", "latte", "python"}

    ckpt = load_checkpoint(path)
    assert ckpt.step == 7 and ckpt.trainer_state == {"step": 7, "skips": 0}
    assert ckpt.config == {"model": {"dim": 8}}
    assert (path / "tokenizer.json").read_text() == tok.read_text()
    for k, v in model.state_dict().items():  # tied weights were stored twice, both equal
        assert torch.equal(ckpt.model_state[k], v)
    fresh = tiny_model()
    fresh.load_state_dict(ckpt.model_state)
    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    opt.load_state_dict(ckpt.optimizer_state)
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], opt_state["state"][0]["exp_avg"])
    assert all(torch.equal(ckpt.rng_state(0)[k], v) for k, v in rng.items())
    assert ckpt.rng_state(1) is None  # saved with one rank


KILL_CHILD = textwrap.dedent("""
    import os, signal, sys, torch
    from latte.models import weights
    from latte.train import checkpoint as ck
    run_dir, where = sys.argv[1:]
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    def half_written_weights(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\\0" * 4096)
            f.flush()
        die()
    def half_written_manifest(path, data):
        with open(str(path) + ".tmp", "w") as f:
            f.write(data[: len(data) // 2])
        die()
    if where == "mid_weights":
        weights.save_file = half_written_weights
    if where == "mid_manifest":
        ck.atomic_write = half_written_manifest
    if where == "sharded_before_manifest":  # DCP shards written (one process, no group), no manifest
        ck.save_checkpoint(run_dir, 3, ck.Snapshot(sharded_state={"model": {"w": torch.randn(512, 512)}},
                           trainer_state={"step": 3}, rng_state={}, config={}), before_commit=die)
    ck.save_checkpoint(run_dir, 3, ck.Snapshot(model_state={"w": torch.randn(512, 512)}, optimizer_state={},
                       trainer_state={"step": 3}, rng_state={}, config={}),
                       ranks=ck.Ranks(barrier=die if where == "before_manifest" else None))
    sys.exit(0)  # not reached: the save must have been killed
""")


def test_kill_9_during_save_leaves_previous_checkpoint(tmp_path, caplog):
    wheres = ["mid_weights", "before_manifest", "mid_manifest", "sharded_before_manifest"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for where in wheres:
        save(tmp_path / where, 1)
        save(tmp_path / where, 2)
    # The killed savers run concurrently to keep the suite fast.
    children = [
        subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(tmp_path / w), w], env=env, stderr=subprocess.PIPE)
        for w in wheres
    ]
    for where, child in zip(wheres, children):
        _, err = child.communicate(timeout=120)
        assert child.returncode == -9, (where, err.decode())
        KILLED.append(f"checkpoint save ({where})")
        run_dir = tmp_path / where
        assert steps_on_disk(run_dir) == ["step-00000001", "step-00000002", "step-00000003"]
        assert not (run_dir / "step-00000003" / "manifest.json").exists()
        if where == "sharded_before_manifest":
            assert (run_dir / "step-00000003" / "dcp" / ".metadata").is_file()  # the shards were written
        with caplog.at_level(logging.WARNING):
            latest = find_latest_checkpoint(run_dir)
        assert latest == run_dir / "step-00000002"
        assert "step-00000003" in caplog.text and "no manifest.json" in caplog.text
        assert load_checkpoint(latest).trainer_state["step"] == 2
        # The next save commits, then cleans the half-written step and the oldest one.
        save(run_dir, 4)
        assert steps_on_disk(run_dir) == ["step-00000002", "step-00000004"]


def test_flipped_byte_in_weights_is_detected(tmp_path, caplog):
    save(tmp_path, 1)
    path = save(tmp_path, 2)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01  # inside the tensor data, not the header
    weights.write_bytes(bytes(data))
    _ = load_checkpoint(path, verify="none").model_state  # safetensors itself does not notice ...
    with pytest.raises(ValueError, match=r"model\.safetensors: sha256 mismatch"):  # ... the manifest does
        load_checkpoint(path)
    with caplog.at_level(logging.WARNING):
        assert find_latest_checkpoint(tmp_path) == tmp_path / "step-00000001"
    assert "sha256 mismatch" in caplog.text


def test_truncated_optimizer_file_is_named(tmp_path):
    path = save(tmp_path, 1)
    opt = path / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"optimizer\.pt: \d+ bytes but the manifest says \d+ \(truncated"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match=r"optimizer\.pt: cannot be read, truncated or corrupt"):
        _ = load_checkpoint(path, verify="none").optimizer_state  # the torch error is wrapped and names the file too
    assert find_latest_checkpoint(tmp_path) is None


def test_missing_key_and_wrong_shape_listed_together():
    expected = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(1)}
    loaded = {"a": torch.zeros(3, 2), "b": torch.zeros(4), "d": torch.zeros(1)}
    with pytest.raises(ValueError) as excinfo:
        check_state_against(expected, loaded, where="run/step-00000002/model.safetensors")
    msg = str(excinfo.value)
    assert msg.startswith("run/step-00000002/model.safetensors: 3 problems loading into the model")
    assert "missing tensor c (1,)" in msg and "unexpected tensor d (1,)" in msg
    assert "shape mismatch for a: file (3, 2), model (2, 3)" in msg
    check_state_against(expected, dict(expected), where="ok")


def _fail_with_enospc(tensors, filename, metadata=None):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("how", ["monkeypatch", "dev_full"])
def test_oserror_during_save_names_path_and_keeps_old_steps(tmp_path, monkeypatch, how):
    save(tmp_path, 1)
    save(tmp_path, 2)
    new = tmp_path / "step-00000003"
    if how == "monkeypatch":
        monkeypatch.setattr(weights, "save_file", _fail_with_enospc)
        failing = new / "model.safetensors"
    else:  # a real ENOSPC from the kernel, raised inside torch.save
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        new.mkdir()
        (new / "optimizer.pt").symlink_to("/dev/full")
        failing = new / "optimizer.pt"
    with pytest.raises(OSError) as excinfo:
        save(tmp_path, 3)
    assert excinfo.value.errno == errno.ENOSPC and str(failing) in str(excinfo.value)
    assert not (new / "manifest.json").exists()
    assert steps_on_disk(tmp_path) == ["step-00000001", "step-00000002", "step-00000003"]
    assert find_latest_checkpoint(tmp_path) == tmp_path / "step-00000002"


def test_retention_keeps_two_and_deletes_only_after_commit(tmp_path, monkeypatch):
    (tmp_path / "step-00000000").mkdir()  # an old incomplete save
    (tmp_path / "step-00000099").mkdir()  # incomplete and newer: left alone
    deleted = []
    real_rmtree = ck.shutil.rmtree

    def spy(path, **kw):
        deleted.append(Path(path).name)
        committed = [n for n in steps_on_disk(tmp_path) if n != "step-00000099"]
        newest = tmp_path / max(committed)
        assert (newest / "manifest.json").exists(), "deleted before the new manifest committed"
        real_rmtree(path, **kw)

    monkeypatch.setattr(ck.shutil, "rmtree", spy)
    for step in range(1, 6):
        save(tmp_path, step)
    assert deleted == ["step-00000000", "step-00000001", "step-00000002", "step-00000003"]
    assert steps_on_disk(tmp_path) == ["step-00000004", "step-00000005", "step-00000099"]
    save(tmp_path, 6, keep=3)
    assert steps_on_disk(tmp_path) == ["step-00000004", "step-00000005", "step-00000006", "step-00000099"]
    with pytest.raises(ValueError, match="keep: got 1, expected >= 2"):
        save(tmp_path, 7, keep=1)


def test_pickle_payload_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = save(tmp_path, 1)
    torch.save({"state": {}, "param_groups": [], "x": Payload()}, path / "optimizer.pt")
    # An attacker controls the whole folder, so make the manifest agree with the file.
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["optimizer.pt"] = {
        "size": (path / "optimizer.pt").stat().st_size,
        "sha256": sha256_file(path / "optimizer.pt"),
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"optimizer\.pt: refused"):
        _ = load_checkpoint(path).optimizer_state
    assert not marker.exists()


def test_rng_capture_restore_reproduces_all_generators():
    def draw():
        return (
            torch.rand(5).tolist(),
            torch.randn(3).tolist(),
            random.random(),
            random.gauss(0, 1),
            np.random.rand(3).tolist(),
            np.random.randn(3).tolist(),
        )

    random.gauss(0, 1), np.random.randn(1)  # leave cached gaussians in the state
    state = capture_rng_state()
    first = draw()
    restore_rng_state(state)
    assert draw() == first
    restore_rng_state(state)
    assert draw() == first


def test_rng_round_trip_through_checkpoint_and_ranks(tmp_path):
    # Two ranks simulated in turn: rank 1 writes its RNG file, rank 0 commits.
    states = {}
    for rank in (1, 0):
        torch.manual_seed(rank), random.seed(rank), np.random.seed(rank)
        states[rank] = capture_rng_state()
        save(tmp_path, 1, rng_state=states[rank], rank=rank, world_size=2, barrier=lambda: None)
    ckpt = load_checkpoint(find_latest_checkpoint(tmp_path))
    assert ckpt.world_size == 2
    for rank in (0, 1):
        restore_rng_state(ckpt.rng_state(rank))
        got = (torch.rand(2).tolist(), random.random(), np.random.rand())
        torch.manual_seed(rank), random.seed(rank), np.random.seed(rank)
        assert got == (torch.rand(2).tolist(), random.random(), np.random.rand())


def test_missing_rank_file_blocks_commit(tmp_path):
    with pytest.raises(FileNotFoundError, match="rng-rank1.pt is missing"):
        save(tmp_path, 1, world_size=2, barrier=lambda: None)
    assert not (tmp_path / "step-00000001" / "manifest.json").exists()
    with pytest.raises(ValueError, match="barrier is required"):
        save(tmp_path, 1, world_size=2)


def test_bad_inputs_fail_before_writing(tmp_path):
    with pytest.raises(ValueError, match="trainer_state must be JSON-serializable"):
        save(tmp_path, 1, trainer_state={"when": object()})
    with pytest.raises(ValueError, match="rng_state: values must be Tensors"):
        save(tmp_path, 1, rng_state={"python": random.getstate()})
    with pytest.raises(ValueError, match="not allowed as a checkpoint file name"):
        save(tmp_path, 1, extra_files={"../x": tmp_path})
    assert list(tmp_path.iterdir()) == []
