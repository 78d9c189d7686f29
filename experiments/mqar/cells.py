"""The cell files of `python -m experiments.mqar`: what names a cell, reading
cells written before seeds existed, and rebuilding a work folder from the
published results.

A cell is (setting, model, width, latents, lr) plus the protocol fields that
issue 27 added: the training `seed` (model init and batch order; the data
are the same for every seed) and `max_epochs`. Cells written before those
fields existed ran seed 0 for 3 epochs; a cell at those values keeps the file
name it had, so old work folders stay readable and are never rerun, and their
records are read as seed 0, 3 epochs. More protocol fields can be added the
same way: a default here, omitted from the file name at that default.

`restore_cells` writes a work folder's cell files back from a results folder
(results.json + step_times.json), so the report, which is regenerated from
cell files, can be rebuilt and extended on a machine that never held the
original work folder. Each restored cell records the protocol of the command
that published the results (its run.json), checked against what the record
itself states (its data sizes and fillers): the proof cells.Sweep needs to
reuse it (docs/reliability.md §8).
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.common.cells import PROTOCOL, cell_key, describe, protocol_difference, read_cell, read_json
from latte.files import atomic_write

SETTING_FIELDS = ("seq_len", "num_kv_pairs", "model", "dim", "num_latents", "lr")
# Protocol fields with the value every cell had before the field existed.
LEGACY = {"seed": 0, "max_epochs": 3}
CELL_FIELDS = SETTING_FIELDS + tuple(LEGACY)
# results.json summarises these per-run series (report.flat_records); step_times.json holds them whole.
SERIES = ("interval_ms_per_step", "interval_cpu_ms_per_step", "epoch_train_seconds", "accuracy_curve")
DERIVED = (
    "ms_per_step_first_interval",
    "ms_per_step_last_interval",
    "cpu_ms_per_step_first_interval",
    "cpu_ms_per_step_last_interval",
)


def cell_file_key(cell: dict) -> str:
    """The cell's file name: its fields, without those at their legacy value."""
    return cell_key({k: v for k, v in cell.items() if k not in LEGACY or v != LEGACY[k]})


def with_protocol(record: dict) -> dict:
    """The record with every protocol field (a legacy record gets seed 0 and 3
    epochs), placed after lr, where the cell's own fields end."""
    missing = {p: d for p, d in LEGACY.items() if p not in record}
    if not missing:
        return record
    out = {}
    for k, v in record.items():
        out[k] = v
        if k == "lr":
            out.update(missing)
    return {**out, **missing} if "lr" not in record else out


def cell_of(record: dict) -> dict:
    return {k: v for k, v in with_protocol(record).items() if k in CELL_FIELDS}


def _series_key(record: dict) -> tuple:
    return tuple(cell_of(record)[k] for k in CELL_FIELDS)


def _cell_records(path: Path) -> list[dict]:
    """The records of a results.json or step_times.json, each naming its cell."""
    records = read_json(path, list)
    for i, r in enumerate(records):
        missing = [k for k in SETTING_FIELDS if k not in r] if isinstance(r, dict) else list(SETTING_FIELDS)
        if missing:
            raise ValueError(f"{path}: record {i} is not an MQAR cell record (no {', '.join(missing)})")
    return records


def restore_cells(results_dir: str | Path, work_dir: str | Path, protocol=None) -> int:
    """Write `work_dir/cells/<key>.json` for every record of
    `results_dir/results.json` whose cell file is missing, with its per-run
    series from step_times.json put back; returns how many were written. A
    cell file already there is kept (it may hold a newer run of the cell).
    `protocol(cell) -> dict`: the protocol of the command that published the
    results, recorded in each cell after checking the fields the record
    states itself (a record that contradicts it is a ValueError)."""
    results_dir, cells = Path(results_dir), Path(work_dir) / "cells"
    path = results_dir / "results.json"
    if not path.is_file():
        raise ValueError(f"--restore-from {results_dir}: no results.json there")
    times = results_dir / "step_times.json"
    series = {_series_key(s): s for s in (_cell_records(times) if times.is_file() else [])}
    written = 0
    for flat in _cell_records(path):
        record = {k: v for k, v in flat.items() if k not in DERIVED}
        whole = series.get(_series_key(flat))
        if whole is not None:
            record.update({k: whole[k] for k in SERIES if k in whole})
        target = cells / f"{cell_file_key(cell_of(record))}.json"
        if target.is_file():
            continue
        if protocol is not None:
            record[PROTOCOL] = protocol(cell_of(record))
            diff = protocol_difference(legacy_protocol(record), record[PROTOCOL])
            stated = {k: v for k, v in diff.items() if v[0] != "<not recorded>"}
            if stated:
                raise ValueError(
                    f"{path}: the record of {cell_file_key(cell_of(record))} contradicts the protocol of the "
                    f"command in {results_dir / 'run.json'} ({describe(stated, 'in the record', 'command')}); "
                    "nothing restored from it"
                )
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, json.dumps(record, indent=1) + "\n")
        written += 1
    return written


def legacy_protocol(record: dict) -> dict:
    """The part of the protocol a record states in its own fields: its data
    sizes and fillers (restore_cells checks them against the command's)."""
    named = {"train_examples": "examples", "test_examples": "test_examples", "fillers": "fillers"}
    return {p: record[f] for p, f in named.items() if f in record}


def other_protocol_records(sweep, planned: list[dict]) -> list[dict]:
    """Finished cells of the sweep's work folder that differ from a planned
    cell only in their protocol fields (another seed, other epochs): the
    report shows them beside the plan's own, so a report-only command over
    the standard plan includes the extra seeds run by narrower commands.
    Each is checked like the plan's own cells (sweep.read: a readable cell
    file of the sweep's data and budget)."""
    settings = {tuple(c[k] for k in SETTING_FIELDS) for c in planned}
    keys = {cell_file_key(c) for c in planned}
    extra = []
    for path in sorted((Path(sweep.work) / "cells").glob("*.json")):
        if path.stem in keys:
            continue
        record = with_protocol(read_cell(path))
        if tuple(record.get(k) for k in SETTING_FIELDS) in settings:
            sweep.read(path)  # the same checks as the plan's cells
            extra.append({k: v for k, v in record.items() if k != PROTOCOL})
    return extra
