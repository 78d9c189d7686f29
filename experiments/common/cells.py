"""The one reuse rule of every sweep (docs/reliability.md §8): mqar,
lm-variants, lra, convert and its stages, convert-sinks,
convert-recipes-v3 (the retrieval stage's cells, per pilot), the
GPU suite's stages (experiments/gpu_suite/runner.py) and any future one.
The rule itself (cells, protocols, inputs' sha256, field rules, `Sweep`) is
the package's, latte/eval/cells.py, shared with `latte eval`; this module
adds what training sweeps need and re-exports the rest.

A run folder a sweep trains into (lm-variants, lra, convert runs) is never
resumed or reused under another configuration or other inputs:
`set_aside_changed_run` compares the folder's saved config.yaml with the
command's resolved config, and its record of inputs (inputs.json) with the
files the command's run reads, and when anything differs renames the folder to `NAME.set-aside-N` (nothing deleted) so
the run starts over. `finished_summary` gives a run folder's summary.json
when the run already reached its last step (a sweep killed between a run's
end and its cell write then rebuilds the cell without training again).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

# the generic reuse rule lives in the package (latte eval runs it too); these
# names are re-exported for the sweeps
from latte.eval import (  # noqa: F401
    COUNT,
    FIELD_RULES,
    FRACTION,
    INPUTS,
    NONNEG,
    NOT_PROTOCOL,
    NOT_RECORDED,
    POSITIVE,
    PROTOCOL,
    ProtocolMismatch,
    Sweep,
    cell_key,
    check_fields,
    describe,
    digest_or_missing,
    file_digest,
    input_digest,
    protocol_difference,
    protocol_sets,
    read_cell,
    read_json,
)


def resolved_config(config: str, sets: Iterable[str]) -> dict:
    """The run config `latte train --config CONFIG --SET...` resolves to, flat
    ("section.field": value), without the NOT_PROTOCOL fields."""
    # optional at import: the GPU suite imports this module before yaml and torch are installed
    from latte.train import flatten, load_run_config, to_dict

    cfg = to_dict(load_run_config(config, [f"--{s.lstrip('-')}" for s in sets]))
    return {k: v for k, v in flatten(cfg).items() if k not in NOT_PROTOCOL}


# The config fields a run reads a file or folder from when their value names
# one (each also takes names: a named source, "bpe", "smollm2", "auto"). Only
# these are inputs: any other string field holds a name (a mixer, a norm, a
# task) even where a folder of that name happens to sit in the working
# directory (model.mixer=latte beside the repository's latte/ package once
# made every Latte cell's protocol depend on the package's source).
PATH_FIELDS = ("data.source", "data.tokenizer", "data.path", "base.path", "train.resume")


def config_inputs(flat: dict) -> dict:
    """{field: input_digest} for every PATH_FIELDS field of a resolved config
    that names an existing file or folder (data files, a tokenizer, a base
    model, a checkpoint to resume from)."""
    out = {}
    for k, v in flat.items():
        if k in PATH_FIELDS and isinstance(v, str) and v and Path(v).exists():
            out[k] = input_digest(v)
    return out


def run_protocol(config: str, sets: Iterable[str]) -> dict:
    """The protocol of a training cell: the config named, the overrides, the
    resolved config and the sha256 of the files it reads."""
    sets = list(sets)
    flat = resolved_config(config, sets)
    return {"config": config, "sets": protocol_sets(sets), "resolved": flat, INPUTS: config_inputs(flat)}


# --------------------------------------------------------------------------- run folders


def set_aside(path: Path) -> Path:
    """Rename `path` (a file or folder) to the first free `NAME.set-aside-N`,
    deleting nothing; returns the new name."""
    n = 1
    while path.with_name(f"{path.name}.set-aside-{n}").exists():
        n += 1
    target = path.with_name(f"{path.name}.set-aside-{n}")
    path.rename(target)
    return target


def set_aside_changed_run(run_dir: str | Path, config: str, sets: Iterable[str]) -> Path | None:
    """When `run_dir` holds a run whose saved config.yaml differs from what
    `config` + `sets` resolve to (NOT_PROTOCOL fields aside), or whose
    recorded inputs (inputs.json, latte/train/inputs.py) are not the files
    the command's run would read now (`run_input_changes`), rename it to
    `NAME.set-aside-N` (nothing is deleted) so the command's run starts
    over, and say so. Returns the new name, or None when nothing was moved."""
    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    if saved.is_file():
        # optional at import: the GPU suite reads cells before yaml exists
        from latte.train import build_run_config, flatten, load_yaml, to_dict

        try:  # built as the trainer reads it, so older keys map to today's (model.num_latents)
            built = to_dict(build_run_config(load_yaml(saved), where=str(saved)))
            then = {k: v for k, v in flatten(built).items() if k not in NOT_PROTOCOL}
        except ValueError:
            then = {}
        diff = protocol_difference(then, resolved_config(config, sets)) or run_input_changes(run_dir, config, sets)
    else:
        diff = {"config.yaml": (NOT_RECORDED, "the command's")}
    if not diff:
        return None
    target = set_aside(run_dir)
    print(
        f"{run_dir}: its run has another configuration or other inputs than this command's "
        f"({describe(diff, 'in the run', 'now')}); it is never resumed under the new one: set aside as {target} "
        "(nothing deleted), starting over",
        file=sys.stderr,
    )
    return target


def run_input_changes(run_dir: Path, config: str, sets: Iterable[str]) -> dict:
    """{field: (in the run, now)} for each input the run records
    (inputs.json) that is not the file the command's run reads now (sha256
    compared where size or mtime differ; the derived token caches left out),
    for changed inputs the run accepted when it resumed, and for a run that
    holds checkpoints or a summary but records no inputs (trained before runs
    recorded them: its data cannot be proven the same). Empty: the same."""
    from latte.train import DERIVED, RECORD, DistEnv, compare, load_run_config, read_record, task_class

    try:
        record = read_record(run_dir)
    except ValueError as e:
        return {RECORD: (str(e).split(";")[0], "a readable record")}
    if record is None:
        holds = any(run_dir.glob("step-*")) or (run_dir / "summary.json").is_file()
        return {"inputs": (NOT_RECORDED, "the command's inputs")} if holds else {}
    cfg = load_run_config(config, [f"--{s.lstrip('-')}" for s in sets])
    files = task_class(cfg.task)(cfg, DistEnv()).input_files()
    changes, _ = compare({k: v for k, v in record["inputs"].items() if not k.startswith(DERIVED)}, files)
    diff = {f"inputs.{name}": values for name, values in changes.items()}
    if record.get("accepted"):
        steps = ", ".join(str(a.get("step")) for a in record["accepted"])
        diff["inputs.accepted"] = (f"changed inputs accepted when resuming at step {steps}", "none")
    return diff


def finished_summary(run_dir: str | Path, steps: int) -> dict | None:
    """The run folder's summary.json when the run reached `steps` and ended
    with its final evaluation (not stopped early); else None."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        s = read_cell(path)
    except ValueError:
        return None
    return s if s.get("step") == steps and not s.get("stopped") else None
