"""The checkpoint format: what a step folder holds, the manifest that commits
it, and its verification (docs/reliability.md, "Checkpoints"; the commit
protocol that writes it is train/checkpoint.py).

Layout of one checkpoint, ``run_dir/step-00001200/``::

    model.safetensors    weights, written by rank 0         } "full" format
    optimizer.pt         optimizer state_dict (torch.save)  }
    dcp/                 weights + optimizer state as torch.distributed.checkpoint
                         shards, one file per rank ("sharded" format, FSDP2)
    trainer_state.json   step, samples seen, data position, skip counts, health
    config.yaml          the resolved run config
    rng-rank{r}.pt       RNG states as tensors, one file per rank
    <extra files>        the task's, e.g. tokenizer.json
    manifest.json        written LAST by rank 0: the commit marker

The manifest lists the name, size and sha256 of every file, the format, step,
world size and versions. It must list every file that loading reads (the
required files of its format and world size), so no file loads unchecked.
A step folder whose manifest is missing or does not verify does not exist as
far as resuming is concerned.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path

import torch

from latte._version import __version__
from latte.files import sha256_file

MANIFEST = "manifest.json"
MODEL, OPTIMIZER, TRAINER, CONFIG = "model.safetensors", "optimizer.pt", "trainer_state.json", "config.yaml"
DCP_DIR = "dcp"
FORMAT_VERSION = 2
STEP_RE = re.compile(r"^step-(\d{8,})$")
NAME_RE = re.compile(r"^(dcp/)?[A-Za-z0-9_][A-Za-z0-9_.+-]*$|^dcp/\.metadata$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or read: no or bad manifest, a
    file missing, unlisted, truncated, corrupted or refused."""


def step_dir_name(step: int) -> str:
    """Zero-padded so that names sort by step (up to 10**8 steps)."""
    return f"step-{step:08d}"


def rng_name(rank: int) -> str:
    return f"rng-rank{rank}.pt"


def step_dirs(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every step folder in `run_dir`, newest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def saved_files(step_dir: Path, world_size: int, fmt: str, extra: list[str]) -> list[str]:
    files = [TRAINER, CONFIG, *extra, *(rng_name(r) for r in range(world_size))]
    if fmt == "full":
        return files + [MODEL, OPTIMIZER]
    shards = sorted(p.name for p in (step_dir / DCP_DIR).iterdir() if p.is_file() and not p.name.endswith(".tmp"))
    return files + [f"{DCP_DIR}/{name}" for name in shards]


def manifest_json(step_dir: Path, step: int, world_size: int, fmt: str, extra: list[str]) -> str:
    entries = {}
    for name in sorted(saved_files(step_dir, world_size, fmt, extra)):
        path = step_dir / name
        if not path.is_file():  # e.g. a rank that failed before the barrier
            raise FileNotFoundError(f"checkpoint save: expected file {path} is missing; not committing")
        entries[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {
        "format": "latte-checkpoint",
        "format_version": FORMAT_VERSION,
        "weights": fmt,
        "step": step,
        "world_size": world_size,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"torch": torch.__version__, "latte": __version__, "python": platform.python_version()},
        "files": entries,
    }
    return json.dumps(manifest, indent=2)


def read_manifest(step_dir: Path) -> dict:
    """The manifest, checked for shape and for listing every file that
    loading will read (a file it omits would otherwise load unchecked)."""
    path = step_dir / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{step_dir}: no {MANIFEST}, so the save did not complete (or this is not a checkpoint)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    ws = manifest.get("world_size", 1) if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or not isinstance(manifest.get("step"), int)
        or not isinstance(ws, int)
        or ws < 1
        or not all(isinstance(e, dict) and {"size", "sha256"} <= e.keys() for e in files.values())
    ):
        raise CheckpointError(
            f"{path}: not a latte manifest (needs 'step', 'world_size' and 'files' with size and sha256)"
        )
    bad = [n for n in files if not isinstance(n, str) or not NAME_RE.match(n)]
    if bad:
        raise CheckpointError(f"{path}: manifest names files outside the checkpoint folder: {bad}")
    fmt = manifest.get("weights", "full")
    required = [TRAINER, CONFIG, *(rng_name(r) for r in range(ws))]
    required += [MODEL, OPTIMIZER] if fmt == "full" else [f"{DCP_DIR}/.metadata"]
    missing = [n for n in required if n not in files]
    if fmt not in ("full", "sharded") or missing:
        raise CheckpointError(
            f"{path}: the manifest does not list {', '.join(missing) or 'its weights format'}, "
            "which loading reads: refusing files that no checksum covers (tampered or "
            "not written by latte)"
        )
    return manifest


def file_problem(path: Path, entry: dict) -> str | None:
    if not path.is_file():
        return f"{path}: missing"
    if (size := path.stat().st_size) != entry["size"]:
        return f"{path}: {size} bytes but the manifest says {entry['size']} (truncated or modified)"
    if sha256_file(path) != entry["sha256"]:
        return f"{path}: sha256 mismatch (corrupted or modified after the save)"
    return None


def step_problem(step_dir: Path, manifest: dict) -> str | None:
    """The step the manifest names against the folder's name (step-N)."""
    m = STEP_RE.match(step_dir.name)
    if m and int(m.group(1)) != manifest["step"]:
        return f"{MANIFEST}: says step {manifest['step']} but the folder is {step_dir.name}"
    return None


def verify_checkpoint(step_dir: str | os.PathLike) -> dict:
    """Checks every file's size and sha256 against the manifest; returns the
    manifest or raises one ValueError naming each bad file and why."""
    step_dir = Path(step_dir)
    manifest = read_manifest(step_dir)
    problems = [p for p in [step_problem(step_dir, manifest)] if p]
    problems += [p for name, entry in manifest["files"].items() if (p := file_problem(step_dir / name, entry))]
    if problems:
        raise CheckpointError(f"checkpoint {step_dir} failed verification:\n  " + "\n  ".join(problems))
    return manifest
