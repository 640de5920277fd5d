"""The cluster spec: which hosts (name, region, CPU share, memory) and which region↔region links (rate, latency).

    subnet: 10.213.0.0/24          # optional; private IPv4, only ever inside the namespaces and our bridge
    cpu_period_ms: 4               # optional; CFS period the CPU shares are enforced over
    pin_cpus: auto                 # optional; auto | true | false: hosts on CPUs of their own (see api.py)
    hosts:
      - {name: fast, region: east, cpu: 1.0}
      - {name: mid, region: east, cpu: 0.5, memory: 2GiB}
      - {name: slow, region: west, cpu: 0.25, price_per_gpu_hour: 0.4}   # optional $/device-hour
    links:
      - {a: east, b: west, bandwidth: 50Mbit/s, latency: 20ms}

Names become network-namespace names, hostnames and cgroup directory names, so they are held to a narrow
character set here, before anything is created. Errors are one line naming the file and the field.

>>> spec = parse_spec_text("hosts: [{name: a, region: r, cpu: 0.5}]", "x.yaml")
>>> (spec.hosts[0].name, spec.hosts[0].cpu, str(spec.subnet))
('a', 0.5, '10.213.0.0/24')
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_core import PydanticCustomError

from hetrl_cli.artifacts.base import Strict
from hetrl_cli.errors import BadInput

HOST_NAME = re.compile(r"^[a-z][a-z0-9-]{0,18}[a-z0-9]$|^[a-z]$")
"""Lower-case hostname label, at most 20 characters: it is also part of a netns and a cgroup name."""
REGION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""The character set hosts.txt accepts for `region=`."""
DEFAULT_SUBNET = "10.213.0.0/24"
MAX_HOSTS = 200
_SIZE = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+)\s*(?P<unit>[kKmMgGtT]i?B?|B)?$")
_SIZE_SCALE = {"": 1, "B": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
MIN_MEMORY_BYTES = 64 << 20
"""Below this sshd plus a Python interpreter do not fit."""
MIN_BURST_BYTES = 1514


def _check_host_name(value: str) -> str:
    if not HOST_NAME.match(value):
        raise PydanticCustomError(
            "host_name",
            "bad host name '{value}': use 1-20 lower-case letters, digits and '-' (a letter first, no '-' last)",
            {"value": value},
        )
    return value


def _check_region(value: str) -> str:
    if not REGION_NAME.match(value):
        raise PydanticCustomError(
            "region", "bad region '{value}': use letters, digits, '.', '_' or '-'", {"value": value}
        )
    return value


def _check_pin_cpus(value: Any) -> str | bool:
    if value == "auto" or isinstance(value, bool):
        return value
    raise PydanticCustomError("pin_cpus", "bad pin_cpus '{value}': use auto, true or false", {"value": value})


def parse_size(value: Any) -> int:
    """`2GiB`, `512MiB`, `64KiB`, `1.5G`, or an integer → bytes (binary prefixes with `i`, SI without)."""
    if isinstance(value, bool):
        raise PydanticCustomError("size", "bad size '{value}': expected e.g. 2GiB, 512MiB or 64KiB", {"value": value})
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE.match(str(value).strip())
    if not match:
        raise PydanticCustomError(
            "size", "bad size '{value}': expected e.g. 2GiB, 512MiB, 1.5G or a number of bytes", {"value": value}
        )
    unit = match["unit"] or ""
    prefix = unit[0].lower() if unit and unit != "B" else ""
    scale = 1024 ** ("kmgt".index(prefix) + 1) if "i" in unit else _SIZE_SCALE[prefix]
    return int(float(match["num"]) * scale)


def parse_memory(value: Any) -> int:
    """A memory limit: a size of at least MIN_MEMORY_BYTES."""
    size = parse_size(value)
    if size < MIN_MEMORY_BYTES:
        raise PydanticCustomError(
            "memory", "memory '{value}' is below the 64MiB that sshd and Python need", {"value": value}
        )
    return size


def parse_burst(value: Any) -> int:
    """A tc burst: a size of at least one full-size Ethernet frame."""
    size = parse_size(value)
    if size < MIN_BURST_BYTES:
        raise PydanticCustomError("burst", "burst '{value}' is below one 1514-byte frame", {"value": value})
    return size


def _check_subnet(value: Any) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(str(value), strict=True)
    except ValueError:
        raise PydanticCustomError(
            "subnet", "bad subnet '{value}': expected a private IPv4 network like 10.213.0.0/24", {"value": value}
        ) from None
    if not net.is_private or net.is_loopback or net.is_link_local or net.is_multicast or net.prefixlen < 16:
        raise PydanticCustomError(
            "subnet",
            "subnet '{value}' must be a private IPv4 network (10/8, 172.16/12 or 192.168/16) of /16 to /29",
            {"value": str(value)},
        )
    if net.prefixlen > 29:
        raise PydanticCustomError("subnet", "subnet '{value}' is too small: use /16 to /29", {"value": str(value)})
    return net


HostName = Annotated[str, AfterValidator(_check_host_name)]
Region = Annotated[str, AfterValidator(_check_region)]
Memory = Annotated[int, BeforeValidator(parse_memory)]
Burst = Annotated[int, BeforeValidator(parse_burst)]
Subnet = Annotated[ipaddress.IPv4Network, BeforeValidator(_check_subnet)]


class HostSpec(Strict):
    """One emulated host."""

    name: HostName
    """Hostname inside the host, and part of its netns (`hetrl-emu-NAME`) and cgroup names."""
    region: Region
    """Site label: links between regions are the ones the spec shapes."""
    cpu: float = Field(gt=0, le=1024)
    """Fraction of one core the host's processes may use in total (1.0 = one core, 0.25 = a quarter)."""
    memory: Memory | None = None
    """Memory limit of the host's processes (e.g. 2GiB); None = no limit."""
    price_per_gpu_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """US dollars per hour of each of the host's devices, as cluster.yaml's node groups give it (written to
    hosts.txt as `price=`, so `hetrl profile` records it and `plan --objective cost` can price the host)."""


class LinkSpec(Strict):
    """The link between two regions (a == b shapes traffic between hosts of one region)."""

    a: Region
    """One region."""
    b: Region
    """The other region."""
    bandwidth: str | float | None = None
    """Rate each host gets towards the other region (e.g. 50Mbit/s, 1Gbps, or bytes/s); None = not shaped."""
    latency: str | float | None = None
    """One-way latency (e.g. 20ms): added by the userspace delay line (delays.py) and written to links.yaml."""
    burst: Burst | None = None
    """tc burst in bytes; None = max(16 KiB, 1 ms at the rate)."""


class ClusterSpec(Strict):
    """A whole emulated cluster."""

    subnet: Subnet = Field(default_factory=lambda: ipaddress.IPv4Network(DEFAULT_SUBNET))
    """Private network for the hosts; .1 is the bridge (this machine's side), hosts get .2, .3, ..."""
    cpu_period_ms: float = Field(default=4.0, ge=1, le=1000)
    """CFS period: a short one makes a host evenly slow rather than fast in bursts of `cpu × period`; raised
    per host where `cpu × period` would be under the kernel's 1 ms minimum quota (e.g. 10 ms for cpu 0.1)."""
    pin_cpus: Annotated[Literal["auto"] | bool, BeforeValidator(_check_pin_cpus)] = "auto"
    """Pin hosts to CPUs (affinity), so that a busy host does not run on another's CPU. auto: only where every
    host gets whole CPUs of its own; true: packed by share, hosts sharing a CPU where needed, or refused;
    false: never (api.host_cpu_sets says why auto does not share)."""
    hosts: list[HostSpec] = Field(min_length=1, max_length=MAX_HOSTS)
    """The hosts, in hosts.txt order."""
    links: list[LinkSpec] = Field(default_factory=list)
    """Region↔region links; pairs not listed are not shaped (veth speed)."""


# ---- derived values -------------------------------------------------------------------------------------


def link_bandwidth_Bps(link: LinkSpec, where: str) -> float | None:
    """The link's rate in bytes/s (None = not shaped)."""
    from hetrl_cli.profiling.links import parse_bandwidth

    return None if link.bandwidth is None else parse_bandwidth(link.bandwidth, where)


def link_latency_s(link: LinkSpec, where: str) -> float | None:
    """The link's one-way latency in seconds (None = not given)."""
    from hetrl_cli.profiling.links import parse_latency

    return None if link.latency is None else parse_latency(link.latency, where)


# ---- loading --------------------------------------------------------------------------------------------


def parse_spec_text(text: str, where: str) -> ClusterSpec:
    """Parse and check a spec; every error is one BadInput line starting with `where`."""
    from hetrl_cli.artifacts.yamltext import load_yaml_text

    try:
        data = load_yaml_text(text, where)  # a YAML bomb is refused, not expanded
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"{where}{f':{mark.line + 1}' if mark else ''}: not valid YAML") from None
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a mapping with 'hosts:' (and optionally 'links:', 'subnet:')")
    try:
        spec = ClusterSpec.model_validate(data)
    except ValidationError as exc:
        from hetrl_cli.artifacts.io import format_validation_error

        raise BadInput(format_validation_error(where, exc)) from None
    _check_cross_fields(spec, where)
    return spec


def _check_cross_fields(spec: ClusterSpec, where: str) -> None:
    """What one field cannot know: duplicates, unknown regions, address room, unit strings."""
    seen: dict[str, int] = {}
    for i, host in enumerate(spec.hosts):
        if host.name in seen:
            raise BadInput(
                f"{where}: field 'hosts.{i}.name': host {host.name!r} is already defined at hosts.{seen[host.name]}"
            )
        seen[host.name] = i
    room = spec.subnet.num_addresses - 3  # network, broadcast, bridge
    if len(spec.hosts) > room:
        raise BadInput(f"{where}: field 'subnet': {spec.subnet} holds {room} hosts, the spec has {len(spec.hosts)}")
    regions = sorted({h.region for h in spec.hosts})
    pairs: dict[frozenset[str], int] = {}
    for i, link in enumerate(spec.links):
        for end in ("a", "b"):
            region = getattr(link, end)
            if region not in regions:
                raise BadInput(
                    f"{where}: field 'links.{i}.{end}': unknown region {region!r}; hosts are in {', '.join(regions)}"
                )
        pair = frozenset((link.a, link.b))
        if pair in pairs:
            raise BadInput(f"{where}: field 'links.{i}': {link.a} <-> {link.b} is already given at links.{pairs[pair]}")
        pairs[pair] = i
        if link.bandwidth is None and link.latency is None:
            raise BadInput(f"{where}: field 'links.{i}': give bandwidth, latency or both")
        link_bandwidth_Bps(link, f"{where}: field 'links.{i}.bandwidth'")
        link_latency_s(link, f"{where}: field 'links.{i}.latency'")


def load_spec(path: Path | str) -> ClusterSpec:
    """Read and check a spec file."""
    from hetrl_cli.artifacts.io import read_text

    return parse_spec_text(read_text(path), str(path))
