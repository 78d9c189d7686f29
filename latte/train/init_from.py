"""A new run whose weights start from another run's (`train.init_from`):
the model is built from the new run's own config, then the weights of a
checkpoint (a step folder, or a run folder's newest verified step) or of
an exported model folder (the task's format: `Task.init_state`) are loaded
into it strictly: every trained tensor, same names and shapes, else an
error naming the folder and the tensors. The optimizer, the learning-rate
schedule, the data position and the step count start fresh. It applies to
a fresh start only: a run resumed from its own checkpoint never loads
init_from again over its weights.

The weight files read are inputs of the run (docs/reliability.md §2):
named "init_from:<file>" in RUN_DIR/inputs.json with their sha256, so that
resuming the new run after they changed is refused as for a changed
corpus. `latte eval` of the new run does not compare them (it never reads
them).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from latte.train.checkpoint import Checkpoint, check_finite, check_state_against, load_checkpoint, scan_checkpoints
from latte.train.inputs import INIT
from latte.train.manifest import DCP_DIR, MANIFEST, MODEL, CheckpointError, read_manifest
from latte.train.runs import load_weights

EXPORT_FILES = ("config.json", "model.safetensors")  # what marks an exported model folder
FIELD = "train.init_from"


def resolve_init(value: str) -> Path:
    """The folder `value` names: a step folder (its manifest), an exported
    model folder (config.json + model.safetensors) or a run folder (its
    newest verified step); a ValueError naming the field and the path
    otherwise."""
    path = Path(value).expanduser()
    if (path / MANIFEST).is_file() or all((path / n).is_file() for n in EXPORT_FILES):
        return path
    if not path.is_dir():
        raise ValueError(
            f"{FIELD}={value!r}: no such folder (or not a folder); expected a step folder, a run folder (its "
            "newest verified checkpoint) or an exported model folder"
        )
    found, failed = scan_checkpoints(path)
    if found is None:
        why = "".join(f"\n  {p.name}: {w.splitlines()[-1].strip()}" for p, w in failed)
        raise ValueError(
            f"{FIELD}={value!r}: {path} holds no verified checkpoint (step-*/{MANIFEST}) and is not an exported "
            f"model folder ({' + '.join(EXPORT_FILES)}){why}"
        )
    return found


def check_resumed(saved: dict, value: str, where: Path) -> None:
    """Resuming with init_from set: the run resumed (its checkpoint `where`
    and saved config `saved`) must be one that started from the same
    folder, else a ValueError; a forgotten train.run_dir would otherwise
    resume (and write into) the run that init_from names, or another."""
    then = (saved.get("train") or {}).get("init_from") if isinstance(saved, dict) else None
    if then is None or _resolved(then) != _resolved(value):
        began = f"train.init_from={then}" if then else "the task's own initialisation"
        raise ValueError(
            f"{FIELD}={value!r}: train.run_dir holds a run that did not start from it ({where} started from "
            f"{began}); give the new run its own train.run_dir (a resumed run "
            "never loads init_from again)"
        )


def _resolved(value: str) -> Path:
    try:
        return resolve_init(value).resolve()
    except ValueError:  # gone: compared by name (the record of inputs says what changed)
        return Path(value).expanduser().resolve()


def init_files(value: str | None) -> dict[str, Path]:
    """{"init_from:<file>": path} of the weight files `value` names, for the
    run's record of inputs ({} when it is None). A path that does not
    resolve (any more) is named as it is, so comparing a record reports
    it missing instead of failing here."""
    if not value:
        return {}
    try:
        folder = resolve_init(value)
    except ValueError:
        return {f"{INIT}{MODEL}": Path(value).expanduser() / MODEL}
    if not (folder / MANIFEST).is_file():
        return {f"{INIT}{n}": folder / n for n in EXPORT_FILES}
    try:
        manifest = read_manifest(folder)
    except CheckpointError:
        return {f"{INIT}{MODEL}": folder / MODEL}
    names = [n for n in manifest["files"] if n == MODEL or n.startswith(f"{DCP_DIR}/")]
    return {f"{INIT}{n}": folder / n for n in sorted(names)}


def load_init(model: nn.Module, task, value: str) -> Path:
    """Loads the weights `value` names into the plain (unwrapped) `model`
    of `task`, strictly over `task.checkpoint_keys(model)`; returns the
    folder read. The task checks first that the weights belong to the
    same starting point (`Task.check_init`: a conversion's base)."""
    folder = resolve_init(value)
    keys = task.checkpoint_keys(model)
    expected = {k: v for k, v in model.state_dict().items() if keys is None or k in keys}
    if not (folder / MANIFEST).is_file():
        task.check_init(folder, None)
        state, where = task.init_state(folder), f"{FIELD}={value!r}: {folder / EXPORT_FILES[1]}"
    else:
        ckpt = load_checkpoint(folder, verify="read")  # every file it reads is checked against the manifest
        _same_task(ckpt, task, value)
        task.check_init(folder, ckpt)
        if ckpt.format != "full":
            load_weights(model, ckpt, keys)  # DCP shards, checked there as `latte generate` checks them
            return folder
        state, where = ckpt.model_state, f"{FIELD}={value!r}: {folder / MODEL}"
    _load_state(model, expected, state, where=where, strict=keys is None)
    return folder


_HINT = (
    "the new run's model must hold the same trained tensors as the one it starts from (memory slots add none; "
    "a changed latents_per_head, lora_rank, qk_mixer or model size does)"
)


def _same_task(ckpt: Checkpoint, task, value: str) -> None:
    saved = ckpt.config.get("task", "lm") if isinstance(ckpt.config, dict) else None
    if saved != task.cfg.task:
        raise ValueError(
            f"{FIELD}={value!r}: {ckpt.path} was trained with task {saved!r}, this run is {task.cfg.task!r}"
        )


def _load_state(model: nn.Module, expected: dict, state: dict, *, where: str, strict: bool) -> None:
    try:
        check_state_against(expected, state, where=where)
    except ValueError as e:
        raise ValueError(f"{e}\n{_HINT}") from None
    check_finite(state, where=where)
    model.load_state_dict(state, strict=strict)
