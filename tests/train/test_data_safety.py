"""The trainer never destroys a good checkpoint by itself (issue 10, items
1-4): no checkpoint of weights that just produced skipped steps, retention
keeps the newest healthy checkpoint, `auto` refuses when nothing verifies,
one trainer per run folder, and a branched timeline is moved aside, never
deleted and never resumed by mistake."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from latte.train.checkpoint import MANIFEST, find_latest_checkpoint, load_checkpoint
from latte.train.loop import train
from latte.train.metrics import read_csv
from latte.train.step import NonFiniteError
from tests.train.runs import KILLED, losses, run_cli, start_cli, wait_for, write_config


def steps_in(run_dir) -> list[str]:
    return sorted(p.name for p in run_dir.glob("step-*"))


# --------------------------------------------------------------------------- item 1


def test_blown_up_weights_are_never_checkpointed_and_good_ones_survive(make_config, tmp_path):
    """The issue's reproduction: resume a finished run with lr=1e6. The first
    update blows the weights up, the next steps are skipped as non-finite;
    no checkpoint of those weights is taken, so retention deletes nothing,
    and a resume at a sane lr continues from the last good step."""
    run = tmp_path / "run"
    train(make_config(**{"train.steps": 4, "train.save_every": 2, "train.keep": 2}))
    good = load_checkpoint(run / "step-00000004").model_state
    with pytest.raises(NonFiniteError, match="5 consecutive steps skipped"):
        train(
            make_config(
                **{
                    "train.steps": 12,
                    "train.save_every": 2,
                    "train.keep": 2,
                    "optim.lr": 1e6,
                    "train.max_consecutive_skips": 5,
                }
            )
        )
    rows = read_csv(run / "metrics.csv")
    assert [r["applied"] for r in rows[4:]] == ["1", "0", "0", "0", "0", "0"]  # step 5 blew them up
    assert steps_in(run) == ["step-00000002", "step-00000004"]  # nothing of steps 6 and 8 was saved
    kept = load_checkpoint(run / "step-00000004").model_state
    assert all(kept[k].equal(good[k]) for k in good)
    summary = train(make_config(**{"train.steps": 6, "train.save_every": 2, "train.keep": 2}))
    assert summary["step"] == 6 and summary["skipped_steps"] == 0  # resumed from step 4 at lr 3e-3


def test_retention_keeps_the_newest_healthy_checkpoint(make_config, tmp_path, monkeypatch):
    """Saves after a skipped step are kept (training went on) but marked
    unhealthy; with keep=2 the two newest are unhealthy, and the newest
    healthy one (step 4) is kept too instead of being deleted."""
    monkeypatch.setenv("LATTE_FAULTS", "nan_loss=5,nan_loss=8")  # 0-based: steps 6 and 9 are skipped
    train(make_config(**{"train.steps": 10, "train.save_every": 2, "train.keep": 2}))
    run = tmp_path / "run"
    assert steps_in(run) == ["step-00000004", "step-00000008", "step-00000010"]  # step 6 was not taken
    for step, healthy in ((4, True), (8, False), (10, False)):
        state = load_checkpoint(run / f"step-{step:08d}").trainer_state
        assert state["healthy"] is healthy and state["last_healthy_step"] == 4


# --------------------------------------------------------------------------- item 2


def test_auto_refuses_when_no_step_folder_verifies_and_deletes_nothing(make_config, tmp_path):
    run = tmp_path / "run"
    train(make_config(**{"train.steps": 4, "train.save_every": 2}))
    os.remove(run / "step-00000004" / MANIFEST)
    weights = run / "step-00000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    before = {p: p.stat().st_size for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ValueError) as e:
        train(make_config(**{"train.steps": 6, "train.save_every": 2}))
    msg = str(e.value)
    assert "holds 2 step folder(s) and none verifies" in msg and "nothing was deleted" in msg
    assert "step-00000004: no manifest.json" in msg
    assert "step-00000002" in msg and "model.safetensors: sha256 mismatch" in msg
    assert {p: p.stat().st_size for p in run.rglob("*") if p.is_file()} == before  # untouched
    # starting over is explicit, and moves them aside instead of deleting them
    summary = train(make_config(**{"train.steps": 2, "train.save_every": 2, "train.resume": "never"}))
    assert summary["step"] == 2 and steps_in(run) == ["step-00000002"]
    (aside,) = (run / "abandoned").iterdir()
    assert sorted(p.name for p in aside.glob("step-*")) == ["step-00000002", "step-00000004"]
    assert (aside / "step-00000004" / "model.safetensors").is_file()


def test_architecture_change_suggests_a_start_over_that_works(make_config, tmp_path):
    train(make_config(**{"train.steps": 2, "optim.warmup_steps": 1}))
    with pytest.raises(ValueError, match="start over with --resume never") as e:
        train(make_config(**{"train.steps": 2, "optim.warmup_steps": 1, "model.dim": 48}))
    assert "model.dim: checkpoint 32, config 48" in str(e.value)
    summary = train(
        make_config(**{"train.steps": 2, "optim.warmup_steps": 1, "model.dim": 48, "train.resume": "never"})
    )
    assert summary["step"] == 2
    assert load_checkpoint(tmp_path / "run" / "step-00000002").config["model"]["dim"] == 48


# --------------------------------------------------------------------------- item 3


@pytest.mark.slow
def test_one_trainer_per_run_folder_and_kill_9_releases_the_lock(make_config, tmp_path):
    """A second trainer on a folder in use stops at once naming the holder
    (pid, host) and touches nothing; after kill -9 of the holder the kernel
    has released the lock and the next trainer resumes."""
    path = write_config(make_config(**{"train.steps": 6, "train.save_every": 2}), tmp_path / "c.yaml")
    run = tmp_path / "run"
    first = start_cli(["train", "--config", str(path)], faults="hold_at=3")
    wait_for(run / "hold", first)  # step 2 is committed, the first trainer holds the folder
    logs = {n: (run / n).read_bytes() for n in ("metrics.csv", "config.yaml")}
    second = run_cli(["train", "--config", str(path), "--train.steps=20"])
    assert second.returncode == 2, second.stderr
    assert f"is in use by another latte train (pid {first.pid} on host {socket.gethostname()}" in second.stderr
    assert {n: (run / n).read_bytes() for n in logs} == logs  # nothing written by the second
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    KILLED.append("holder of the run-folder lock")
    third = run_cli(["train", "--config", str(path)])
    assert third.returncode == 0, third.stderr
    assert "resuming from" in third.stderr and "step-00000002" in third.stderr
    assert [int(r["step"]) for r in read_csv(run / "metrics.csv")] == [1, 2, 3, 4, 5, 6]
    assert (run / "val.csv").read_text().count("step,") == 1  # one header


# --------------------------------------------------------------------------- item 4


@pytest.mark.slow
def test_a_branch_is_followed_by_auto_and_the_old_timeline_moved_aside(make_config, tmp_path):
    """Train 6 steps at lr 3e-3; branch from step 2 at lr 1e-3, killed after
    its step 4; `auto` then continues the branch (not the old step 6), and
    the old steps 4 and 6 sit intact under abandoned/ with the old logs."""
    run = tmp_path / "run"
    train(make_config(**{"train.steps": 6, "train.save_every": 2}))
    old = losses(run)
    branch = write_config(
        make_config(**{"train.steps": 6, "train.save_every": 2, "optim.lr": 1e-3}), tmp_path / "branch.yaml"
    )
    proc = run_cli(
        ["train", "--config", str(branch), "--resume", str(run / "step-00000002")], faults="kill_after_save=4"
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert steps_in(run) == ["step-00000002", "step-00000004"]
    (aside,) = (run / "abandoned").iterdir()
    assert aside.name.endswith("branch-from-step-00000002")
    assert sorted(p.name for p in aside.glob("step-*")) == ["step-00000004", "step-00000006"]
    assert losses(aside) == old  # the old timeline's log, as it was
    assert load_checkpoint(aside / "step-00000006").trainer_state["step"] == 6  # intact, verifies
    proc = run_cli(["train", "--config", str(branch)])  # resume auto
    assert proc.returncode == 0, proc.stderr
    assert f"resuming from {run / 'step-00000004'}" in proc.stderr
    rows = read_csv(run / "metrics.csv")
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert [r["loss"] for r in rows[:2]] == [loss for _, loss in old[:2]]  # shared history
    assert all(float(r["lr"]) <= 1e-3 for r in rows[2:])  # the branch's lr from step 3 on
    assert load_checkpoint(find_latest_checkpoint(run)).config["optim"]["lr"] == 1e-3
    assert json.loads((run / "summary.json").read_text())["step"] == 6
