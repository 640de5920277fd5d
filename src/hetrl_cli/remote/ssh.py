"""SSH to the hosts of hosts.txt: one connection recipe (strict host keys for the target and every jump
host, ~/.ssh/config through remote/sshconfig.py, per-operation timeouts, one-sentence errors) shared by
`hetrl profile` and the multi-host `hetrl run` launcher.

Nothing from hosts.txt reaches a shell unquoted: commands are argument lists joined with shlex.quote.
fabric and paramiko are imported inside the functions that need them (the CLI starts fast without them).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import shlex
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.hosts import HostEntry
from hetrl_cli.remote.sshconfig import SshConfig, SshTarget

# ---- running commands on a host --------------------------------------------------------------------------


@dataclass
class Completed:
    rc: int
    stdout: str
    stderr: str


class CommandTimeout(Exception):
    """A command on a host ran past its timeout."""


def remote_command(argv: list[str]) -> str:
    """A shell command line from an argument list, every part quoted; a leading `~/` in the interpreter
    path becomes "$HOME"/ (quoting would stop the shell from expanding it)."""
    head, *rest = argv
    return " ".join([quote_path(head), *(shlex.quote(a) for a in rest)])


def quote_path(path: str) -> str:
    """shlex.quote, except that a leading `~/` stays expandable as "$HOME"/ (hosts.txt python=~/venv/...)."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


class SshExecutor:
    """Runs commands on a host over one fabric connection (opened, with host-key checks, by `connect`)."""

    def __init__(self, conn: Any, address: str = "", gateways: list[Any] | None = None) -> None:
        self.conn = conn
        self.address = address
        """The host's address after ssh config (HostName): what other hosts reach it at."""
        self.gateways = gateways or []
        """Jump-host connections the target is tunnelled through, first hop first."""

    def run(self, argv: list[str], timeout_s: float) -> Completed:
        from invoke.exceptions import CommandTimedOut

        try:
            result = self.conn.run(remote_command(argv), hide=True, warn=True, timeout=timeout_s, in_stream=False)
        except CommandTimedOut:
            raise CommandTimeout from None
        return Completed(result.exited, result.stdout, result.stderr)

    def start(self, argv: list[str], timeout_s: float) -> _SshStarted:
        channel = self.conn.client.get_transport().open_session(timeout=timeout_s)
        channel.settimeout(timeout_s)
        channel.exec_command(remote_command(argv))
        return _SshStarted(channel)

    def close(self) -> None:
        self.conn.close()
        for gateway in reversed(self.gateways):
            gateway.close()


class _SshStarted:
    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def readline(self, timeout_s: float) -> str:
        self.channel.settimeout(timeout_s)
        data = b""
        try:
            while not data.endswith(b"\n"):
                part = self.channel.recv(4096)
                if not part:
                    break
                data += part
        except TimeoutError:
            raise CommandTimeout from None
        return data.decode(errors="replace")

    def stderr_text(self) -> str:
        chunks = []
        while self.channel.recv_stderr_ready():
            chunks.append(self.channel.recv_stderr(4096))
        return b"".join(chunks).decode(errors="replace")

    def send(self, text: str) -> None:
        self.channel.sendall(text.encode())

    def finish(self, timeout_s: float) -> Completed:
        """Close the command's stdin, wait up to `timeout_s` for it to exit, and return its exit status (-1
        if it did not exit) with the stdout and stderr not read yet."""
        self.channel.shutdown_write()
        exited = self.channel.status_event.wait(timeout_s)
        out, err = [], []
        self.channel.settimeout(1.0)
        with contextlib.suppress(TimeoutError, OSError):
            while part := self.channel.recv(65536):
                out.append(part)
        with contextlib.suppress(TimeoutError, OSError):
            while part := self.channel.recv_stderr(65536):
                err.append(part)
        rc = self.channel.recv_exit_status() if exited else -1
        self.channel.close()
        return Completed(rc, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))

    def close(self) -> None:
        # The server sees its stdin close and exits (--exit-on-eof); its own lifetime bounds it regardless.
        self.channel.close()


# ---- SSH connection and host keys -------------------------------------------------------------------------


def key_fingerprint(key: Any) -> str:
    """OpenSSH-style `SHA256:...` fingerprint of a paramiko key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts:
    """The known_hosts file and the keys added to it during this run (reported, never silent)."""

    def __init__(self, path: Path, accept_new: bool) -> None:
        self.path = path
        self.accept_new = accept_new
        self.added: list[str] = []
        self._lock = threading.Lock()

    def policy(self) -> Any:
        import paramiko

        known = self

        class Reject(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
                raise UnknownHostKey(hostname, key)

        class AddAndRecord(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
                client.get_host_keys().add(hostname, key.get_name(), key)
                known.append(hostname, key)

        return AddAndRecord() if self.accept_new else Reject()

    def append(self, hostname: str, key: Any) -> None:
        """Append one `host keytype base64` line (ssh's own format), creating the file (and ~/.ssh) if needed."""
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with self._lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            old = self.path.read_bytes() if self.path.exists() else b""
            needs_newline = bool(old) and not old.endswith(b"\n")
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(("\n" if needs_newline else "") + line)
            self.added.append(f"added host key {hostname} {key.get_name()} {key_fingerprint(key)} to {self.path}")


class UnknownHostKey(Exception):
    """Raised by the strict policy for a host that is not in known_hosts."""

    def __init__(self, hostname: str, key: Any) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


@dataclass
class SshSettings:
    """How every connection of one command is made: the known_hosts that host keys are checked against (for
    the target and every jump host alike) and the ssh config that names the hosts (remote/sshconfig.py)."""

    known: KnownHosts
    config: SshConfig = field(default_factory=SshConfig.none)


def connect(entry: HostEntry, ssh: SshSettings, timeout_s: float) -> SshExecutor:
    """Open an SSH connection to a hosts.txt entry as ssh config resolves it, through its ProxyJump hops if
    any, each with strict host-key checking (no stdin forwarding). HostFailure, one sentence, naming the hop."""
    # paramiko logs transport errors (e.g. "Error reading SSH protocol banner") through logging's
    # last-resort handler straight to stderr; our message already says it, in one line.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    target = ssh.config.resolve(entry)
    if target.identities_only and not all(Path(k).is_file() for k in target.identities):
        raise HostFailure(f"identity file {entry.identity} not found ({target.identity_from})")
    opened: list[Any] = []
    sock = None
    try:
        for hop in target.chain():
            conn = _open_hop(hop, ssh.known, timeout_s, sock, is_target=hop is target)
            opened.append(conn)
            if hop is not target:
                sock = _tunnel(conn, hop, target.chain()[len(opened)], timeout_s)
    except BaseException:
        for conn in reversed(opened):
            conn.close()
        raise
    return SshExecutor(opened[-1], address=target.hostname, gateways=opened[:-1])


def _open_hop(hop: SshTarget, known: KnownHosts, timeout_s: float, sock: Any, is_target: bool) -> Any:
    """One fabric connection (the target or a jump host), strict host keys, over `sock` when tunnelled."""
    from fabric import Config, Connection

    connect_kwargs: dict[str, Any] = {
        "timeout": timeout_s,
        "banner_timeout": timeout_s,
        "auth_timeout": timeout_s,
        "channel_timeout": timeout_s,
    }
    if hop.identities:
        # Only the named keys when asked: a key found elsewhere must not log in as someone unexpected.
        connect_kwargs.update(
            key_filename=list(hop.identities), look_for_keys=False, allow_agent=not hop.identities_only
        )
    else:
        connect_kwargs.update(look_for_keys=True, allow_agent=True)
    if sock is not None:
        connect_kwargs["sock"] = sock
    config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    conn = Connection(
        hop.hostname, user=hop.user, port=hop.port, config=config, connect_kwargs=connect_kwargs, gateway=False
    )
    conn.client.set_missing_host_key_policy(known.policy())
    if known.path.is_file():
        conn.client.load_host_keys(str(known.path))
    try:
        conn.open()
    except Exception as exc:
        transport = conn.client.get_transport()
        banner_seen = bool(getattr(transport, "remote_version", None))
        conn.close()
        reason = explain_connect_error(exc, hop, known, timeout_s, banner_seen, is_jump=not is_target)
        raise HostFailure(reason if is_target else f"jump host {hop.where}: {reason}") from None
    return conn


def _tunnel(jump_conn: Any, jump: SshTarget, next_hop: SshTarget, timeout_s: float) -> Any:
    """A direct-tcpip channel from the jump host to the next hop (what `ssh -J` asks the jump host for)."""
    try:
        return jump_conn.client.get_transport().open_channel(
            "direct-tcpip", (next_hop.hostname, next_hop.port), ("", 0), timeout=timeout_s
        )
    except Exception as exc:
        why = getattr(exc, "text", "") or f"{type(exc).__name__}: {exc}"  # paramiko.ChannelException has .text
        raise HostFailure(
            f"jump host {jump.where} could not open a connection to {next_hop.hostname}:{next_hop.port} "
            f"({why.lower()}): is that address right as seen from the jump host, and does its sshd allow "
            "TCP forwarding?"
        ) from None


def explain_connect_error(
    exc: BaseException,
    hop: SshTarget,
    known: KnownHosts,
    timeout_s: float,
    banner_seen: bool = True,
    is_jump: bool = False,
) -> str:
    """One sentence: what went wrong connecting, and what to do about it."""
    import paramiko

    where = hop.where
    kh = hop.known_hosts_name
    if isinstance(exc, UnknownHostKey):
        return (
            f"host key {exc.key.get_name()} {key_fingerprint(exc.key)} of {kh} is not in {known.path}: verify it "
            f"and add it (ssh-keyscan -p {hop.port} {hop.hostname} >> {known.path}), or rerun with "
            "--accept-new-host-keys"
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"HOST KEY MISMATCH for {kh}: the server offered {exc.key.get_name()} {key_fingerprint(exc.key)}, "
            f"{known.path} has {key_fingerprint(exc.expected_key)} (possible man-in-the-middle; if the host was "
            f"reinstalled, remove the old key with ssh-keygen -R '{kh}' -f {known.path})"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = f"key {', '.join(hop.identities)}" if hop.identities else "the default keys and agent"
        if hop.identities and not hop.identity_from.startswith("identity="):
            key += f" ({hop.identity_from})"
        where_key = "set IdentityFile for it in ssh config" if is_jump else "set identity= in hosts.txt"
        return (
            f"SSH authentication failed for {hop.user}@{where} with {key}: add the public key to that host's "
            f"authorized_keys or {where_key}"
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"connection refused at {where}: is sshd running there and is the port right?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name {hop.hostname!r}: check the name (or its HostName in ssh config)"
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out after {timeout_s:g}s connecting to {where}: host down or port filtered? (--timeout)"
    # paramiko may report a banner timeout as "No existing session": no server version seen says what it was.
    if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc).lower() or not banner_seen):
        return f"no SSH banner from {where} within {timeout_s:g}s: not an SSH server, or overloaded (--timeout)"
    return f"SSH connection to {where} failed: {type(exc).__name__}: {exc}"


class HostFailure(Exception):
    """A per-host failure; the message is the reason shown next to the host's name."""


def host_python(entry: HostEntry) -> str:
    """The host's interpreter; for the local host the default is the one running hetrl."""
    if entry.is_local and "python" not in entry.model_fields_set:
        return sys.executable
    return entry.python
