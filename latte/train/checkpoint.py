"""Crash-safe checkpoints (docs/reliability.md, "Checkpoints"): saving a step
folder, retention, and reading one back. The folder's layout and its manifest
are train/manifest.py.

Commit protocol: every file is fsynced; a barrier; then rank 0 writes the
manifest (names, sizes, sha256, versions) via tmp + fsync + rename +
directory fsync. A step folder without a manifest that verifies does not
exist as far as resuming is concerned, so ``kill -9`` at any moment leaves the
previous checkpoint as the latest. Step folders are never renamed while
saving (renames of directories broke Hugging Face's trainer on shared
multi-node filesystems).

Verification: nothing is unpickled: ``torch.load(weights_only=True)``, and
DCP's metadata through a restricted unpickler (train/sharded.py).
`verify_checkpoint` checks every file; `load_checkpoint(verify="read")`
checks each file when it is first read, which is what `latte generate` and
`latte eval` use: they read the weights, the config and the tokenizer, so a
damaged optimizer.pt does not stop them.

Retention runs after a commit: it keeps the `keep` newest committed steps
plus the `protect`ed ones (the trainer protects its newest healthy
checkpoint) and removes never-committed folders older than the new step.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from latte.config_io import load_yaml, save_yaml
from latte.files import atomic_write
from latte.models.weights import check_state, read_weights, save_weights
from latte.train.manifest import (
    CONFIG,
    DCP_DIR,
    MANIFEST,
    MODEL,
    NAME_RE,
    OPTIMIZER,
    TRAINER,
    CheckpointError,
    file_problem,
    manifest_json,
    read_manifest,
    rng_name,
    step_dir_name,
    step_dirs,
    step_problem,
    verify_checkpoint,
)
from latte.train.sharded import load_sharded, save_sharded

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- save


def fsync_path(path: Path) -> None:
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
        fsync_path(path)
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


def _write_weights(path: Path, model_state: dict[str, torch.Tensor], step: int) -> None:
    """The package's one weight format (latte.models.weights: tied tensors
    stored once, the umask's ordinary file mode)."""
    _write(path, lambda p: save_weights(model_state, p, metadata={"step": str(step)}))


@dataclass
class Snapshot:
    """What one rank hands `save_checkpoint`: "full" format, rank 0 gives
    `model_state` and `optimizer_state` (other ranks may give None);
    "sharded" format, every rank gives `sharded_state` ({"model": ...,
    "optim": ...} of DTensors), written by torch.distributed.checkpoint."""

    trainer_state: dict  # JSON-serialisable: trainer_state.json (rank 0)
    rng_state: dict[str, torch.Tensor]  # this rank's RNG streams, as tensors
    config: Any  # the resolved run config: config.yaml (rank 0)
    model_state: dict[str, torch.Tensor] | None = None
    optimizer_state: dict | None = None
    sharded_state: dict | None = None
    extra_files: dict[str, str | os.PathLike] | None = None  # the task's files, by name in the folder


@dataclass(frozen=True)
class Ranks:
    """Who saves: this process's `rank` of `world_size`, and the `barrier`
    between them (e.g. ``torch.distributed.barrier``; required when
    world_size > 1: the manifest must be written last)."""

    rank: int = 0
    world_size: int = 1
    barrier: Callable[[], None] | None = None


def _check_inputs(step: int, snapshot: Snapshot, ranks: Ranks, keep: int) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step: got {step!r}, expected an int >= 0")
    if keep < 2:
        raise ValueError(f"keep: got {keep!r}, expected >= 2 (a crash while saving must leave one good checkpoint)")
    if not 0 <= ranks.rank < ranks.world_size:
        raise ValueError(f"rank: got {ranks.rank}, expected 0 <= rank < world_size ({ranks.world_size})")
    bad = [k for k, v in snapshot.rng_state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"rng_state: values must be Tensors (no pickled objects); not tensors: {bad}")
    reserved = {MODEL, OPTIMIZER, TRAINER, CONFIG, MANIFEST, DCP_DIR}
    for name in snapshot.extra_files or {}:
        if not NAME_RE.match(name) or "/" in name or name in reserved or name.startswith("rng-rank"):
            raise ValueError(f"extra_files: {name!r} is not allowed as a checkpoint file name")
    try:
        trainer_json = json.dumps(snapshot.trainer_state, indent=2, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"trainer_state must be JSON-serializable: {e}") from e
    if ranks.world_size > 1 and ranks.barrier is None:
        raise ValueError("barrier is required when world_size > 1 (the manifest must be written last)")
    return trainer_json


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    snapshot: Snapshot,
    *,
    ranks: Ranks = Ranks(),
    keep: int = 2,
    protect: Iterable[int] = (),
    before_commit: Callable[[], None] | None = None,
) -> Path:
    """Saves ``run_dir/step-{step:08d}/`` and returns that path.

    Every rank calls this with its own `snapshot` (its RNG state at least).
    `before_commit` runs on every rank once its files are durable, before
    the commit (the fault hooks act there). Retention runs on rank 0 after
    the manifest commits: it keeps the `keep` newest committed steps and
    every step in `protect`. On an I/O error an OSError names the file; no
    manifest is written.
    """
    trainer_json = _check_inputs(step, snapshot, ranks, keep)
    step_dir = Path(run_dir) / step_dir_name(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    if ranks.rank == 0 and (step_dir / MANIFEST).exists():
        # Re-saving a step (e.g. after resuming from an earlier one): un-commit first.
        os.remove(step_dir / MANIFEST)
        fsync_path(step_dir)
    _write_files(step_dir, step, snapshot, ranks, trainer_json)
    if before_commit is not None:
        before_commit()
    if ranks.barrier is not None:
        ranks.barrier()  # every rank's files are durable before the commit marker
    if ranks.rank == 0:
        fmt = "sharded" if snapshot.sharded_state is not None else "full"
        manifest = manifest_json(step_dir, step, ranks.world_size, fmt, list(snapshot.extra_files or {}))
        _write(step_dir / MANIFEST, lambda p: atomic_write(p, manifest))
        apply_retention(Path(run_dir), step, keep, protect=set(protect))
    if ranks.barrier is not None:
        ranks.barrier()  # no rank returns (and maybe resumes) before the commit
    return step_dir


def _write_files(step_dir: Path, step: int, s: Snapshot, ranks: Ranks, trainer_json: str) -> None:
    """Every file of this rank, each fsynced, then the folder."""
    if s.sharded_state is not None:
        if ranks.rank == 0 and (step_dir / DCP_DIR).exists():
            shutil.rmtree(step_dir / DCP_DIR)  # shards of an uncommitted earlier attempt
        if ranks.barrier is not None:
            ranks.barrier()  # no rank writes shards before the stale ones are gone
    _write(step_dir / rng_name(ranks.rank), _torch_save(dict(s.rng_state)))
    if s.sharded_state is not None:
        save_sharded(s.sharded_state, step_dir / DCP_DIR)
    if ranks.rank == 0:
        _write(step_dir / TRAINER, lambda p: p.write_text(trainer_json, encoding="utf-8"))
        if s.sharded_state is None:
            if s.model_state is None or s.optimizer_state is None:
                raise ValueError("rank 0 needs model_state and optimizer_state (or sharded_state)")
            _write_weights(step_dir / MODEL, s.model_state, step)
            _write(step_dir / OPTIMIZER, _torch_save(s.optimizer_state))
        _write(step_dir / CONFIG, lambda p: save_yaml(s.config, p))
        for name, src in (s.extra_files or {}).items():
            _write(step_dir / name, lambda p, src=src: shutil.copyfile(src, p))
    _write(step_dir, lambda p: None)  # fsync the directory entries of the new files


def apply_retention(run_dir: Path, new_step: int, keep: int, *, protect: set[int] = frozenset()) -> None:
    """Called only after `new_step`'s manifest is durable. Deletes committed
    steps beyond the `keep` newest up to `new_step` (never one in `protect`),
    and never-committed folders (no manifest: a save cut short) older than
    `new_step`. Folders newer than `new_step` are left alone."""
    committed = 0
    for step, path in step_dirs(run_dir):
        if step > new_step:
            continue
        is_committed = (path / MANIFEST).exists()
        committed += is_committed
        if step in protect or not ((is_committed and committed > keep) or (not is_committed and step < new_step)):
            continue
        log.info("checkpoint retention: removing %s", path)
        try:  # the new step is committed: a failed clean-up must not stop training
            if is_committed:  # un-commit first so a crash mid-delete leaves no half 'complete' step
                os.remove(path / MANIFEST)
            shutil.rmtree(path)
        except OSError as e:
            log.warning("checkpoint retention: could not remove %s: %s", path, e)


# --------------------------------------------------------------------------- load


class Checkpoint:
    """A committed checkpoint, read lazily: each file is loaded (and, with
    verify="read", checked against the manifest) on first use, so a command
    reads only what it needs. RNG states are per rank: `rng_state(rank)`."""

    def __init__(self, path: Path, manifest: dict, *, verify_reads: bool, map_location: Any = "cpu"):
        self.path, self.manifest = path, manifest
        self.step: int = manifest["step"]
        self.world_size: int = manifest.get("world_size", 1)
        self.format: str = manifest.get("weights", "full")
        self._verify_reads, self._verified = verify_reads, set()
        self._map_location, self._cache = map_location, {}

    def has(self, name: str) -> bool:
        return name in self.manifest["files"]

    def file(self, name: str) -> Path:
        """The path of a file the manifest lists (checked on first use with
        verify="read"); any other name is refused."""
        if name not in self.manifest["files"]:
            raise CheckpointError(f"{self.path}: {name} is not listed in {MANIFEST}; refusing to read it")
        path = self.path / name
        if self._verify_reads and name not in self._verified:
            problem = file_problem(path, self.manifest["files"][name])
            if problem:
                raise CheckpointError(f"checkpoint {self.path} failed verification:\n  {problem}")
            self._verified.add(name)
        return path

    def _load(self, key: str, loader: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = loader()
        return self._cache[key]

    @property
    def model_state(self) -> dict[str, torch.Tensor]:
        if self.format != "full":
            raise CheckpointError(f"{self.path}: sharded checkpoint; load it with load_sharded")
        return self._load(MODEL, lambda: _read_weights(self.file(MODEL), self._map_location))

    @property
    def optimizer_state(self) -> dict:
        if self.format != "full":
            raise CheckpointError(f"{self.path}: sharded checkpoint; load it with load_sharded")
        return self._load(OPTIMIZER, lambda: _torch_load(self.file(OPTIMIZER), self._map_location))

    @property
    def trainer_state(self) -> dict:
        return self._load(
            TRAINER, lambda: _load_other(self.file(TRAINER), lambda p: json.loads(p.read_text(encoding="utf-8")))
        )

    @property
    def config(self) -> dict:
        return self._load(CONFIG, lambda: _load_other(self.file(CONFIG), load_yaml))

    def rng_state(self, rank: int = 0) -> dict[str, torch.Tensor] | None:
        """The RNG state saved by `rank`, or None if the run that saved had no
        such rank (resuming on more ranks than saved: the caller seeds them)."""
        if rank >= self.world_size:
            return None
        return _torch_load(self.file(rng_name(rank)), "cpu")  # RNG states live on the CPU

    def load_sharded(self, state: dict) -> None:
        """Fills `state` ({"model": ..., "optim": ...}, or only "model") in
        place from the DCP shards, resharding to this process group."""
        if self.format != "sharded":
            raise CheckpointError(f"{self.path}: not a sharded checkpoint")
        names = [n for n in self.manifest["files"] if n.startswith(f"{DCP_DIR}/")]
        for name in names:
            self.file(name)  # verified before DCP reads any of it
        load_sharded(state, self.path / DCP_DIR, listed={n.split("/", 1)[1] for n in names})


def _torch_load(path: Path, map_location: Any) -> Any:
    """torch.load restricted to tensors and plain containers: a planted
    pickle payload is refused instead of executed."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # Keep torch's line naming the offending global, drop its advice to
        # retry with weights_only=False (that is exactly what must not happen).
        detail = [line for line in str(e).splitlines() if "GLOBAL" in line or "global" in line]
        if not detail:  # not a planted object: garbage bytes
            raise CheckpointError(f"{path}: cannot be read, truncated or corrupt (not a torch.save file)") from None
        raise CheckpointError(
            f"{path}: refused: holds Python objects other than tensors and plain data, "
            f"and unpickling them could run code ({detail[0].strip()})"
        ) from None
    except Exception as e:  # truncated/corrupt zip: RuntimeError, EOFError, OSError, ...
        raise CheckpointError(f"{path}: cannot be read, truncated or corrupt ({type(e).__name__}: {e})") from None


def _load_other(path: Path, loader: Callable[[Path], Any]) -> Any:
    try:
        return loader(path)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read, truncated or corrupt ({type(e).__name__}: {e})") from None


def _read_weights(path: Path, map_location: Any) -> dict[str, torch.Tensor]:
    return _load_other(path, lambda p: read_weights(p, device=map_location))


def load_checkpoint(
    step_dir: str | os.PathLike, *, verify: str = "all", map_location: str | torch.device = "cpu"
) -> Checkpoint:
    """Opens a committed checkpoint; files are read when first used.
    verify: "all" checks every file's sha256 now (resuming training);
    "read" checks the step the manifest names against the folder's and the
    (small) trainer state now, and every other file when it is read
    (generation, evaluation: a damaged optimizer.pt does not stop them);
    "none" trusts the files (another rank verified them). The manifest
    itself is always checked. Key/shape agreement with a model is checked
    separately by `check_state_against`."""
    if verify not in ("all", "read", "none"):
        raise ValueError(f"verify: got {verify!r}, expected 'all', 'read' or 'none'")
    step_dir = Path(step_dir)
    manifest = verify_checkpoint(step_dir) if verify == "all" else read_manifest(step_dir)
    ckpt = Checkpoint(step_dir, manifest, verify_reads=verify == "read", map_location=map_location)
    if verify == "read":  # what names the step is checked now, as training checks it (the rest on first read)
        problem = step_problem(step_dir, manifest)
        if problem:
            raise CheckpointError(f"checkpoint {step_dir} failed verification:\n  {problem}")
        ckpt.file(TRAINER)
    return ckpt


def scan_checkpoints(run_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest step folder that verifies or None, [(newer folder, why it
    failed), ...]): the failures are the folders newer than the one found
    (all of them when none verifies)."""
    failed = []
    for _, path in step_dirs(run_dir):
        try:
            verify_checkpoint(path)
        except CheckpointError as e:
            failed.append((path, str(e)))
            continue
        return path, failed
    return None, failed


def find_latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The highest step folder whose manifest exists and verifies; others are
    skipped with a warning saying why. None if there is no such folder."""
    latest, failed = scan_checkpoints(run_dir)
    for path, why in failed:
        log.warning("skipping checkpoint %s: %s", path, why)
    return latest


def check_state_against(expected: dict[str, Any], loaded: dict[str, torch.Tensor], *, where: str) -> None:
    """Raises one ValueError listing every missing, unexpected and mismatched
    tensor of `loaded` against `expected` (the check of latte.models.weights)."""
    check_state(expected, loaded, where=where)


def nonfinite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """'name: 3 NaN, 1 inf of 4096 values' for each floating tensor that holds
    non-finite values (DTensors are checked on their local shard)."""
    out = []
    for name, t in tensors.items():
        t = getattr(t, "_local_tensor", t)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or bool(torch.isfinite(t).all()):
            continue
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        out.append(f"{name}: {nan} NaN, {inf} inf of {t.numel()} values")
    return out


def check_finite(tensors: dict[str, torch.Tensor], *, where: str) -> None:
    """ValueError naming every tensor with NaN or inf values (weights saved
    from a diverged run), instead of a model that only emits garbage."""
    bad = nonfinite_tensors(tensors)
    if bad:
        shown = bad[:10] + ([f"... and {len(bad) - 10} more"] if len(bad) > 10 else [])
        raise ValueError(
            f"{where}: non-finite weights in {len(bad)} tensor{'s' * (len(bad) > 1)} (the run "
            "diverged before this save; use an earlier checkpoint):\n  " + "\n  ".join(shown)
        )
