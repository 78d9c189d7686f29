"""Fixtures for the trainer tests: a small corpus written once per session
and a tiny run config of a few thousand parameters (see runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from latte.config_io import build, merge, parse_overrides
from latte.train.config import LMRunConfig
from tests.train.runs import tiny_config_dict, write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pack-cache")


@pytest.fixture
def make_config(corpus, cache_dir, tmp_path):
    """make_config(run_dir=..., **{"train.steps": 4}) -> LMRunConfig."""

    def make(run_dir: Path | str | None = None, **overrides) -> LMRunConfig:
        data = tiny_config_dict(corpus, Path(run_dir or tmp_path / "run"), cache_dir)
        data = merge(data, parse_overrides([f"{k}={v}" for k, v in overrides.items()]))
        return build(LMRunConfig, data, where="test config")

    return make


def pytest_terminal_summary(terminalreporter):
    """How many real processes the fault tests killed with SIGKILL (each one
    then resumed or was found intact): the count docs/reliability.md quotes."""
    from tests.train.runs import KILLED

    if KILLED:
        terminalreporter.write_line(
            f"fault tests: {len(KILLED)} processes killed with SIGKILL, every checkpoint intact afterwards"
        )
