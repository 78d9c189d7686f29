"""`python -m experiments.gpu_suite [args...]`: the GPU suite (stages.main; see README.md beside it)."""

import sys

from latte.cli import run_command

from .stages import main

sys.exit(run_command("python -m experiments.gpu_suite", main, sys.argv[1:]))
