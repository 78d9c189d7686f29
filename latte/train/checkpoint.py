"""Crash-safe checkpoints (design: /work/shared/spec/RELIABILITY.md).

Layout of one checkpoint, ``run_dir/step-00001200/``::

    model.safetensors    weights (rank 0)
    optimizer.pt         optimizer state_dict, torch.save (rank 0)
    trainer_state.json   step, tokens seen, data position, skip counts (rank 0)
    config.yaml          the resolved run config (rank 0)
    rng-rank{r}.pt       RNG states as tensors, one file per rank
    <extra files>        e.g. tokenizer.json, copied (rank 0)
    manifest.json        written LAST by rank 0: the commit marker

Every file is fsynced; then a barrier; then rank 0 writes the manifest
(names, sizes, sha256, versions) via tmp + fsync + rename + directory fsync.
A step folder without a manifest that verifies does not exist as far as
resuming is concerned, so ``kill -9`` at any moment leaves the previous
checkpoint as the latest. Folders are never renamed (renames of directories
broke Hugging Face's trainer on shared multi-node filesystems).

Loading verifies every sha256 (a flipped byte inside safetensors data loads
silently otherwise) and never unpickles objects: ``torch.load(weights_only=True)``.
Not handled here: sharded (FSDP2/DCP) weights, which will need one manifest
entry per shard file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pickle
import platform
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError

import latte
from latte.config_io import atomic_write, load_yaml, save_yaml
from latte.models.weights import check_state, read_weights, save_weights

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MODEL, OPTIMIZER, TRAINER, CONFIG = "model.safetensors", "optimizer.pt", "trainer_state.json", "config.yaml"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    """Zero-padded so that names sort by step (up to 10**8 steps)."""
    return f"step-{step:08d}"


def _rng_name(rank: int) -> str:
    return f"rng-rank{rank}.pt"


# --------------------------------------------------------------------------- save

def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, writer: Callable[[Path], None]) -> None:
    """Runs `writer(path)` and fsyncs the result; any I/O failure (disk full,
    permissions, ...) becomes an OSError that names the file."""
    try:
        writer(path)
        _fsync_path(path)
    except (OSError, SafetensorError) as e:
        code = getattr(e, "errno", None)
        if code is None:  # e.g. SafetensorError: no errno, so put the path in the text
            raise OSError(f"checkpoint save failed writing {path}: {e}") from e
        raise OSError(code, f"checkpoint save failed writing: {e.strerror or e}", str(path)) from e


def _torch_save(obj: Any) -> Callable[[Path], None]:
    def writer(path: Path) -> None:
        # Through a Python file object so that write errors surface as OSError
        # (given a path, torch reports ENOSPC as an opaque RuntimeError).
        with open(path, "wb") as f:
            torch.save(obj, f)
    return writer


def _check_inputs(step, trainer_state, rng_state, extra_files, rank, world_size, keep) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step: got {step!r}, expected an int >= 0")
    if keep < 2:
        raise ValueError(f"keep: got {keep!r}, expected >= 2 "
                         "(a crash while saving must leave one good checkpoint)")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: got {rank}, expected 0 <= rank < world_size ({world_size})")
    bad = [k for k, v in rng_state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"rng_state: values must be Tensors (no pickled objects); not tensors: {bad}")
    reserved = {MODEL, OPTIMIZER, TRAINER, CONFIG, MANIFEST}
    for name in extra_files or {}:
        if "/" in name or "\\" in name or name in reserved or name.startswith(("rng-rank", ".")):
            raise ValueError(f"extra_files: {name!r} is not allowed as a checkpoint file name")
    try:
        return json.dumps(trainer_state, indent=2, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"trainer_state must be JSON-serializable: {e}") from e


def save_checkpoint(run_dir: str | os.PathLike, step: int, *, model_state: dict[str, torch.Tensor],
                    optimizer_state: dict, trainer_state: dict, rng_state: dict[str, torch.Tensor],
                    config: Any, extra_files: dict[str, str | os.PathLike] | None = None,
                    rank: int = 0, world_size: int = 1, barrier: Callable[[], None] | None = None,
                    keep: int = 2) -> Path:
    """Saves ``run_dir/step-{step:08d}/`` and returns that path.

    Every rank calls this (with its own `rng_state`); rank 0 alone writes the
    shared files, so other ranks may pass empty dicts for the rest. `barrier`
    (e.g. ``torch.distributed.barrier``) is required when world_size > 1.
    Retention runs on rank 0 after the manifest commits: it keeps the `keep`
    newest complete steps and removes incomplete folders older than this one.
    On an I/O error an OSError names the file; no manifest is written.
    """
    trainer_json = _check_inputs(step, trainer_state, rng_state, extra_files, rank, world_size, keep)
    if world_size > 1 and barrier is None:
        raise ValueError("barrier is required when world_size > 1 (the manifest must be written last)")
    step_dir = Path(run_dir) / step_dir_name(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0 and (step_dir / MANIFEST).exists():
        # Re-saving a step (e.g. after resuming from an earlier one): un-commit first.
        os.remove(step_dir / MANIFEST)
        _fsync_path(step_dir)
    files = [_rng_name(rank)]
    _write(step_dir / _rng_name(rank), _torch_save(dict(rng_state)))
    if rank == 0:
        _write(step_dir / TRAINER, lambda p: p.write_text(trainer_json, encoding="utf-8"))
        # The package's one weight format (tied tensors stored once, mode 0644).
        _write(step_dir / MODEL, lambda p: save_weights(model_state, p, metadata={"step": str(step)}))
        _write(step_dir / OPTIMIZER, _torch_save(optimizer_state))
        _write(step_dir / CONFIG, lambda p: save_yaml(config, p))
        for name, src in (extra_files or {}).items():
            _write(step_dir / name, lambda p, src=src: shutil.copyfile(src, p))
        files += [MODEL, OPTIMIZER, TRAINER, CONFIG, *(extra_files or {})]
    _write(step_dir, lambda p: None)  # fsync the directory entries of the new files
    if barrier is not None:
        barrier()  # every rank's files are durable before the commit marker
    if rank == 0:
        files += [_rng_name(r) for r in range(world_size) if r != rank]
        manifest = _manifest_json(step_dir, step, world_size, files)
        _write(step_dir / MANIFEST, lambda p: atomic_write(p, manifest))
        _apply_retention(Path(run_dir), step, keep)
    if barrier is not None:
        barrier()  # no rank returns (and maybe resumes) before the commit
    return step_dir


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _manifest_json(step_dir: Path, step: int, world_size: int, files: list[str]) -> str:
    entries = {}
    for name in sorted(files):
        path = step_dir / name
        if not path.is_file():  # e.g. a rank that failed before the barrier
            raise FileNotFoundError(f"checkpoint save: expected file {path} is missing; not committing")
        entries[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {
        "format": "latte-checkpoint", "format_version": 1, "step": step, "world_size": world_size,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"torch": torch.__version__, "latte": latte.__version__,
                     "python": platform.python_version()},
        "files": entries,
    }
    return json.dumps(manifest, indent=2)


def _step_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every step folder, newest first."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def _apply_retention(run_dir: Path, new_step: int, keep: int) -> None:
    """Called only after `new_step`'s manifest is durable. Deletes complete steps
    beyond the `keep` newest up to `new_step`, and incomplete folders older than
    `new_step`. Folders newer than `new_step` (left by an abandoned timeline)
    are not ours to judge and are left alone."""
    complete = 0
    for step, path in _step_dirs(run_dir):
        if step > new_step:
            continue
        is_complete = (path / MANIFEST).exists()
        complete += is_complete
        if (is_complete and complete > keep) or (not is_complete and step < new_step):
            log.info("checkpoint retention: removing %s", path)
            try:  # the new step is committed: a failed clean-up must not stop training
                if is_complete:  # un-commit first so a crash mid-delete leaves no half 'complete' step
                    os.remove(path / MANIFEST)
                shutil.rmtree(path)
            except OSError as e:
                log.warning("checkpoint retention: could not remove %s: %s", path, e)


# --------------------------------------------------------------------------- load

@dataclasses.dataclass
class Checkpoint:
    """A loaded checkpoint. RNG states are per rank: call `rng_state(rank)`."""

    path: Path
    step: int
    world_size: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict
    trainer_state: dict
    config: dict

    def rng_state(self, rank: int = 0) -> dict[str, torch.Tensor] | None:
        """The RNG state saved by `rank`, or None if the run that saved had no
        such rank (resuming on more ranks than saved: the caller seeds them)."""
        if rank >= self.world_size:
            return None
        return _torch_load(self.path / _rng_name(rank), "cpu")  # RNG states live on the CPU


def _read_manifest(step_dir: Path) -> dict:
    path = step_dir / MANIFEST
    if not path.is_file():
        raise ValueError(f"{step_dir}: no {MANIFEST}, so the save did not complete "
                         "(or this is not a checkpoint)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: unreadable manifest ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not isinstance(manifest.get("step"), int) or not all(
            isinstance(e, dict) and {"size", "sha256"} <= e.keys() for e in files.values()):
        raise ValueError(f"{path}: not a latte manifest (needs 'step' and 'files' with size and sha256)")
    if any("/" in n or "\\" in n or n.startswith(".") for n in files):
        raise ValueError(f"{path}: manifest names a file outside the checkpoint folder")
    return manifest


def verify_checkpoint(step_dir: str | os.PathLike) -> dict:
    """Checks every file's size and sha256 against the manifest; returns the
    manifest or raises one ValueError naming each bad file and why."""
    step_dir = Path(step_dir)
    manifest = _read_manifest(step_dir)
    problems = []
    m = _STEP_RE.match(step_dir.name)
    if m and int(m.group(1)) != manifest["step"]:
        problems.append(f"{MANIFEST}: says step {manifest['step']} but the folder is {step_dir.name}")
    for name, entry in manifest["files"].items():
        path = step_dir / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif (size := path.stat().st_size) != entry["size"]:
            problems.append(f"{path}: {size} bytes but the manifest says {entry['size']} "
                            "(truncated or modified)")
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{path}: sha256 mismatch (corrupted or modified after the save)")
    if problems:
        raise ValueError(f"checkpoint {step_dir} failed verification:\n  " + "\n  ".join(problems))
    return manifest


def _torch_load(path: Path, map_location: Any) -> Any:
    """torch.load restricted to tensors and plain containers: a planted
    pickle payload is refused instead of executed."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # Keep torch's line naming the offending global, drop its advice to
        # retry with weights_only=False (that is exactly what must not happen).
        detail = [line for line in str(e).splitlines() if "GLOBAL" in line or "global" in line]
        raise ValueError(f"{path}: refused: holds Python objects other than tensors and plain data, "
                         f"and unpickling them could run code ({(detail or ['?'])[0].strip()})") from None
    except Exception as e:  # truncated/corrupt zip: RuntimeError, EOFError, OSError, ...
        raise ValueError(f"{path}: cannot be read, truncated or corrupt ({type(e).__name__}: {e})") from None


def _load_other(path: Path, loader: Callable[[Path], Any]) -> Any:
    try:
        return loader(path)
    except Exception as e:
        raise ValueError(f"{path}: cannot be read, truncated or corrupt ({type(e).__name__}: {e})") from None


def load_checkpoint(step_dir: str | os.PathLike, *, verify: bool = True,
                    map_location: str | torch.device = "cpu") -> Checkpoint:
    """Loads a committed checkpoint. With `verify` (default), every file's
    sha256 is checked against the manifest first. Key/shape agreement with a
    model is checked separately by `check_state_against`."""
    step_dir = Path(step_dir)
    manifest = verify_checkpoint(step_dir) if verify else _read_manifest(step_dir)
    model_state = _load_other(step_dir / MODEL, lambda p: read_weights(p, device=map_location))
    return Checkpoint(
        path=step_dir, step=manifest["step"], world_size=manifest.get("world_size", 1),
        model_state=model_state, optimizer_state=_torch_load(step_dir / OPTIMIZER, map_location),
        trainer_state=_load_other(step_dir / TRAINER, lambda p: json.loads(p.read_text(encoding="utf-8"))),
        config=_load_other(step_dir / CONFIG, load_yaml),
    )


def find_latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The highest step folder whose manifest exists and verifies; others are
    skipped with a warning saying why. None if there is no such folder."""
    for _, path in _step_dirs(Path(run_dir)):
        try:
            verify_checkpoint(path)
        except ValueError as e:
            log.warning("skipping checkpoint %s: %s", path, e)
            continue
        return path
    return None


def check_state_against(expected: dict[str, Any], loaded: dict[str, torch.Tensor], *, where: str) -> None:
    """Raises one ValueError listing every missing, unexpected and mismatched
    tensor of `loaded` against `expected` (the check of latte.models.weights)."""
    check_state(expected, loaded, where=where)
