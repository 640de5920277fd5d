"""~/.ssh/config for every SSH connection hetrl opens: host aliases (HostName), User, Port, IdentityFile,
IdentitiesOnly and ProxyJump (any number of hops), read as OpenSSH reads them. hosts.txt's own `user@`,
`:port` and `identity=` win over the config where a line gives them.

Why hetrl resolves the config itself instead of letting fabric load it: fabric opens ProxyJump hops with
paramiko's AutoAddPolicy (any host key accepted) and runs ProxyCommand and `Match exec` strings through a
shell. Here every hop is a strict-host-key connection like the target (remote/ssh.py opens them), and a
config that would make hetrl run a command is refused with one line.

>>> config = SshConfig.from_text("Host gpu1\\n  HostName 10.0.0.7\\n  User ada\\n  Port 2222\\n", "cfg")
>>> target = config.resolve(HostEntry(host="gpu1", source="hosts.txt:1"))
>>> (target.hostname, target.user, target.port, target.jump)
('10.0.0.7', 'ada', 2222, None)
"""

from __future__ import annotations

import getpass
import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.hosts import DEFAULT_SSH_PORT, HostEntry, check_host_label, parse_host_line
from hetrl_cli.errors import BadInput, one_line

DEFAULT_PATH = Path("~/.ssh/config")
MAX_HOPS = 8
"""Longer ProxyJump chains are refused: almost always a loop between two Host blocks."""
MAX_INCLUDE_DEPTH = 16
"""OpenSSH's own limit on nested Include."""
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.+)$", re.IGNORECASE)
_BLOCK = re.compile(r"^\s*(?:host|match)(?:\s*=\s*|\s+)", re.IGNORECASE)
HOW_TO_SKIP = "--ssh-config PATH names another file, --no-ssh-config reads none"


@dataclass(frozen=True)
class SshTarget:
    """Where one SSH connection goes and as whom, after ~/.ssh/config and hosts.txt; `jump` is the hop it is
    reached through (None: directly)."""

    name: str
    """The name it was asked for (hosts.txt host or ProxyJump hop), as written."""
    hostname: str
    """The address connected to (HostName), also the known_hosts name."""
    port: int
    user: str
    identities: tuple[str, ...] = ()
    """Key files to offer; empty = the default keys and the agent."""
    identities_only: bool = False
    """Only `identities` (hosts.txt identity=, or IdentitiesOnly yes): no agent, no default keys."""
    identity_from: str = ""
    """Where `identities` were named, for messages (`identity= in hosts.txt:3`, `IdentityFile in ~/.ssh/config`)."""
    jump: SshTarget | None = None

    @property
    def where(self) -> str:
        """`host:port`, with the alias when the config renamed it: `gpu1 (10.0.0.7:22)`."""
        address = f"{self.hostname}:{self.port}"
        return address if self.name == self.hostname else f"{self.name} ({address})"

    @property
    def known_hosts_name(self) -> str:
        """The name ssh and paramiko look the key up by: `host` on port 22, else `[host]:port`."""
        return self.hostname if self.port == DEFAULT_SSH_PORT else f"[{self.hostname}]:{self.port}"

    def chain(self) -> list[SshTarget]:
        """Every hop from the first jump host to this target, in connection order."""
        hops: list[SshTarget] = []
        hop: SshTarget | None = self
        while hop is not None:
            hops.append(hop)
            hop = hop.jump
        return hops[::-1]


class SshConfig:
    """One ssh_config file, parsed (Include followed); `resolve` turns a hosts.txt entry into an SshTarget.
    An empty SshConfig (`SshConfig.none()`) resolves every host to itself, as before ssh config support."""

    def __init__(self, parsed: Any | None, path: str) -> None:
        self.parsed = parsed
        self.path = path

    @classmethod
    def none(cls) -> SshConfig:
        return cls(None, "")

    @classmethod
    def load(cls, path: Path | None = None, enabled: bool = True) -> SshConfig:
        """The user's ~/.ssh/config (a missing one reads as empty), or `path` (which must exist); none when
        not `enabled` (--no-ssh-config). BadInput, one line, for an unreadable or unparsable file."""
        if not enabled:
            return cls.none()
        explicit = path is not None
        file = Path(path if explicit else DEFAULT_PATH).expanduser()
        if not explicit and not file.exists():
            return cls.none()
        text = _read(file, explicit)
        return cls.from_text(_inline_includes(text, file, 0), str(path if explicit else DEFAULT_PATH))

    @classmethod
    def from_text(cls, text: str, path: str) -> SshConfig:
        from paramiko.ssh_exception import ConfigParseError

        lines = text.splitlines()
        long = next((n for n, line in enumerate(lines, start=1) if len(line) > MAX_LINE_CHARS), None)
        if long is not None:  # paramiko matches a Host line's patterns in quadratic time
            raise BadInput(f"ssh config {path}:{long}: a line longer than {MAX_LINE_CHARS:,} characters; {HOW_TO_SKIP}")
        try:
            parsed = _config_class()()
            parsed.parse(lines)
        except (ConfigParseError, ValueError) as exc:
            raise BadInput(f"ssh config {path}: {one_line(str(exc), 200)}: fix the line, or {HOW_TO_SKIP}") from None
        return cls(parsed, path)

    def resolve(self, entry: HostEntry) -> SshTarget:
        """The target of a hosts.txt line: its alias looked up, hosts.txt's user/port/identity winning.
        BadInput names the file for a ProxyCommand, a bad value or a ProxyJump loop."""
        options = self._lookup(entry.host)
        identities: tuple[str, ...] = ()
        if entry.identity:
            identities = (str(Path(entry.identity).expanduser()),)
        jump = self._jumps(entry.host, options, depth=1)
        return self._target(
            entry.host,
            options,
            user=entry.user,
            port=entry.port if entry.port_given else None,
            identities=identities,
            identity_from=f"identity= in {entry.source or 'hosts.txt'}",
            jump=jump,
        )

    # ---- the pieces ------------------------------------------------------------------------------------

    def _lookup(self, host: str) -> dict[str, Any]:
        if self.parsed is None:
            return {}
        try:
            options = dict(self.parsed.lookup(host))
        except _RefusedExec as exc:
            raise BadInput(f"ssh config {self.path}: {one_line(str(exc), 300)}") from None
        if options.get("proxycommand"):
            raise BadInput(
                f"ssh config {self.path}: ProxyCommand applies to {host}, and hetrl does not run commands from "
                f"ssh config: use ProxyJump (hetrl opens each hop itself, host keys checked), or {HOW_TO_SKIP}"
            )
        return options

    def _target(
        self,
        name: str,
        options: dict[str, Any],
        user: str | None,
        port: int | None,
        identities: tuple[str, ...],
        identity_from: str,
        jump: SshTarget | None,
    ) -> SshTarget:
        """One hop from its lookup; `user`, `port` and `identities` (from hosts.txt or a ProxyJump spec) win."""
        hostname = options.get("hostname", name)
        try:
            check_host_label(hostname)
        except ValueError as exc:
            raise BadInput(f"ssh config {self.path}: HostName for {name}: {one_line(str(exc), 200)}") from None
        user = user or options.get("user") or getpass.getuser()
        if not _USER.match(user):
            shown = one_line(repr(user), 80)
            raise BadInput(f"ssh config {self.path}: User {shown} for {name}: use letters, digits, '.', '_' or '-'")
        only = bool(identities)
        if not identities and options.get("identityfile"):
            files = [os.path.expanduser(f) for f in options["identityfile"]]
            identities = tuple(f for f in files if _is_file(f))  # ssh skips missing ones too
            identity_from = f"IdentityFile in {self.path}"
            only = str(options.get("identitiesonly", "no")).lower() == "yes"
        return SshTarget(
            name=name,
            hostname=hostname,
            port=port or self._port(name, options),
            user=user,
            identities=identities,
            identities_only=only,
            identity_from=identity_from,
            jump=jump,
        )

    def _port(self, name: str, options: dict[str, Any]) -> int:
        text = str(options.get("port", DEFAULT_SSH_PORT))
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
            shown = one_line(repr(text), 40)
            raise BadInput(f"ssh config {self.path}: Port {shown} for {name}: expected a number from 1 to 65535")
        return int(text)

    def _jumps(self, name: str, options: dict[str, Any], depth: int) -> SshTarget | None:
        """The last hop of `name`'s ProxyJump chain (each hop linked to the one before it), or None.

        As with `ssh -J a,b`: the first hop's own ProxyJump applies (so chains through Host blocks work), the
        later hops are reached through the hop before them whatever their own config says."""
        spec = str(options.get("proxyjump", "none")).strip()
        if spec.lower() == "none":
            return None
        previous: SshTarget | None = None
        for position, hop_spec in enumerate(s.strip() for s in spec.split(",")):
            if depth + position > MAX_HOPS:
                raise BadInput(
                    f"ssh config {self.path}: the ProxyJump chain to {name} is longer than {MAX_HOPS} hops "
                    "(do two Host blocks jump through each other?)"
                )
            hop = self._hop_entry(hop_spec, name)
            if hop.host == name:  # `Host *.lab` with `ProxyJump gw.lab` matches gw.lab itself: reach it directly
                return None
            hop_options = self._lookup(hop.host)
            if position == 0:
                previous = self._jumps(hop.host, hop_options, depth + 1)
            previous = self._target(
                hop.host,
                hop_options,
                user=hop.user,
                port=hop.port if hop.port_given else None,
                identities=(),
                identity_from="",
                jump=previous,
            )
        return previous

    def _hop_entry(self, spec: str, name: str) -> HostEntry:
        """A ProxyJump hop, `[ssh://][user@]host[:port]`, through hosts.txt's own target rules."""
        where = f"ssh config {self.path}: ProxyJump of {name}"
        text = spec.removeprefix("ssh://")
        if not text or any(c.isspace() or c in "#=" for c in text):
            raise BadInput(f"{where}: bad hop {one_line(repr(spec), 80)}: expected [user@]host[:port]")
        entry = parse_host_line(text, where)
        assert entry is not None  # non-empty, no comment
        return entry


MAX_LINE_CHARS = 16 * 2**10
"""Longer lines are refused: paramiko's lookup takes seconds on a Host line of 10,000 patterns, minutes at 100,000."""
MAX_CONFIG_CHARS = 16 * 2**20
"""An ssh config (with its Includes, each) larger than an artifact may be is refused unread, so a link to /dev/zero
cannot fill memory."""


def _is_file(path: str) -> bool:
    """An IdentityFile that exists (a name too long for the filesystem does not)."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def _read(file: Path, explicit: bool) -> str:
    shown = str(file) if explicit else str(DEFAULT_PATH)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO nobody writes to reads as empty, never waits
        os.set_blocking(fd, True)
        with open(fd, encoding="utf-8") as fh:
            text = fh.read(MAX_CONFIG_CHARS + 1)
    except UnicodeDecodeError:
        raise BadInput(f"ssh config {shown} is not UTF-8 text: {HOW_TO_SKIP}") from None
    except OSError as exc:
        raise BadInput(f"cannot read ssh config {shown}: {exc.strerror or exc}: {HOW_TO_SKIP}") from None
    if len(text) > MAX_CONFIG_CHARS:
        raise BadInput(f"ssh config {shown} is larger than {MAX_CONFIG_CHARS // 2**20} MiB: {HOW_TO_SKIP}")
    return text


def _inline_includes(text: str, file: Path, depth: int) -> str:
    """`Include` lines replaced by the files they name (globs; relative paths from ~/.ssh, as for a user
    config), since paramiko ignores Include. After an Include inside a Host or Match block, that block's
    header is repeated so the lines after it stay in their block."""
    if depth > MAX_INCLUDE_DEPTH:
        raise BadInput(
            f"ssh config {file}: Include nested more than {MAX_INCLUDE_DEPTH} deep (does it include itself?)"
        )
    out: list[str] = []
    header = "Host *"
    for line in text.splitlines():
        include = _INCLUDE.match(line)
        if include is None:
            if _BLOCK.match(line):
                header = line
            out.append(line)
            continue
        for pattern in include.group(1).split():
            pattern = os.path.expanduser(pattern.strip('"'))
            if not os.path.isabs(pattern):
                pattern = str(Path("~/.ssh").expanduser() / pattern)
            for name in sorted(glob.glob(pattern)):
                out.append(_inline_includes(_read(Path(name), explicit=True), Path(name), depth + 1))
        out.append(header)
    return "\n".join(out) + "\n"


def _config_class() -> type:
    """paramiko's SSHConfig, except that a `Match exec` block that could apply to a host is refused instead of
    run through a shell (paramiko runs it while looking a host up)."""
    import paramiko

    class NoExecSSHConfig(paramiko.SSHConfig):
        def _does_match(self, match_list: list, target_hostname: str, canonical: bool, final: bool, options: Any):
            commands = [m for m in match_list if m["type"] == "exec"]
            if not commands:
                return super()._does_match(match_list, target_hostname, canonical, final, options)
            rest = [m for m in match_list if m["type"] != "exec"]
            if rest and not super()._does_match(rest, target_hostname, canonical, final, options):
                return False
            raise _RefusedExec(
                f"'Match exec {commands[0]['param']}' applies to {target_hostname}, and hetrl does not run "
                f"commands from ssh config: {HOW_TO_SKIP}"
            )

    return NoExecSSHConfig


class _RefusedExec(Exception):
    """A `Match exec` block would have run a command for the host being looked up."""
