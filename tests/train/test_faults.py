"""Real process faults (docs/reliability.md): kill -9 after a checkpoint commits,
kill -9 in the middle of a save, SIGTERM. Each run is a `python -m latte
train` subprocess that hurts itself at an exact point (LATTE_FAULTS, see
latte/train/faults.py); resuming must reproduce the uninterrupted run's loss
sequence bit for bit on CPU."""

from __future__ import annotations

import signal

import pytest

from latte.train.checkpoint import find_latest_checkpoint, load_checkpoint
from tests.train.runs import losses, run_cli, write_config

pytestmark = pytest.mark.slow
STEPS = 6


@pytest.fixture(scope="module")
def straight(tmp_path_factory, corpus, cache_dir):
    """The uninterrupted reference: 6 steps, checkpoints every 2."""
    from latte.config_io import build
    from latte.train.config import LMRunConfig
    from tests.train.runs import tiny_config_dict

    root = tmp_path_factory.mktemp("faults")

    def config(name: str, **train) -> str:
        d = tiny_config_dict(corpus, root / name, cache_dir)
        d["train"].update({"steps": STEPS, "save_every": 2, "sample_tokens": 0, **train})
        return str(write_config(build(LMRunConfig, d), root / f"{name}.yaml"))

    proc = run_cli(["train", "--config", config("straight")])
    assert proc.returncode == 0, proc.stderr
    ref = losses(root / "straight")
    assert [s for s, _ in ref] == list(range(1, STEPS + 1))
    return root, config, ref


def test_kill9_after_half_then_resume_is_bitwise_identical(straight):
    root, config, ref = straight
    cfg = config("killed", save_every=3)
    proc = run_cli(["train", "--config", cfg], faults="kill_after_save=3")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert find_latest_checkpoint(root / "killed").name == "step-00000003"
    assert losses(root / "killed") == ref[:3]
    proc = run_cli(["train", "--config", cfg, "--resume", "auto"])
    assert proc.returncode == 0, proc.stderr
    assert "resuming from" in proc.stderr
    assert losses(root / "killed") == ref  # bitwise: the strings are repr() of the floats


def test_kill9_during_save_leaves_previous_checkpoint(straight):
    root, config, ref = straight
    cfg = config("midsave")
    proc = run_cli(["train", "--config", cfg], faults="kill_during_save=4")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    half = root / "midsave" / "step-00000004"
    assert (half / "model.safetensors").is_file() and not (half / "manifest.json").exists()
    latest = find_latest_checkpoint(root / "midsave")
    assert latest.name == "step-00000002"
    assert load_checkpoint(latest).trainer_state["step"] == 2  # intact and verified
    proc = run_cli(["train", "--config", cfg])
    assert proc.returncode == 0, proc.stderr
    assert losses(root / "midsave") == ref
    assert find_latest_checkpoint(root / "midsave").name == f"step-{STEPS:08d}"


def test_sigterm_finishes_the_step_checkpoints_and_exits_0(straight):
    root, config, ref = straight
    cfg = config("sigterm")
    proc = run_cli(["train", "--config", cfg], faults="sigterm_at=2")  # during the third step
    assert proc.returncode == 0, proc.stderr
    assert "stopped cleanly after step 3: SIGTERM received (preemption)" in proc.stderr
    assert find_latest_checkpoint(root / "sigterm").name == "step-00000003"
    assert not (root / "sigterm" / "summary.json").exists()  # preempted: no final evaluation
    assert losses(root / "sigterm") == ref[:3]
    proc = run_cli(["train", "--config", cfg])
    assert proc.returncode == 0, proc.stderr
    assert losses(root / "sigterm") == ref


def test_sigterm_inside_a_step_stops_after_that_step(straight):
    """A real preemption lands mid-step, after the step read the stop flag:
    a single process still stops after that step, not the next one."""
    root, config, ref = straight
    cfg = config("sigterm-in")
    proc = run_cli(["train", "--config", cfg], faults="sigterm_in=2")
    assert proc.returncode == 0, proc.stderr
    assert "stopped cleanly after step 3: SIGTERM received (preemption)" in proc.stderr
    assert find_latest_checkpoint(root / "sigterm-in").name == "step-00000003"
    assert losses(root / "sigterm-in") == ref[:3]
