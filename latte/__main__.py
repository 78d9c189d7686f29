"""`python -m latte <command>` (also what torchrun runs with `-m latte`)."""

import sys

from latte.cli import main

if __name__ == "__main__":
    sys.exit(main())
