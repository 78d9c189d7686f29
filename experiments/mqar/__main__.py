"""`python -m experiments.mqar [args...]`: runs study.main (see README.md beside it)."""

import sys

from latte.cli import run_command

from .study import main

sys.exit(run_command("python -m experiments.mqar", main, sys.argv[1:]))
