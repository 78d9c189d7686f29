"""Helpers for the trainer tests: a tiny run config, and running the trainer
as a real subprocess (`python -m latte`, or torchrun) for kill -9 / SIGTERM."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from latte.config_io import save_yaml
from latte.train.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
# a subprocess trainer (torchrun included) on a loaded 2-core machine: generous, only a hang trips it
PROCESS_TIMEOUT_S = 600.0


def write_corpus(folder: Path) -> Path:
    """Ten documents (~40K characters) of Python's help text: no install needed."""
    from pydoc_data.topics import topics

    names = sorted(topics)[:60]
    for i in range(10):
        text = "\n\n".join(topics[n] for n in names[i * 6 : (i + 1) * 6])
        (folder / f"doc{i:02d}.txt").write_text(text[:4000], encoding="utf-8")
    return folder


def tiny_config_dict(corpus: Path, run_dir: Path, cache_dir: Path) -> dict:
    return {
        "data": {
            "source": str(corpus),
            "val_fraction": 0.2,
            "tokenizer": "bpe",
            "vocab_size": 320,
            "seq_len": 32,
            "cache_dir": str(cache_dir),
        },
        "model": {
            "mixer": "macchiato",
            "dim": 32,
            "num_layers": 2,
            "num_heads": 2,
            "latents_per_head": 4,
            "window_size": 8,
            "chunk_size": 8,
            "mlp_ratio": 2.0,
        },
        "optim": {"lr": 3e-3, "warmup_steps": 2, "decay": "cosine", "grad_clip": 1.0},
        "train": {
            "steps": 6,
            "global_batch_size": 4,
            "eval_every": 0,
            "eval_batches": 2,
            "save_every": 3,
            "keep": 5,
            "seed": 0,
            "run_dir": str(run_dir),
            "log_every": 1,
            "sample_tokens": 8,
            "tensorboard": False,
            "num_threads": 1,
        },
    }


def write_config(cfg: RunConfig, path: Path) -> Path:
    save_yaml(cfg, path)
    return path


def train_tiny_run(root: Path, steps: int = 4) -> Path:
    """Trains the tiny config for `steps` steps in `root/run` with `latte
    train` (in process) on a corpus written under `root`; returns the run folder."""
    from latte.cli import main
    from latte.config_io import build
    from latte.train.config import LMRunConfig

    (root / "corpus").mkdir()
    corpus = write_corpus(root / "corpus")
    cfg = build(LMRunConfig, tiny_config_dict(corpus, root / "run", root / "cache"))
    path = write_config(cfg, root / "tiny.yaml")
    assert main(["train", "--config", str(path), f"--train.steps={steps}", "--optim.warmup_steps=1"]) == 0
    return root / "run"


KILLED: list[str] = []  # processes the fault tests killed with SIGKILL (reported at the end of the run)


def _cli(args: list[str], faults: str, torchrun: int) -> tuple[list[str], dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("LATTE_FAULTS", None)
    if faults:
        env["LATTE_FAULTS"] = faults
    if torchrun:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={torchrun}",
            "-m",
            "latte",
            *args,
        ]
    else:
        cmd = [sys.executable, "-m", "latte", *args]
    return cmd, env


def run_cli(args: list[str], *, faults: str = "", torchrun: int = 0, timeout: float = PROCESS_TIMEOUT_S):
    """`python -m latte ...` (or torchrun with `torchrun` processes) in a
    subprocess; returns the CompletedProcess."""
    cmd, env = _cli(args, faults, torchrun)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode == -signal.SIGKILL:
        KILLED.append(" ".join(args))
    return proc


def start_cli(args: list[str], *, faults: str = "", torchrun: int = 0) -> subprocess.Popen:
    """Like `run_cli`, but returns at once (finish with `.communicate()`)."""
    cmd, env = _cli(args, faults, torchrun)
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = PROCESS_TIMEOUT_S) -> None:
    """Until `path` exists (e.g. RUN_DIR/hold of LATTE_FAULTS=hold_at=N); fails
    if `proc` ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended (rc {proc.returncode}) before {path} appeared:\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def losses(run_dir: Path) -> list[tuple[int, str]]:
    """(step, loss as written: repr of the float, so comparing strings is bitwise)."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [(int(r["step"]), r["loss"]) for r in csv.DictReader(f)]
