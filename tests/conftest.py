"""Shared test fixtures: run the real `hetrl` CLI as a subprocess, and a real sshd with three hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # so tests can `import sshd`

from sshd import SshdHosts, skip_reason, start_sshd

HETRL = str(Path(sys.executable).with_name("hetrl"))
REPO = Path(__file__).resolve().parent.parent


def hetrl_env(**extra: str) -> dict[str, str]:
    """The environment for CLI subprocesses: quick probe benchmarks, no terminal (so no progress display)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    env.update({"HETRL_PROBE_QUICK": "1", "COLUMNS": "200"}, **extra)
    return env


def run_hetrl(
    *args: str | Path, stdin: str | None = None, cwd: Path | None = None, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run `hetrl ARGS` for real and capture both streams."""
    return subprocess.run(
        [HETRL, *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env=hetrl_env(**env),
    )


@pytest.fixture
def hetrl() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`hetrl(*args, stdin=, cwd=, **env)`: the real CLI in a subprocess (a fixture, because test modules
    cannot import from conftest reliably when sub-folders have their own conftest.py)."""
    return run_hetrl


@pytest.fixture(scope="session")
def sshd_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdHosts]:
    """sshd on 127.0.0.2/.3/.4 for the whole session (skipped, with the reason, when not root or no sshd)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with start_sshd(tmp_path_factory.mktemp("sshd")) as hosts:
        yield hosts
