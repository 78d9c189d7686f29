"""OUT/suite.json of `python -m experiments.gpu_suite`: read (checked) and written, and the
writers named in the marker files of the folders the suite writes
(latte/guard.py). Standard library only (docs/gpu.md §5)."""

from __future__ import annotations

import json
from pathlib import Path

SUITE_WRITER = "latte bench suite"  # the writer in OUT's marker (latte/guard.py)
PACK_WRITER = "latte bench suite --pack"


def load_state(out: Path) -> dict:
    """OUT/suite.json, checked: a damaged or foreign file is a ValueError
    naming it (exit 2), never a traceback."""
    path = Path(out) / "suite.json"
    if not path.exists():
        return {"stages": {}, "invocations": []}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); the suite writes it whole: move it away") from None
    ok = (
        isinstance(state, dict) and isinstance(state.get("stages"), dict) and isinstance(state.get("invocations"), list)
    )
    if ok:
        ok = all(isinstance(r, dict) and isinstance(r.get("status"), str) for r in state["stages"].values())
        ok = ok and all(isinstance(i, dict) for i in state["invocations"])
    if ok:  # the fields the runner computes with (a string or NaN wall time: exit 2 naming the file)
        from experiments.common.cells import check_fields  # standard library at import

        for rec in state["stages"].values():
            check_fields(rec, path)
    if not ok:
        raise ValueError(
            f'{path}: not a suite record (expected an object with "stages": {{name: {{"status": ...}}}} and '
            f'"invocations": [...]), got {json.dumps(state)[:80]}; move it away'
        )
    return state


def save_state(out: Path, state: dict) -> None:
    from latte.files import atomic_write  # standard library only

    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(out) / "suite.json", json.dumps(state, indent=2) + "\n")
