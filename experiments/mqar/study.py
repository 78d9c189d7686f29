"""`python -m experiments.mqar`: the MQAR study's command (README.md beside
this file). It parses the options (sweep.parse_args) and runs the sweep
(sweep.py) or, with --memory or --memory-slots, the memory-slot variant
(memory.py, which builds on sweep.py)."""

from __future__ import annotations

import time

from .memory import memory_main
from .sweep import parse_args, sweep_main


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    started = time.time()
    if a.memory or a.memory_slots:
        return memory_main(a, argv, started)
    return sweep_main(a, argv, started)
