"""`python -m experiments.lra [args...]`: runs lra.main (see README.md beside it)."""

import sys

from .lra import main

sys.exit(main(sys.argv[1:]))
