"""`python -m experiments.convert [args...]`: runs study.main (see README.md beside it)."""

import sys

from latte.cli import run_command

from .study import main

sys.exit(run_command("python -m experiments.convert", main, sys.argv[1:]))
