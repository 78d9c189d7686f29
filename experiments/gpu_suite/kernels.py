"""The compiled-kernel cache of `python -m experiments.gpu_suite --loan`
(docs/gpu.md §5.3): carried back from one loan and in to the next, only
where it can hit. Standard library only: it runs before anything is
installed.

The stages compile into one folder, CACHE (`kernel-cache/` under --pack,
so the device tool returns it as files; under --work without --pack):
Triton's kernels in CACHE/triton (TRITON_CACHE_DIR) and inductor's in
CACHE/inductor (TORCHINDUCTOR_CACHE_DIR). Beside it, `kernel-cache.json`
names the machine that compiled it: the GPU, Triton's and torch's
versions. A later invocation given that pair (--kernels-from DIR, holding
both) copies the cache in only when its own GPU name, Triton version and
torch version are the same (a kernel compiled for another GPU or by
another compiler is never loaded; inductor's cache also depends on torch);
otherwise the stages start from an empty cache and the record says why.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CACHE, RECORD = "kernel-cache", "kernel-cache.json"
KEYS = ("gpu", "triton", "torch")  # what must match for a cache to be carried in


def folder(args) -> Path:
    """Where the stages compile: under --pack (returned with it), else under --work."""
    return Path(args.pack if getattr(args, "pack", None) is not None else args.work) / CACHE


def env(cache: Path) -> dict[str, str]:
    """The variables that send Triton's and inductor's caches into `cache`."""
    return {"TRITON_CACHE_DIR": str(cache / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}


def key_of(machine: dict) -> dict:
    """{gpu, triton, torch} of a probe (machine.probe); None where unknown."""
    pk = machine.get("packages") or {}
    return {
        "gpu": machine.get("gpu_name") or machine.get("gpu"),
        "triton": (pk.get("triton") or {}).get("version"),
        "torch": (pk.get("torch") or {}).get("version"),
    }


def mismatch(recorded: dict | None, here: dict) -> str | None:
    """None when a cache compiled on `recorded` may be used `here`, else why not."""
    if not isinstance(recorded, dict):
        return f"no {RECORD} beside the cache (the machine that compiled it is unknown)"
    for k in KEYS:
        if here.get(k) is None:
            return f"this machine's {k} is unknown"
        if recorded.get(k) != here[k]:
            return f"{k} {recorded.get(k)!r} there, {here[k]!r} here"
    return None


def carry_in(source: Path | None, cache: Path, here: dict) -> dict:
    """Copies SOURCE/kernel-cache into `cache` when SOURCE/kernel-cache.json
    matches `here`; the decision, for the invocation's record."""
    if source is None:
        return {"carried_in": False, "reason": "no --kernels-from"}
    src, rec_path = Path(source) / CACHE, Path(source) / RECORD
    if not src.is_dir():
        return {"carried_in": False, "reason": f"{src}: no such folder"}
    try:
        recorded = json.loads(rec_path.read_text()) if rec_path.exists() else None
    except (OSError, json.JSONDecodeError) as e:
        recorded = None
        print(f"suite: {rec_path}: unreadable ({e}); the cache is not carried in", flush=True)
    why = mismatch(recorded, here)
    if why:
        return {"carried_in": False, "reason": why, "from": recorded}
    if src.resolve() != Path(cache).resolve():
        shutil.copytree(src, cache, dirs_exist_ok=True)
    files = sum(1 for p in Path(cache).rglob("*") if p.is_file())
    return {"carried_in": True, "reason": "GPU, Triton and torch match", "files": files, "from": recorded}


def record(cache: Path, here: dict) -> Path:
    """kernel-cache.json beside `cache`: the machine that compiled it."""
    path = Path(cache).parent / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: here.get(k) for k in KEYS}, indent=2) + "\n")
    return path


def reset(cache: Path) -> None:
    """An empty cache folder (a stale one, compiled elsewhere, moved aside)."""
    cache = Path(cache)
    if cache.exists() and any(cache.iterdir()):
        stale = cache.with_name(cache.name + ".stale")
        shutil.rmtree(stale, ignore_errors=True)
        cache.rename(stale)
    cache.mkdir(parents=True, exist_ok=True)
