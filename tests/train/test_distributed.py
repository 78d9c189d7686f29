"""Real 2-process runs on CPU (torchrun, gloo), grouped so that each launch
checks several things (docs/reliability.md, "Distributed"):

- 2 ranks x batch b == 1 process x batch 2b (final weights), DDP and FSDP2,
  the 2-rank runs with 2 accumulation micro-steps (gradient sync skipped on
  the first);
- a NaN loss on rank 1 only makes BOTH ranks skip that step (the single
  process reference skips the same step);
- DDP saves the full format, FSDP2 the sharded one (DCP: one file per rank,
  each listed with its sha256 in the manifest); a checkpoint saved by 2
  ranks resumes bit for bit on 2 ranks (the FSDP2 resume then saves the full
  format: the same weights), and on 1 process (resharded) continues with
  the losses of the 2-rank run;
- while a torchrun job runs, its rank 0 holds the run folder's lock: a
  second trainer on the same folder stops at once naming rank 0's pid.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import socket

import pytest
import torch

from latte.config_io import build
from latte.files import sha256_file
from latte.train.checkpoint import load_checkpoint, verify_checkpoint
from latte.train.config import LMRunConfig
from latte.train.loop import train
from latte.train.metrics import read_csv
from latte.train.runs import open_run
from tests.train.runs import (
    PROCESS_TIMEOUT_S,
    losses,
    run_cli,
    start_cli,
    tiny_config_dict,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.slow
STEPS, NAN_STEP = 4, 2  # step index 2 (the third step) is poisoned; step 2 is saved before it
MODES = ("ddp", "fsdp2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus, cache_dir):
    root = tmp_path_factory.mktemp("dist")

    def cfg(name: str, grad_accum: int = 1, **fields) -> LMRunConfig:
        d = tiny_config_dict(corpus, root / name, cache_dir)
        d["optim"]["grad_accum"] = grad_accum
        d["train"].update(
            {"steps": STEPS, "global_batch_size": 8, "save_every": 2, "keep": 2, "sample_tokens": 4, **fields}
        )
        return build(LMRunConfig, d)

    def single(name: str, **fields) -> None:  # in this process, skipping the same step
        mp = pytest.MonkeyPatch()
        try:
            mp.setenv("LATTE_FAULTS", f"nan_loss={NAN_STEP}")
            train(cfg(name, **fields))
        finally:
            mp.undo()

    single("single")
    for mode in MODES:
        # 2 micro-steps per rank: the first one skips the gradient sync
        path = write_config(cfg(mode, grad_accum=2, distributed=mode), root / f"{mode}.yaml")
        proc = start_cli(["train", "--config", str(path)], faults=f"nan_loss={NAN_STEP}@1,hold_at=1", torchrun=2)
        wait_for(root / mode / "hold", proc)  # rank 0 holds the lock, waiting before step 1
        if mode == "ddp":  # a second trainer on the same run folder
            second = run_cli(["train", "--config", str(path)])
            (root / "second.txt").write_text(
                f"{second.returncode}\n{(root / mode / 'hold').read_text()}\n{second.stderr}"
            )
        os.remove(root / mode / "hold")
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
        assert proc.returncode == 0, out + err
        assert err.count("final validation perplexity") == 1  # rank 0 alone reports
    # saved by 2 ranks, resumed from the middle by 2 ranks and by 1 process
    for mode in MODES:
        middle = str(root / mode / "step-00000002")
        # the FSDP2 resume reads the sharded step 2 and saves the full format (gathered on rank 0)
        fmt = {"checkpoint_format": "full"} if mode == "fsdp2" else {}
        path = write_config(
            cfg(f"{mode}-resumed", grad_accum=2, distributed=mode, resume=middle, **fmt), root / f"{mode}-resumed.yaml"
        )
        proc = run_cli(["train", "--config", str(path)], faults=f"nan_loss={NAN_STEP}@1", torchrun=2)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        single(f"{mode}-on-one", resume=middle)
    return root


def final_weights(run_dir) -> dict[str, torch.Tensor]:
    """Weights of the last checkpoint, from either format (opened in one process)."""
    return open_run(run_dir / f"step-{STEPS:08d}").model.state_dict()


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_match_one_process_with_twice_the_batch(runs, mode):
    ref, got = final_weights(runs / "single"), final_weights(runs / mode)
    assert ref.keys() == got.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-5, msg=f"{mode}: {k}")
    rows_ref, rows = read_csv(runs / "single" / "metrics.csv"), read_csv(runs / mode / "metrics.csv")
    for a, b in zip(rows_ref, rows):
        assert a["tokens"] == b["tokens"] == str(8 * 32)  # summed over ranks
        if a["applied"] == "1":  # AdamW hides a gradient scale error in the weights: check the norm
            assert math.isclose(float(a["loss"]), float(b["loss"]), rel_tol=1e-5)
            assert math.isclose(float(a["grad_norm"]), float(b["grad_norm"]), rel_tol=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_nan_on_one_rank_skips_the_step_on_both(runs, mode):
    rows = read_csv(runs / mode / "metrics.csv")
    assert [r["applied"] for r in rows] == ["1", "1", "0", "1"]
    # had either rank applied the NaN update, its weights (and every later loss) would be NaN
    assert math.isfinite(float(rows[3]["loss"]))


@pytest.mark.parametrize("mode", MODES)
def test_two_rank_resume_is_bitwise_exact(runs, mode):
    assert losses(runs / f"{mode}-resumed") == losses(runs / mode)[2:]  # repr() strings: bit for bit
    want, got = final_weights(runs / mode), final_weights(runs / f"{mode}-resumed")
    assert all(torch.equal(got[k], want[k]) for k in want)
    if mode == "fsdp2":  # the same weights through the other format
        assert verify_checkpoint(runs / "fsdp2-resumed" / f"step-{STEPS:08d}")["weights"] == "full"


@pytest.mark.parametrize("mode", MODES)
def test_two_rank_checkpoint_resumes_on_one_process(runs, mode):
    ref, resumed = read_csv(runs / mode / "metrics.csv"), read_csv(runs / f"{mode}-on-one" / "metrics.csv")
    assert [r["step"] for r in resumed] == ["3", "4"]
    for a, b in zip(ref[2:], resumed):
        assert a["applied"] == b["applied"]
        if a["applied"] == "1":
            assert math.isclose(float(a["loss"]), float(b["loss"]), rel_tol=1e-5)
    want, got = final_weights(runs / "single"), final_weights(runs / f"{mode}-on-one")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_fsdp2_checkpoints_are_sharded_with_every_shard_hashed(runs, tmp_path):
    step = runs / "fsdp2" / "step-00000002"
    manifest = verify_checkpoint(step)
    assert manifest["weights"] == "sharded" and not (step / "model.safetensors").exists()
    shards = {n for n in manifest["files"] if n.startswith("dcp/")}
    assert shards == {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"}
    assert all(manifest["files"][n]["sha256"] == sha256_file(step / n) for n in shards)
    assert verify_checkpoint(runs / "ddp" / "step-00000002")["weights"] == "full"
    # a flipped byte in one shard is caught before DCP reads anything
    copy = tmp_path / "step-00000002"
    shutil.copytree(step, copy)
    data = bytearray((copy / "dcp" / "__1_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "dcp" / "__1_0.distcp").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"__1_0\.distcp: sha256 mismatch"):
        open_run(copy)


def test_planted_pickle_in_dcp_metadata_is_refused(runs, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    copy = tmp_path / "step-00000002"
    shutil.copytree(runs / "fsdp2" / "step-00000002", copy)
    (copy / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    manifest = json.loads((copy / "manifest.json").read_text())  # the attacker rewrites the manifest too
    manifest["files"]["dcp/.metadata"] = {
        "size": (copy / "dcp" / ".metadata").stat().st_size,
        "sha256": sha256_file(copy / "dcp" / ".metadata"),
    }
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"\.metadata: refused: global posix\.system is not allowed"):
        open_run(copy)
    assert not marker.exists()
    with pytest.raises(ValueError, match="refused"):
        load_checkpoint(copy).load_sharded({"model": {}})


def test_second_trainer_is_refused_while_torchrun_rank0_holds_the_lock(runs):
    rc, holder_pid, stderr = (runs / "second.txt").read_text().split("\n", 2)
    assert rc == "2", stderr
    assert f"is in use by another latte train (pid {holder_pid} on host {socket.gethostname()}" in stderr
    rows = read_csv(runs / "ddp" / "metrics.csv")  # the first job was not disturbed
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]
