"""Fixtures for the one-box cluster: skip reasons, an emulated 3-host cluster, SSH into its hosts.

Only one emulated cluster can be up on a machine at a time, so the module-scoped `cluster` fixture and the
lifecycle tests (each with its own up/down) never overlap: pytest finishes one module before the next.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetrl_cli.emulate.api import EmulatedCluster, emulate_down, emulate_up

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "emulate-3host.yaml"


def emulate_skip_reason() -> str | None:
    """Why the namespace tests cannot run here, or None (CI runs as root with iproute2 and openssh-server)."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, tc and cgroups"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc): apt-get install -y iproute2"
    if not Path("/usr/sbin/sshd").is_file() or not shutil.which("ssh"):
        return "needs openssh-server and openssh-client: apt-get install -y openssh-server"
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    if done.returncode != 0:
        return f"`ip netns` is unavailable here: {done.stderr.decode(errors='replace').strip()}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if not Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").is_file() and not (v2.is_file() and "cpu" in v2.read_text()):
        return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)"
    return None


@pytest.fixture
def need_emulation() -> None:
    reason = emulate_skip_reason()
    if reason:
        pytest.skip(reason)


def leftovers() -> list[str]:
    """Everything named hetrl-emu-* on this machine: namespaces, interfaces, cgroups, sshds of a state dir."""
    found = [
        f"netns {line.split()[0]}"
        for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()
        if line.startswith("hetrl-emu-")
    ]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if "hetrl-emu-" in line]
    for mount in ("cpu", "memory", "unified", ""):
        base = Path("/sys/fs/cgroup") / mount
        if base.is_dir():
            found += [f"cgroup {p}" for p in base.glob("**/hetrl-emu-*") if p.is_dir()]
    return found


def sshd_pids(state_dir: Path) -> list[int]:
    """Live sshds started with a config in `state_dir`."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            status = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(state_dir) in cmdline and "sshd" in cmdline and status != "Z":
            pids.append(int(proc.name))
    return pids


def ssh_argv(cluster: EmulatedCluster, host: str, *command: str) -> list[str]:
    """The OpenSSH client with strict host-key checking against the cluster's known_hosts and its key only."""
    address = next(h.address for h in cluster.hosts if h.name == host)
    options = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": str(cluster.known_hosts),
        "IdentitiesOnly": "yes",
        "ConnectTimeout": "10",
    }
    return [
        "ssh",
        *(f"-o{k}={v}" for k, v in options.items()),
        "-i",
        str(cluster.identity),
        f"root@{address}",
        *command,
    ]


def ssh(cluster: EmulatedCluster, host: str, *command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command on an emulated host."""
    argv = ssh_argv(cluster, host, *command)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def remote_affinity(cluster: EmulatedCluster, host: str) -> str:
    """The CPUs a process started over SSH on `host` may run on, as `sorted(os.sched_getaffinity(0))` prints."""
    done = ssh(cluster, host, sys.executable, "-c", "'import os; print(sorted(os.sched_getaffinity(0)))'")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def ssh_popen(cluster: EmulatedCluster, host: str, *command: str) -> subprocess.Popen[str]:
    """Start a command on an emulated host; its stdout is a pipe."""
    argv = ssh_argv(cluster, host, *command)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCluster]:
    """The example 3-host cluster (fast 1.0 + mid 0.5 in east, slow 0.25 in west, 50 Mbit/s between)."""
    reason = emulate_skip_reason()
    if reason:
        pytest.skip(reason)
    if leftovers():
        pytest.skip(f"another emulated cluster is up on this machine: {leftovers()[:3]}")
    state_dir = tmp_path_factory.mktemp("emu") / "state"
    up = emulate_up(EXAMPLE, state_dir)
    try:
        yield up
    finally:
        emulate_down(state_dir)
