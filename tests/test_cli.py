"""The CLI contract: version, help, one-line errors with the documented exit codes, no heavy imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.cli import parse_duration
from hetrl_cli.errors import BadInput


def test_version_prints_package_version(hetrl) -> None:
    from hetrl_cli import __version__

    result = hetrl("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"hetrl {__version__}"


def test_help_lists_every_stage_and_examples(hetrl) -> None:
    result = hetrl("--help")
    assert result.returncode == 0
    for command in ("profile", "plan", "show", "run", "simulate"):
        assert command in result.stdout
    assert "hetrl plan profiles/lab.json -o - | hetrl show -" in result.stdout


def test_cli_import_pulls_in_no_heavy_library() -> None:
    probe = (
        "import sys, hetrl_cli.cli; "
        "print(sorted(m for m in ('torch','highspy','fabric','paramiko') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("2m", 120.0), ("500ms", 0.5), ("1h", 3600.0), ("7", 7.0), (" 1.5s ", 1.5)],
)
def test_parse_duration_accepts_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-5s", "0s", "5 parsecs"])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(BadInput, match="bad duration"):
        parse_duration(text)


def test_missing_file_is_one_line_exit_2(hetrl, tmp_path: Path) -> None:
    result = hetrl("show", str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"hetrl: error: {tmp_path / 'nope.json'}: no such file"
    assert "Traceback" not in result.stderr


def test_unknown_solver_is_exit_2(hetrl, tmp_path: Path) -> None:
    result = hetrl("plan", "x.json", "--solver", "magic", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("hetrl: error: unknown solver 'magic'")


def test_plan_without_profiles_says_what_to_do(hetrl, tmp_path: Path) -> None:
    result = hetrl("plan", cwd=tmp_path)
    assert result.returncode == 2
    assert "run 'hetrl profile hosts.txt' first" in result.stderr


def test_profile_needs_hosts_or_catalog(hetrl, tmp_path: Path) -> None:
    result = hetrl("profile", cwd=tmp_path)
    assert result.returncode == 2
    assert "missing hosts file" in result.stderr


def test_usage_error_is_exit_2(hetrl) -> None:
    result = hetrl("plan", "--no-such-flag")
    assert result.returncode == 2
    assert "No such option" in result.stderr


def test_debug_flag_shows_traceback(hetrl, tmp_path: Path) -> None:
    result = hetrl("--debug", "show", str(tmp_path / "nope.json"))
    assert result.returncode != 0
    assert "Traceback" in result.stderr


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    import os
    import signal
    import time

    # `hetrl show -` blocks reading stdin: interrupt it there, as a user pressing Ctrl-C would.
    hetrl = str(Path(sys.executable).with_name("hetrl"))
    proc = subprocess.Popen([hetrl, "show", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip().endswith("hetrl: interrupted")
    assert "Traceback" not in err
