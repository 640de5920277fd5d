"""Keys and one sshd per emulated host: own config and host key, key-only login as root with a generated key.

Host keys are distinct per host and written to known_hosts, so clients can (and `hetrl profile` does) check
them strictly. The client key lives in the state dir; nothing is added to ~/.ssh.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from hetrl_cli.emulate.system import SSHD, run_tool
from hetrl_cli.errors import HetrlError

SSH_PORT = 22
LISTEN_TIMEOUT_S = 15.0


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair without a passphrase; returns the public key as `type base64`."""
    run_tool(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], f"generating {path}")
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def write_config(host_dir: Path, address: str, authorized_keys: Path) -> Path:
    """A strict sshd_config: one address, key auth only, root by key, no PAM, no DNS lookups."""
    lines = [
        f"Port {SSH_PORT}",
        f"ListenAddress {address}",
        f"HostKey {host_dir / 'host_ed25519'}",
        f"PidFile {host_dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",
        "MaxStartups 50",
        "MaxSessions 50",
        "LogLevel INFO",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ]
    config = host_dir / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation: `sshd -t` checks it too
    run_tool([SSHD, "-t", "-f", str(config)], f"checking {config}")
    return config


def start(
    host: str, netns: str, cgroups: list[Path], config: Path, log: Path, cpus: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start sshd as the host (hostinit: netns, hostname, cgroups, CPUs, then exec); it outlives this process."""
    argv = [sys.executable, "-m", "hetrl_cli.emulate.hostinit", "--netns", f"/run/netns/{netns}", "--hostname", host]
    for group in cgroups:
        argv += ["--cgroup", str(group)]
    if cpus:
        argv += ["--cpus", ",".join(map(str, cpus))]
    argv += ["--", SSHD, "-D", "-e", "-f", str(config)]
    with log.open("ab") as log_fh:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def wait_listening(host: str, address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until sshd accepts connections on its address (reached through the bridge), or a HetrlError."""
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()
            raise HetrlError(f"sshd of host {host} exited with {proc.returncode}: {tail[-1] if tail else 'no output'}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((address, SSH_PORT)) == 0:
                return
        if time.monotonic() > deadline:
            raise HetrlError(
                f"sshd of host {host} not listening on {address}:{SSH_PORT} after {LISTEN_TIMEOUT_S:g}s (log: {log})"
            )
        time.sleep(0.05)
