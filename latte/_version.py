"""The package's version, in a module of its own so that any part of latte
can read it without importing the package facade (latte/__init__.py) above it.
Keep it equal to pyproject.toml's `version` (tests/test_package.py checks)."""

__version__ = "0.1.0"
