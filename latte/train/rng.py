"""Random number generator state as tensors, so a checkpoint restores it
without unpickling anything (docs/reliability.md: per-rank RNG, weights_only)."""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def capture_rng_state() -> dict[str, torch.Tensor]:
    """torch CPU (and CUDA) RNG, Python `random` and numpy's global RNG, all as
    tensors so that loading never needs to unpickle. Generators created with
    `np.random.default_rng` or `torch.Generator` are the caller's to save."""
    py_version, py_state, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "python_state": torch.tensor([py_version, *py_state], dtype=torch.int64),
        "python_gauss": torch.tensor([py_gauss is not None, py_gauss or 0.0], dtype=torch.float64),
        "numpy_keys": torch.from_numpy(np_keys.astype(np.int64)),
        "numpy_pos": torch.tensor([np_pos, np_has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor(np_gauss, dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: dict[str, torch.Tensor]) -> None:
    """Inverse of `capture_rng_state`; keys that are absent are left alone."""
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "python_state" in state:
        version, *mt = state["python_state"].tolist()
        has_gauss, gauss = state["python_gauss"].tolist()
        random.setstate((version, tuple(mt), gauss if has_gauss else None))
    if "numpy_keys" in state:
        pos, has_gauss = state["numpy_pos"].tolist()
        keys = state["numpy_keys"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, pos, has_gauss, float(state["numpy_gauss"])))
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(list(state["cuda"].cpu()))
        else:
            log.warning(
                "CUDA RNG not restored: saved for %d devices, %d visible", len(state["cuda"]), torch.cuda.device_count()
            )
