"""Sharded checkpoints under FSDP2: torch.distributed.checkpoint (DCP).

With `train.checkpoint_format: sharded` (the default under FSDP2) every rank
writes its own shards of the weights and optimizer moments into
``step-N/dcp/`` (one ``__{rank}_0.distcp`` file per rank plus DCP's
``.metadata``), so no rank ever holds the full state. The files live inside
the usual step folder and the usual commit protocol (train/checkpoint.py,
train/manifest.py):
the manifest, written last by rank 0, lists the size and sha256 of every
shard. DCP reshards on load, so a checkpoint saved by N ranks resumes on any
number of ranks, or in a single process (`latte generate`, `latte eval`).

DCP stores its metadata with pickle. A checkpoint folder is untrusted input,
so the metadata is read here with an unpickler that admits only DCP's own
metadata classes, torch.Size, dtypes and paths: a planted payload is refused,
never executed. The shard files the metadata points to must all be listed in
the manifest (so each was checked before it is read).
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from latte.train.manifest import CheckpointError

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED_FUNCTIONS = {("torch.serialization", "_get_layout")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_FUNCTIONS or (module, name) in (("torch", "Size"), ("pathlib", "PosixPath")):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _DCP_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type):  # classes (dataclasses, enums) only: no functions to call
                return obj
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in checkpoint metadata")


class _SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata is unpickled with `_MetadataUnpickler`
    and whose shard files must be among `listed`."""

    def __init__(self, path: Path, listed: set[str]):
        super().__init__(str(path))
        self._folder, self._listed = path, listed

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._folder / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise CheckpointError(f"{path}: refused: {e} (unpickling it could run code)") from None
        except Exception as e:
            raise CheckpointError(f"{path}: cannot be read, truncated or corrupt ({type(e).__name__}: {e})") from None
        files = {getattr(info, "relative_path", None) for info in (metadata.storage_data or {}).values()}
        unlisted = sorted(str(f) for f in files - self._listed)
        if unlisted:
            raise CheckpointError(f"{path}: points to shard files the manifest does not list: {unlisted}")
        return metadata


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, keys: set[str] | None = None) -> dict:
    """{"model": ..., "optim": ...} as DTensor shards (FSDP2) keyed by
    parameter name; `keys` restricts the model entries (a task that saves
    only its trainable weights). Collective under FSDP2."""
    model_sd = get_model_state_dict(model)
    if keys is not None:
        model_sd = {k: v for k, v in model_sd.items() if k in keys}
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    return state


def apply_sharded_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict, *, strict: bool = True
) -> None:
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=strict))
    if optimizer is not None and "optim" in state:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def save_sharded(state: dict, folder: Path) -> None:
    """Collective: every rank writes its shards into `folder` (fsynced)."""
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True))
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise OSError(f"checkpoint save failed writing the shards in {folder}: {e}") from e


def load_sharded(state: dict, folder: Path, *, listed: set[str]) -> None:
    """Fills `state` in place from the shards in `folder`, resharding to the
    current process group (or one process when none is initialised)."""
    try:
        with warnings.catch_warnings():  # one process without a process group is intended here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=_SafeReader(folder, listed))
    except CheckpointError:
        raise
    except BaseException as e:  # CheckpointException wraps each rank's failure
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        inner = _first_value_error(e)
        if inner is not None:
            raise inner from None
        raise CheckpointError(f"{folder}: cannot load the sharded checkpoint ({type(e).__name__}: {e})") from None


def _first_value_error(e: BaseException) -> ValueError | None:
    """DCP wraps a rank's ValueError (e.g. a refused metadata file) in a
    CheckpointException holding {rank: (exception, traceback)}."""
    failures = getattr(e, "failures", None) or {}
    for value in failures.values():
        err = value[0] if isinstance(value, tuple) else value
        if isinstance(err, ValueError):
            return err
    return None
