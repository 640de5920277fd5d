"""hosts.txt: a table of good lines (DeepSpeed hostfile lines included) and bad ones with their exact errors.

Every field later becomes an SSH target or a command argument, so shell metacharacters must be refused at
parse time, with `file:line`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.artifacts.hosts import load_hosts, parse_host_line, parse_hosts_text
from hetrl_cli.errors import BadInput

PATH_HINT = "expected a plain path (letters, digits, '._/+-'), no spaces or shell characters"
HOST_HINT = "a hostname (letters, digits, '-', '.') or an IP address is expected"

GOOD = [
    # line, (host, user, port, name, slots, gpus, region, python, identity, is_local)
    ("worker-1 slots=8", ("worker-1", None, 22, "worker-1", 8, None, "default", "python3", None, False)),
    (
        "worker-2 slots=4  # DeepSpeed hostfile",
        ("worker-2", None, 22, "worker-2", 4, None, "default", "python3", None, False),
    ),
    (
        "root@10.0.0.2:2222 gpus=0,1,3 region=eu-west",
        ("10.0.0.2", "root", 2222, "10.0.0.2:2222", None, [0, 1, 3], "eu-west", "python3", None, False),
    ),
    (
        "gpu.example.com python=~/venv/bin/python identity=~/.ssh/id_ed25519",
        (
            "gpu.example.com",
            None,
            22,
            "gpu.example.com",
            None,
            None,
            "default",
            "~/venv/bin/python",
            "~/.ssh/id_ed25519",
            False,
        ),
    ),
    ("h slots=2 gpus=0,3", ("h", None, 22, "h", 2, [0, 3], "default", "python3", None, False)),
    ("[::1]:2200", ("::1", None, 2200, "[::1]:2200", None, None, "default", "python3", None, False)),
    ("fe80::1", ("fe80::1", None, 22, "fe80::1", None, None, "default", "python3", None, False)),
    ("localhost", ("localhost", None, 22, "localhost", None, None, "default", "python3", None, True)),
    ("127.0.0.1 slots=1", ("127.0.0.1", None, 22, "127.0.0.1", 1, None, "default", "python3", None, True)),
    ("alice@localhost", ("localhost", "alice", 22, "localhost", None, None, "default", "python3", None, False)),
    ("localhost:22", ("localhost", None, 22, "localhost:22", None, None, "default", "python3", None, False)),
    (
        "u.ser_1@h python=/opt/py-3.11/bin/python3",
        ("h", "u.ser_1", 22, "h", None, None, "default", "/opt/py-3.11/bin/python3", None, False),
    ),
]

Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]
"""The `hetrl` fixture from conftest.py: runs the real CLI."""


@pytest.mark.parametrize(("line", "expected"), GOOD, ids=[g[0] for g in GOOD])
def test_good_lines(line: str, expected: tuple) -> None:
    e = parse_host_line(line, "hosts.txt:1")
    assert e is not None
    got = (e.host, e.user, e.port, e.name, e.slots, e.gpus, e.region, e.python, e.identity, e.is_local)
    assert got == expected
    assert e.source == "hosts.txt:1"


@pytest.mark.parametrize("line", ["", "   ", "# a comment", "   # indented comment"])
def test_blank_and_comment_lines_are_skipped(line: str) -> None:
    assert parse_host_line(line, "f:1") is None


BAD = [
    # shell metacharacters, everywhere they could hide
    ("h;rm -rf /", f"bad host 'h;rm': {HOST_HINT}"),
    ("$(reboot)", f"bad host '$(reboot)': {HOST_HINT}"),
    ("`reboot`", f"bad host '`reboot`': {HOST_HINT}"),
    ("h|x", f"bad host 'h|x': {HOST_HINT}"),
    ("h&", f"bad host 'h&': {HOST_HINT}"),
    ("h python=$(id)", f"python='$(id)': {PATH_HINT}"),
    ("h python=`id`", f"python='`id`': {PATH_HINT}"),
    ("h python=a;b", f"python='a;b': {PATH_HINT}"),
    ("h python='/opt/x'", f"python=\"'/opt/x'\": {PATH_HINT}"),
    ("h python=/opt/my python", "expected key=value, got 'python' (values cannot contain spaces)"),
    ("h identity=~/../x", f"identity='~/../x': {PATH_HINT}"),
    ("h identity=$HOME/k", f"identity='$HOME/k': {PATH_HINT}"),
    ("h region=a$b", "region='a$b': use letters, digits, '.', '_' or '-'"),
    ("-x@h", "bad user name '-x': use letters, digits, '.', '_' or '-'"),
    ("a;b@h", "bad user name 'a;b': use letters, digits, '.', '_' or '-'"),
    # ports
    ("h:0", "bad port '0': expected a number from 1 to 65535"),
    ("h:70000", "bad port '70000': expected a number from 1 to 65535"),
    ("h:22x", "bad port '22x': expected a number from 1 to 65535"),
    ("h:", "bad port '': expected a number from 1 to 65535"),
    ("[::1", "bad bracketed address '[::1': write [IPv6] or [IPv6]:port"),
    ("[::1]x", "unexpected 'x' after ']'"),
    ("[::1]:99999", "bad port '99999': expected a number from 1 to 65535"),
    # keys
    ("h colour=red", "unknown key 'colour'; known keys: slots, region, gpus, python, identity"),
    ("h slots", "expected key=value, got 'slots' (values cannot contain spaces)"),
    ("h python=", "expected key=value, got 'python=' (values cannot contain spaces)"),
    ("h slots=1 slots=2", "key 'slots' given twice"),
    ("h slots=0", "slots='0': expected a positive integer"),
    ("h slots=two", "slots='two': expected a positive integer"),
    ("h gpus=0,0", "gpus='0,0': an index is listed twice"),
    ("h gpus=a", "gpus='a': expected device indices like gpus=0,1,3"),
    ("h gpus=-1", "gpus='-1': expected device indices like gpus=0,1,3"),
    ("h slots=1 gpus=0,1", "slots=1 but gpus= lists 2 devices; give one or make them agree"),
]


@pytest.mark.parametrize(("line", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_lines_name_file_and_line(line: str, message: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_host_line(line, "hosts.txt:7")
    assert str(err.value) == f"hosts.txt:7: {message}"


def test_duplicates_name_both_lines() -> None:
    with pytest.raises(BadInput) as err:
        parse_hosts_text("a\n# gap\nroot@b:2222\nc\nb:2222\n", "hosts.txt")
    assert str(err.value) == "hosts.txt:5: host 'b:2222' is already listed at hosts.txt:3"


def test_same_address_on_other_ports_are_distinct_hosts() -> None:
    entries = parse_hosts_text("127.0.0.2:2201\n127.0.0.2:2202\n", "h")
    assert [e.name for e in entries] == ["127.0.0.2:2201", "127.0.0.2:2202"]


def test_a_file_without_hosts_is_an_error() -> None:
    with pytest.raises(BadInput) as err:
        parse_hosts_text("# nothing here\n\n", "empty.txt")
    assert str(err.value) == (
        "empty.txt: no hosts listed; write one host a line, e.g. 'localhost' or 'user@gpu-1 slots=8'"
    )


def test_deepspeed_hostfile_parses_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("worker-1 slots=4\nworker-2 slots=4\n")
    assert [(e.name, e.slots) for e in load_hosts(path)] == [("worker-1", 4), ("worker-2", 4)]


def test_example_hosts_file_parses() -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "hosts.example.txt"
    entries = load_hosts(example)
    assert len(entries) >= 3 and len({e.region for e in entries}) >= 2


def test_cli_reports_a_bad_line_with_file_line_and_exit_2(hetrl: Hetrl, tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("gpu-1 slots=8\ngpu-2 python=$(curl evil)\n")
    result = hetrl("profile", path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"hetrl: error: {path}:2: python='$(curl': {PATH_HINT}\n"


def test_cli_reports_a_missing_hosts_file(hetrl: Hetrl, tmp_path: Path) -> None:
    result = hetrl("profile", tmp_path / "nope.txt")
    assert (result.returncode, result.stderr) == (2, f"hetrl: error: {tmp_path / 'nope.txt'}: no such file\n")
