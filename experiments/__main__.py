"""`python -m experiments NAME [args...]`: the experiment NAME (see experiments/__init__.py)."""

import importlib
import sys

from experiments import COMMANDS, EXPERIMENTS, MODULES
from latte.cli import run_command

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in MODULES:
        print(f"usage: python -m experiments NAME [args...]\nexperiments: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        sys.exit(0 if argv[:1] in (["-h"], ["--help"]) else 2)
    main = importlib.import_module(MODULES[argv[0]]).main
    sys.exit(run_command(f"python -m {COMMANDS[argv[0]]}", main, argv[1:]))
