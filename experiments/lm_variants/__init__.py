"""The paper's per-variant language-model table (README.md beside this file)."""
