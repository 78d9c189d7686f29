"""A study of experiments/ run in this process as `python -m` runs it."""

from __future__ import annotations

import importlib

from experiments import COMMANDS, MODULES
from latte.cli import run_command


def study(argv: list[str]) -> int:
    """`python -m experiments.X ARGS` for argv = [NAME, *ARGS] (experiments.MODULES
    names NAME): its main with the exit codes of every latte command."""
    module = importlib.import_module(MODULES[argv[0]])
    return run_command(f"python -m {COMMANDS[argv[0]]}", module.main, argv[1:])
