"""`python -m experiments.lm_variants [args...]`: runs lm_variants.main (see README.md beside it)."""

import sys

from latte.cli import run_command

from .study import main

sys.exit(run_command("python -m experiments.lm_variants", main, sys.argv[1:]))
