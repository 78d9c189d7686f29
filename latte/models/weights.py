"""The one weight format of the package: a safetensors file, written and read
here for `save_pretrained`, `latte export` and training checkpoints alike.

- Tied (shared) tensors are stored once, under their first name in
  state_dict order (`model.embed.weight`, not `lm_head.weight`), and the
  other names are recorded in the file's metadata (`latte_tied`, JSON
  {alias: stored name}), so `read_weights` gives back every name without the
  model. transformers ignores the extra metadata and re-ties by itself.
- Files are written to a temporary name and renamed into place, with the
  ordinary permissions of the umask (0644 under the usual 022): safetensors
  creates its files 0600, which hides a shared run folder from its readers.
- Names and shapes are checked against the model in one place
  (`check_state`), which lists every problem in one ValueError naming the file;
  nothing is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

WEIGHTS_NAME = "model.safetensors"
TIED_KEY = "latte_tied"  # metadata: JSON {alias name: stored name}


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """{alias: first name} of every state_dict entry that is the same
    parameter or buffer as an earlier one (e.g. a tied LM head)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


def _shared_aliases(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """{alias: first name} of entries of a plain state dict that share storage
    (same memory, offset, shape and dtype) with an earlier one."""
    first: dict[tuple, str] = {}
    aliases = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"state[{name!r}] is {type(t).__name__}, expected a Tensor")
        if t.numel() == 0:
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_weights(
    state: dict[str, torch.Tensor],
    path: str | os.PathLike,
    *,
    aliases: dict[str, str] | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes `state` (name -> tensor) to the safetensors file `path`.

    aliases {alias: stored name}: names to store once; default: the entries
    that share storage (what model.state_dict() gives for tied weights). The
    write goes through a temporary file, fsynced and renamed into place, so
    `path` is either the old file or the complete new one (the caller fsyncs
    the folder when the rename itself must be durable). An I/O failure is an
    OSError naming `path`."""
    path = Path(path)
    aliases = _shared_aliases(state) if aliases is None else dict(aliases)
    for alias, name in aliases.items():
        if name not in state or alias not in state or name in aliases:
            raise ValueError(f"{path}: tied name {alias!r} -> {name!r}: both must be stored names of the state")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k not in aliases}
    meta = {"format": "pt", **(metadata or {})}
    if aliases:
        meta[TIED_KEY] = json.dumps(aliases, sort_keys=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.chmod(tmp, 0o666 & ~_umask())
        fd = os.open(tmp, os.O_RDONLY)
        try:  # durable before it takes the name: a crash never leaves a truncated file under `path`
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except (OSError, SafetensorError) as e:
        tmp.unlink(missing_ok=True)
        if getattr(e, "errno", None) is not None:
            raise OSError(e.errno, f"writing weights failed: {e.strerror or e}", str(path)) from e
        raise OSError(f"{path}: writing weights failed: {e}") from e


def read_weights(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, tied names included (an alias is
    the same tensor object as the name it ties to). A missing or malformed
    file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        tensors = load_file(str(path), device=str(device))
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise ValueError(f"{path}: not a valid safetensors file ({e})") from None
    try:
        aliases = json.loads(meta.get(TIED_KEY, "{}"))
        assert isinstance(aliases, dict)
    except (ValueError, AssertionError):
        raise ValueError(f"{path}: metadata {TIED_KEY!r} is not a JSON object of names") from None
    for alias, name in aliases.items():
        if name not in tensors:
            raise ValueError(f"{path}: tied tensor {alias!r} refers to {name!r}, which the file does not hold")
        tensors[alias] = tensors[name]
    return tensors


def check_state(
    expected: dict[str, Any], loaded: dict[str, torch.Tensor], *, where: str, into: str = "the model"
) -> None:
    """Raises one ValueError listing every missing tensor, unexpected tensor
    and shape mismatch of `loaded` against `expected` (name -> tensor or shape)."""

    def shape(t: Any) -> tuple:
        return tuple(t.shape) if hasattr(t, "shape") else tuple(t)

    problems = [f"missing tensor {k} {shape(v)}" for k, v in expected.items() if k not in loaded]
    problems += [f"unexpected tensor {k} {shape(v)}" for k, v in loaded.items() if k not in expected]
    problems += [
        f"shape mismatch for {k}: file {shape(loaded[k])}, model {shape(v)}"
        for k, v in expected.items()
        if k in loaded and shape(loaded[k]) != shape(v)
    ]
    if problems:
        n = len(problems)
        shown = problems[:30] + ([f"... and {n - 30} more"] if n > 30 else [])
        raise ValueError(f"{where}: {n} problem{'s' * (n != 1)} loading into {into}:\n  " + "\n  ".join(shown))


def load_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Loads the file `path` into `model` after checking every name and shape
    (one ValueError lists all problems). Tied tensors may be stored under
    either name, or both."""
    tensors = read_weights(path)
    aliases = tied_aliases(model)
    for alias, name in aliases.items():
        if name not in tensors and alias in tensors:
            tensors[name] = tensors[alias]  # stored under the other name of the tie
        tensors.pop(alias, None)
    expected = {k: v for k, v in model.state_dict().items() if k not in aliases}
    check_state(expected, tensors, where=str(path), into=type(model).__name__)
    with torch.no_grad():
        for k, v in expected.items():
            v.copy_(tensors[k])
