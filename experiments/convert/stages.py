"""The budget of `python -m experiments.convert`'s stages (study.py), and
the protocol the conversion studies' own sweeps record (`checks`: the
pilots' cells)."""

from __future__ import annotations

from experiments.common.cells import INPUTS, run_protocol

CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
# budgets of the stages, sized from measured costs to fit about four hours
# on 2 threads (docs/evaluation.md §7.4)
DOCUMENTS = 2  # held-out documents of --data
TASK_EXAMPLES = 100
NEEDLE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
NEEDLE_TRIALS = 1


def checks(a, fields=(), extra=None) -> dict:
    """cells.Sweep's checks of a stage: the protocol every cell records (the
    runs' config, --set overrides and resolved config; the sha256 of every
    input: the base model's files, data files, the converted model's
    checkpoint once opened (a.inputs); plus `extra(cell)`: the stage's own
    settings, whose `inputs` add to the others) and the fields its record holds."""

    def protocol(cell: dict) -> dict:
        own = dict(extra(cell)) if extra else {}
        base = run_protocol(a.config, a.set)
        inputs = {**base[INPUTS], **getattr(a, "inputs", {}), **own.pop(INPUTS, {})}
        return {**base, **own, INPUTS: inputs}

    return dict(protocol=protocol, fields=fields, folder_flag="--runs")
