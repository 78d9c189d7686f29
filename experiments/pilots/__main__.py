"""`python -m experiments.pilots [args...]`: runs study.main (see README.md beside it)."""

import sys

from latte.cli import run_command

from .study import main

sys.exit(run_command("python -m experiments.pilots", main, sys.argv[1:]))
