"""Running the system tools (ip, tc, ssh-keygen, sshd) as argument lists, each under a timeout.

Nothing from the spec ever reaches a shell: names are checked by spec.py and passed as separate arguments.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from hetrl_cli.errors import HetrlError

TOOL_TIMEOUT_S = 30.0
SSHD = "/usr/sbin/sshd"
REQUIRED_TOOLS = ("ip", "tc", "ssh-keygen")


def run_tool(
    argv: list[str], what: str, timeout_s: float = TOOL_TIMEOUT_S, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a tool; with `check`, a non-zero exit is a HetrlError naming `what` and the tool's last error line."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise HetrlError(f"{what}: {argv[0]} not found: install iproute2 and openssh-server") from None
    except subprocess.TimeoutExpired:
        raise HetrlError(f"{what}: `{shlex.join(argv)}` did not finish within {timeout_s:g}s") from None
    if check and done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise HetrlError(f"{what}: `{shlex.join(argv)}` failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done


def require_root_and_tools() -> None:
    """Namespaces, tc and cgroups need root; say so in one line before touching anything."""
    if os.geteuid() != 0:
        raise HetrlError(
            "hetrl emulate needs root (it creates network namespaces, tc qdiscs and cgroups): "
            "run it as root or with sudo"
        )
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if not Path(SSHD).is_file():
        missing.append(SSHD)
    if missing:
        raise HetrlError(f"hetrl emulate needs {', '.join(missing)}: apt-get install -y iproute2 openssh-server")


def pid_cmdline(pid: int) -> str | None:
    """The process's command line (NULs as spaces), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def kill_pids(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL whatever is left after `grace_s`; returns the pids that were alive."""
    import signal

    alive = [pid for pid in pids if _signal(pid, signal.SIGTERM)]
    left = _wait_gone(alive, grace_s)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    _wait_gone(left, grace_s)
    return alive


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive or the timeout passes; returns those still alive."""
    import time

    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        _reap(pending)
        pending = [p for p in pending if _exists(p)]
        if pending:
            time.sleep(0.02)
    return pending


def _exists(pid: int) -> bool:
    """Alive and not a zombie (a zombie child of ours is gone for every purpose but its pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _reap(pids: list[int]) -> None:
    """Collect our own children among `pids` (an sshd started by this process), so they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
