"""hosts.txt: one host a line, `[user@]host[:port] [slots=N] [key=value ...]`, `#` comments.

Keys: slots, region, gpus, python, identity, price (US dollars per device-hour, over the catalog's).

DeepSpeed hostfile lines (`worker-1 slots=8`) parse as they are. Everything here is untrusted input that
later becomes SSH targets and command arguments, so each field is checked against a narrow character set
and rejected with `file:line` when it carries anything a shell could interpret.

>>> parse_hosts_text("gpu-a slots=8 region=us-east\\nroot@10.0.0.2:2222 gpus=0,1", "hosts.txt")[1].port
2222
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path

from pydantic import Field

from hetrl_cli.artifacts.base import Strict
from hetrl_cli.errors import BadInput

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Paths: no spaces, quotes, `$`, `;`, backticks, globs or redirections; `~` only as a leading home marker.
_PATH = re.compile(r"^~?[A-Za-z0-9._/+-]{1,1024}$")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
KNOWN_KEYS = ("slots", "region", "gpus", "python", "identity")
"""The keys an unknown-key error lists (how to reach and use a host); `price=` is accepted too (a price, not a
connection setting: tests pin this message)."""
DEFAULT_SSH_PORT = 22


class HostEntry(Strict):
    """One line of hosts.txt, validated."""

    host: str
    """Address or hostname to reach the host at."""
    user: str | None = None
    """SSH user; None = the SSH default (current user)."""
    port: int = DEFAULT_SSH_PORT
    """SSH port."""
    port_given: bool = False
    """Whether the line named a port (a local host with a port is reached over SSH)."""
    slots: int | None = None
    """Number of devices to use on the host (DeepSpeed's `slots=`); None = all found."""
    region: str = "default"
    """Site label; links between regions are the slow ones."""
    gpus: list[int] | None = None
    """Subset of device indices to use on the host; None = all (or the first `slots`)."""
    python: str = "python3"
    """Interpreter on that host that has hetrl installed."""
    identity: str | None = None
    """Private key file for SSH to this host."""
    price: float | None = None
    """US dollars per device-hour on this host (`price=2.5`): the profile's price for its devices, over the
    catalog's list price for the probed GPU; None = the catalog's, where it has one."""
    source: str = Field(default="", exclude=True)
    """`file:line` this entry came from, for error messages."""

    @property
    def name(self) -> str:
        """The label a host is known by in profiles and plans: `host` or `host:port` when a port is given."""
        if self.port_given:
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"{host}:{self.port}"
        return self.host

    @property
    def is_local(self) -> bool:
        """`localhost` without a user or port runs on this machine without SSH."""
        return self.host in LOCAL_NAMES and self.user is None and not self.port_given


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _split_target(target: str, where: str) -> tuple[str | None, str, int | None]:
    user: str | None = None
    if "@" in target:
        user, _, target = target.rpartition("@")
        if not _USER.match(user):
            raise BadInput(f"{where}: bad user name {user!r}: use letters, digits, '.', '_' or '-'")
    port: int | None = None
    if target.startswith("["):  # [ipv6]:port or [ipv6]
        host, sep, rest = target[1:].partition("]")
        if not sep or not _is_ip(host):
            raise BadInput(f"{where}: bad bracketed address {target!r}: write [IPv6] or [IPv6]:port")
        if rest:
            if not rest.startswith(":"):
                raise BadInput(f"{where}: unexpected {rest!r} after ']'")
            port = _parse_port(rest[1:], where)
        return user, host, port
    if target.count(":") == 1:
        target, _, port_text = target.partition(":")
        port = _parse_port(port_text, where)
    if not (_is_ip(target) or _HOSTNAME.match(target)):
        raise BadInput(
            f"{where}: bad host {target!r}: a hostname (letters, digits, '-', '.') or an IP address is expected"
        )
    return user, target, port


MAX_LINE_CHARS = 1000
"""hosts.txt lines longer than this are refused without being echoed back (no real host line comes near)."""
MAX_LABEL_CHARS = 300
"""Longer host labels are refused without being echoed back."""


def check_host_label(label: str) -> str:
    """A host named in a profile or plan obeys hosts.txt's rules (a hostname or IP, optionally `:port` or
    `[IPv6]:port`; no user), so no artifact can smuggle another string into an SSH target or a path. ValueError
    (for pydantic validators) otherwise."""
    if len(label) > MAX_LABEL_CHARS:
        raise ValueError(f"a host name of {len(label)} characters is too long (at most {MAX_LABEL_CHARS})")
    try:
        user, _, _ = _split_target(label, "host")
    except BadInput as exc:
        raise ValueError(str(exc).removeprefix("host: ")) from None
    if user is not None:
        raise ValueError(f"host {label!r} names a user: profiles and plans name hosts only")
    return label


def check_device_id(device_id: str) -> str:
    """`host/index` with a valid host label (ValueError otherwise)."""
    host, _, index = device_id.rpartition("/")
    if not host or not _is_number(index) or len(index) > 6:
        shown = device_id if len(device_id) <= 80 else device_id[:80] + "..."
        raise ValueError(f"device id {shown!r} is not of the form host/index")
    check_host_label(host)
    return device_id


def _is_number(text: str) -> bool:
    """ASCII digits only: str.isdigit() is also true of '²' and '٣', which int() refuses or reads as 3."""
    return text.isascii() and text.isdigit()


def _parse_port(text: str, where: str) -> int:
    if not _is_number(text) or not 1 <= int(text) <= 65535:
        raise BadInput(f"{where}: bad port {text!r}: expected a number from 1 to 65535")
    return int(text)


def _parse_option(key: str, value: str, where: str) -> tuple[str, object]:
    if key == "slots":
        if not _is_number(value) or int(value) < 1:
            raise BadInput(f"{where}: slots={value!r}: expected a positive integer")
        return key, int(value)
    if key == "region":
        if not _REGION.match(value):
            raise BadInput(f"{where}: region={value!r}: use letters, digits, '.', '_' or '-'")
        return key, value
    if key == "gpus":
        parts = value.split(",")
        if not all(_is_number(p) for p in parts):
            raise BadInput(f"{where}: gpus={value!r}: expected device indices like gpus=0,1,3")
        indices = [int(p) for p in parts]
        if len(set(indices)) != len(indices):
            raise BadInput(f"{where}: gpus={value!r}: an index is listed twice")
        return key, indices
    if key == "price":
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price < 0:
            raise BadInput(f"{where}: price={value!r}: expected US dollars per device-hour, e.g. price=2.5")
        return key, price
    if key in ("python", "identity"):
        if not _PATH.match(value) or ".." in value.split("/"):
            raise BadInput(
                f"{where}: {key}={value!r}: expected a plain path (letters, digits, '._/+-'), "
                "no spaces or shell characters"
            )
        return key, value
    raise BadInput(f"{where}: unknown key {key!r}; known keys: {', '.join(KNOWN_KEYS)}")


def parse_host_line(line: str, where: str) -> HostEntry | None:
    """Parse one line; None for blank and comment lines."""
    text = line.split("#", 1)[0].strip()
    if not text:
        return None
    if len(text) > MAX_LINE_CHARS:
        raise BadInput(f"{where}: a line of {len(text)} characters; a host line is at most {MAX_LINE_CHARS}")
    target, *options = text.split()
    user, host, port = _split_target(target, where)
    fields: dict[str, object] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not value:
            raise BadInput(f"{where}: expected key=value, got {option!r} (values cannot contain spaces)")
        if key in fields:
            raise BadInput(f"{where}: key {key!r} given twice")
        fields.update([_parse_option(key, value, where)])
    gpus = fields.get("gpus")
    slots = fields.get("slots")
    if isinstance(gpus, list) and isinstance(slots, int) and slots != len(gpus):
        raise BadInput(f"{where}: slots={slots} but gpus= lists {len(gpus)} devices; give one or make them agree")
    return HostEntry(
        host=host,
        user=user,
        port=port or DEFAULT_SSH_PORT,
        port_given=port is not None,
        source=where,
        **fields,  # type: ignore[arg-type]
    )


def parse_hosts_text(text: str, filename: str) -> list[HostEntry]:
    """Parse a whole hosts file; duplicates (same name) are an error naming both lines."""
    entries: list[HostEntry] = []
    seen: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{filename}:{number}"
        entry = parse_host_line(line, where)
        if entry is None:
            continue
        key = entry.name
        if key in seen:
            raise BadInput(f"{where}: host {key!r} is already listed at {seen[key]}")
        seen[key] = where
        entries.append(entry)
    if not entries:
        raise BadInput(f"{filename}: no hosts listed; write one host a line, e.g. 'localhost' or 'user@gpu-1 slots=8'")
    return entries


def load_hosts(path: str | Path) -> list[HostEntry]:
    """Read and parse a hosts file (`-` = stdin)."""
    from hetrl_cli.artifacts.io import read_text

    name = "<stdin>" if str(path) == "-" else str(path)
    return parse_hosts_text(read_text(path), name)
