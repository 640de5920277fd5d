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
    from interrupt import default_sigint

    proc = subprocess.Popen([hetrl, "show", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip().endswith("hetrl: interrupted")
    assert "Traceback" not in err


def test_a_closed_reader_ends_show_quietly_with_0(tmp_path: Path) -> None:
    """`hetrl show plan | head -2` under `set -o pipefail` must not fail the pipeline (exit 0, no message)."""
    from conftest import HETRL, hetrl_env

    plan = tmp_path / "plan.json"
    root = Path(__file__).parent.parent
    made = subprocess.run([HETRL, "plan", "profiles/paper-single-region.json", "--solver", "verl", "-o", plan],
                          capture_output=True, text=True, env=hetrl_env(), cwd=root)  # fmt: skip
    assert made.returncode == 0, made.stderr
    script = f"set -o pipefail; {HETRL} show {plan} | head -2"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=hetrl_env())
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr == ""


def test_plan_without_a_profile_takes_the_newest_profile_not_a_calibration(hetrl, tmp_path: Path) -> None:
    import os
    import shutil

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(Path(__file__).parent.parent / "profiles" / "paper-single-region.json", profiles / "lab.json")
    calibration = profiles / "lab.calibration.json"
    calibration.write_text('{"kind": "calibration", "schema_version": 1}\n')
    os.utime(profiles / "lab.json", (1_000_000, 1_000_000))  # the calibration is the newer file
    result = hetrl("plan", "--solver", "verl", "-o", tmp_path / "plan.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "using the newest profile: profiles/lab.json" in result.stderr


def test_off_a_terminal_without_columns_lines_stay_whole(tmp_path: Path) -> None:
    """CI logs: no COLUMNS, no terminal — a sentence is one line, not wrapped at rich's default 80 columns."""
    from conftest import HETRL, hetrl_env

    env = {k: v for k, v in hetrl_env().items() if k != "COLUMNS"}
    root = Path(__file__).parent.parent
    made = subprocess.run([HETRL, "plan", "profiles/paper-single-region.json", "--solver", "verl", "-o", "-"],
                          capture_output=True, text=True, env=env, cwd=root)  # fmt: skip
    assert made.returncode == 0, made.stderr
    shown = subprocess.run([HETRL, "show", "-"], input=made.stdout, capture_output=True, text=True, env=env)
    assert shown.returncode == 0, shown.stderr
    bottleneck = [line for line in shown.stdout.splitlines() if line.startswith("Bottleneck:")]
    assert len(bottleneck) == 1 and bottleneck[0].rstrip().endswith("of it")
    assert len(bottleneck[0]) > 80


def test_plan_json_prints_the_plan_and_show_json_is_format_json(hetrl, tmp_path: Path) -> None:
    import json

    root = Path(__file__).parent.parent
    made = hetrl("plan", "profiles/paper-single-region.json", "--solver", "verl", "--json", cwd=root)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["kind"] == "plan"
    assert "wrote" not in made.stderr
    (tmp_path / "p.json").write_text(made.stdout)
    as_flag = hetrl("show", tmp_path / "p.json", "--json")
    as_format = hetrl("show", tmp_path / "p.json", "--format", "json")
    assert as_flag.returncode == 0 and as_flag.stdout == as_format.stdout
    assert json.loads(as_flag.stdout)["plan"] == "paper-single-region-verl"


def test_an_unwritable_output_is_refused_before_the_search(hetrl, tmp_path: Path) -> None:
    """A 60 s search must not run only to find that -o names a directory."""
    root = Path(__file__).parent.parent
    result = hetrl("plan", "profiles/paper-single-region.json", "--solver", "hybrid", "--budget", "60s",
                   "-o", tmp_path, cwd=root, timeout=20)  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"hetrl: error: {tmp_path}: is a directory; name a file in it (e.g. {tmp_path / 'out.json'})"
    )
