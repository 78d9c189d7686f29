"""`python -m experiments.lm_variants [args...]`: runs lm_variants.main (see README.md beside it)."""

import sys

from .lm_variants import main

sys.exit(main(sys.argv[1:]))
