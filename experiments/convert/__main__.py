"""`python -m experiments.convert [args...]`: runs convert.main (see README.md beside it)."""

import sys

from .convert import main

sys.exit(main(sys.argv[1:]))
