"""Fixtures of the runtime tests: the tiny model built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model (seed 0), built once; tests must not modify it."""
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    return ensure_tiny(tmp_path_factory.mktemp("models"), seed=0)
