"""`python -m experiments.mqar [args...]`: runs mqar.main (see README.md beside it)."""

import sys

from .mqar import main

sys.exit(main(sys.argv[1:]))
