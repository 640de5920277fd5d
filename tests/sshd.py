"""A real OpenSSH server for tests: three "hosts" on one machine (127.0.0.2, .3, .4 — all loopback here).

One `sshd -D -e -f CFG` with its own config, a generated ed25519 host key and user key, listening on a free
port on each address, strict settings (key auth only). `known_hosts` is written in the `[addr]:port` form a
non-22 port needs, so clients can check host keys strictly. Use `start_sshd(tmp_dir)` as a context manager
or the `sshd_hosts` fixture from conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def skip_reason() -> str | None:
    """Why these tests cannot run here, or None. CI runs as root with openssh-server installed."""
    if os.geteuid() != 0:
        return "needs root: sshd must read its host key and log in as this user"
    if not Path(SSHD).is_file() or not shutil.which("ssh-keygen"):
        return f"needs openssh-server ({SSHD}) and ssh-keygen: apt-get install -y openssh-server"
    return None


@dataclass(frozen=True)
class SshdHosts:
    """What a test needs to reach the hosts: addresses, port, user key, known_hosts, interpreter."""

    addresses: tuple[str, ...]
    port: int
    user: str
    identity: Path
    """Private key authorised for `user`."""
    other_identity: Path
    """A valid key that is NOT authorised (for auth-failure tests)."""
    host_public_key: str
    """`ssh-ed25519 AAAA...` of the server."""
    known_hosts: Path
    """Lists every address with the server's real key."""
    python: str
    """The interpreter the remote side uses (this venv: the filesystem is shared)."""
    root: Path

    def known_hosts_line(self, address: str, public_key: str | None = None) -> str:
        return f"[{address}]:{self.port} {public_key or self.host_public_key}\n"

    def hosts_line(self, address: str, *extra: str, identity: Path | None = None) -> str:
        """One hosts.txt line reaching `address` with the authorised key and this venv's python."""
        parts = [f"{self.user}@{address}:{self.port}", f"identity={identity or self.identity}", f"python={self.python}"]
        return " ".join([*parts, *extra]) + "\n"


def free_port(addresses: tuple[str, ...]) -> int:
    """A port that is free on every address (bound on the first, probed on the others)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind((addresses[0], 0))
            port = sock.getsockname()[1]
        if all(_can_bind(a, port) for a in addresses):
            return port
    raise RuntimeError("no port free on all test addresses")


def _can_bind(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair without a passphrase; return the public key line (type and base64)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True, timeout=30
    )
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def write_config(
    root: Path, port: int, addresses: tuple[str, ...], host_key: Path, authorized: Path, extra: tuple[str, ...] = ()
) -> Path:
    lines = [
        f"Port {port}",
        *(f"ListenAddress {a}" for a in addresses),
        f"HostKey {host_key}",
        f"PidFile {root / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "MaxStartups 50",
        "LogLevel VERBOSE",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
        *extra,
    ]
    config = root / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    return config


def _wait_listening(addresses: tuple[str, ...], port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 10
    pending = list(addresses)
    while pending:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd not listening on {pending} after 10 s: {log.read_text()[-2000:]}")
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((pending[0], port)) == 0:
                pending.pop(0)
                continue
        time.sleep(0.05)


@contextlib.contextmanager
def start_sshd(root: Path, addresses: tuple[str, ...] = ADDRESSES, extra: tuple[str, ...] = ()) -> Iterator[SshdHosts]:
    """Run sshd on `addresses` until the block ends; everything lives under `root`. `extra` lines end the
    config (e.g. `Match LocalAddress` blocks that let one address forward only to another)."""
    import getpass

    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
    host_key_pub = keygen(root / "host_ed25519", "test-host")
    user_pub = keygen(root / "user_ed25519", "test-user")
    keygen(root / "other_ed25519", "not-authorised")
    authorized = root / "authorized_keys"
    authorized.write_text(user_pub + "\n")
    port = free_port(addresses)
    config = write_config(root, port, addresses, root / "host_ed25519", authorized, extra)
    subprocess.run([SSHD, "-t", "-f", str(config)], check=True, timeout=30)
    log = root / "sshd.log"
    with log.open("w") as log_fh:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log_fh, stderr=subprocess.STDOUT)
    try:
        _wait_listening(addresses, port, proc, log)
        hosts = SshdHosts(
            addresses=addresses,
            port=port,
            user=getpass.getuser(),
            identity=root / "user_ed25519",
            other_identity=root / "other_ed25519",
            host_public_key=host_key_pub,
            known_hosts=root / "known_hosts",
            python=sys.executable,
            root=root,
        )
        hosts.known_hosts.write_text("".join(hosts.known_hosts_line(a) for a in addresses))
        yield hosts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
