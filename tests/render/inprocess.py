"""Run the CLI in-process for the render tests: faster than a subprocess and sees monkeypatched state."""

from __future__ import annotations

import sys

import pytest

from hetrl_cli.cli import main


def hetrl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `hetrl ARGS`."""
    monkeypatch.setattr(sys, "argv", ["hetrl", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
