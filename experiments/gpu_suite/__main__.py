"""`python -m experiments.gpu_suite [args...]`: the GPU suite (stages.main; see README.md beside it)."""

import sys

from .stages import main

sys.exit(main(sys.argv[1:]))
