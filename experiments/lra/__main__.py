"""`python -m experiments.lra [args...]`: runs lra.main (see README.md beside it)."""

import sys

from latte.cli import run_command

from .study import main

sys.exit(run_command("python -m experiments.lra", main, sys.argv[1:]))
