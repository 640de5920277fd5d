"""Start a program as an emulated host: enter its netns, take its own hostname, join its cgroups, then exec.

    python -m hetrl_cli.emulate.hostinit --netns /run/netns/NS --hostname NAME \\
        [--cgroup DIR ...] [--cpus 0,1] -- /usr/sbin/sshd -D -e -f CONFIG

Run by `emulate up` for each host's sshd. Joining the cgroups (and taking the CPU affinity) before the exec
puts sshd — and so every session, probe and worker it later forks — under the host's CPU and memory limits.
The netns is entered with setns(2) rather than `ip netns exec`, which would remount /sys and hide
/sys/fs/cgroup from the host's processes (the probe reads its CPU quota there). The pid stays the same
through the exec, so the caller's Popen pid is sshd's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def enter(netns: str, hostname: str, cgroups: list[str], cpus: set[int] | None = None) -> None:
    """Become the host: its network, its hostname (a private UTS namespace), its cgroups, its CPUs."""
    fd = os.open(netns, os.O_RDONLY)
    try:
        _libc_call("setns", fd, CLONE_NEWNET)
    finally:
        os.close(fd)
    _libc_call("unshare", CLONE_NEWUTS)
    socket.sethostname(hostname)
    for group in cgroups:
        with open(os.path.join(group, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    if cpus:
        os.sched_setaffinity(0, cpus)  # inherited by every child, as the cgroups are


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetrl_cli.emulate.hostinit")
    parser.add_argument("--netns", required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--cgroup", action="append", default=[])
    parser.add_argument("--cpus", type=lambda text: {int(c) for c in text.split(",")}, default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    try:
        enter(args.netns, args.hostname, args.cgroup, args.cpus)
        os.execv(command[0], command)
    except OSError as exc:
        print(f"hostinit {args.hostname}: {exc}", file=sys.stderr)
        return 1
    return 0  # not reached: execv replaced us


if __name__ == "__main__":
    sys.exit(main())
