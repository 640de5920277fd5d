"""The cluster spec: what parses, and the exact one-line error for each kind of mistake."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from hetrl_cli.emulate.spec import load_spec, parse_memory, parse_spec_text
from hetrl_cli.errors import BadInput

from .conftest import EXAMPLE

ONE_HOST = "hosts: [{name: a, region: r, cpu: 1}]\n"


def test_example_spec_is_three_hosts_with_unequal_shares_in_two_regions_and_one_slow_link() -> None:
    spec = load_spec(EXAMPLE)
    assert [(h.name, h.region, h.cpu) for h in spec.hosts] == [
        ("fast", "east", 1.0),
        ("mid", "east", 0.5),
        ("slow", "west", 0.25),
    ]
    assert spec.subnet == ipaddress.IPv4Network("10.213.0.0/24")
    assert spec.cpu_period_ms == 4
    [link] = spec.links
    assert (link.a, link.b, link.bandwidth, link.latency) == ("east", "west", "50Mbit/s", "20ms")


def test_defaults_and_optional_fields() -> None:
    spec = parse_spec_text(
        "hosts:\n  - {name: a-1, region: us.east_1, cpu: 0.5, memory: 512MiB}\n  - {name: b, region: eu, cpu: 2}\n"
        "links:\n  - {a: us.east_1, b: eu, bandwidth: 1Gbps}\n  - {a: eu, b: eu, latency: 1ms, burst: 64KiB}\n",
        "s.yaml",
    )
    assert spec.hosts[0].memory == 512 << 20 and spec.hosts[1].memory is None
    assert str(spec.subnet) == "10.213.0.0/24"
    assert spec.links[1].burst == 64 << 10


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2GiB", 2 << 30),
        ("512MiB", 512 << 20),
        ("1.5G", 1_500_000_000),
        ("100M", 100_000_000),
        ("1GB", 10**9),
        (1 << 30, 1 << 30),
    ],
)
def test_memory_sizes(text: str | int, size: int) -> None:
    assert parse_memory(text) == size


BAD = [
    ("hosts: [", "s.yaml:1: not valid YAML"),
    ("- a\n", "s.yaml: expected a mapping with 'hosts:' (and optionally 'links:', 'subnet:')"),
    ("hosts: []\n", "s.yaml: field 'hosts': List should have at least 1 item after validation, not 0"),
    ("hosts: [{name: A, region: r, cpu: 1}]\n",
     "s.yaml: field 'hosts.0.name': bad host name 'A': use 1-20 lower-case letters, digits and '-' "
     "(a letter first, no '-' last)"),
    ("hosts: [{name: 'a;rm', region: r, cpu: 1}]\n",
     "s.yaml: field 'hosts.0.name': bad host name 'a;rm': use 1-20 lower-case letters, digits and '-' "
     "(a letter first, no '-' last)"),
    ("hosts: [{name: a, region: 'r r', cpu: 1}]\n",
     "s.yaml: field 'hosts.0.region': bad region 'r r': use letters, digits, '.', '_' or '-'"),
    ("hosts: [{name: a, region: r, cpu: 0}]\n", "s.yaml: field 'hosts.0.cpu': Input should be greater than 0"),
    ("hosts: [{name: a, region: r}]\n", "s.yaml: field 'hosts.0.cpu': Field required"),
    ("hosts: [{name: a, region: r, cpu: 1, gpus: 2}]\n",
     "s.yaml: field 'hosts.0.gpus': Extra inputs are not permitted"),
    ("hosts: [{name: a, region: r, cpu: 1, memory: lots}]\n",
     "s.yaml: field 'hosts.0.memory': bad size 'lots': expected e.g. 2GiB, 512MiB, 1.5G or a number of bytes"),
    (ONE_HOST + "links: [{a: r, b: r, bandwidth: 1Gbps, burst: 100}]\n",
     "s.yaml: field 'links.0.burst': burst '100' is below one 1514-byte frame"),
    ("hosts: [{name: a, region: r, cpu: 1, memory: 1MiB}]\n",
     "s.yaml: field 'hosts.0.memory': memory '1MiB' is below the 64MiB that sshd and Python need"),
    ("hosts: [{name: a, region: r, cpu: 1}, {name: a, region: s, cpu: 1}]\n",
     "s.yaml: field 'hosts.1.name': host 'a' is already defined at hosts.0"),
    ("subnet: 8.8.8.0/24\n" + ONE_HOST,
     "s.yaml: field 'subnet': subnet '8.8.8.0/24' must be a private IPv4 network (10/8, 172.16/12 or 192.168/16) "
     "of /16 to /29"),
    ("subnet: 10.1.2.3/24\n" + ONE_HOST,
     "s.yaml: field 'subnet': bad subnet '10.1.2.3/24': expected a private IPv4 network like 10.213.0.0/24"),
    ("subnet: 10.1.2.0/30\n" + ONE_HOST, "s.yaml: field 'subnet': subnet '10.1.2.0/30' is too small: use /16 to /29"),
    ("subnet: 10.1.2.0/29\nhosts: [" + ", ".join(f"{{name: h{i}, region: r, cpu: 1}}" for i in range(6)) + "]\n",
     "s.yaml: field 'subnet': 10.1.2.0/29 holds 5 hosts, the spec has 6"),
    ("pin_cpus: sometimes\n" + ONE_HOST, "s.yaml: field 'pin_cpus': bad pin_cpus 'sometimes': use auto, true or false"),
    ("pin_cpus: 2\n" + ONE_HOST, "s.yaml: field 'pin_cpus': bad pin_cpus '2': use auto, true or false"),
    ("cpu_period_ms: 0.5\n" + ONE_HOST,
     "s.yaml: field 'cpu_period_ms': Input should be greater than or equal to 1"),
    (ONE_HOST + "links: [{a: r, b: x, bandwidth: 1Gbps}]\n",
     "s.yaml: field 'links.0.b': unknown region 'x'; hosts are in r"),
    (ONE_HOST + "links: [{a: r, b: r}]\n", "s.yaml: field 'links.0': give bandwidth, latency or both"),
    (ONE_HOST + "links: [{a: r, b: r, bandwidth: 1Gbps}, {a: r, b: r, latency: 1ms}]\n",
     "s.yaml: field 'links.1': r <-> r is already given at links.0"),
    (ONE_HOST + "links: [{a: r, b: r, bandwidth: fast}]\n",
     "s.yaml: field 'links.0.bandwidth': bad bandwidth 'fast': expected \"5Gbps\", \"100Mbps\", \"25 GB/s\" or a "
     "number of bytes/s"),
    (ONE_HOST + "links: [{a: r, b: r, latency: soon}]\n",
     "s.yaml: field 'links.0.latency': bad latency 'soon': expected \"10ms\", \"50us\", \"0.01s\" or a number of "
     "seconds"),
    (ONE_HOST + "links: [{a: r, b: r, delay: 1ms}]\n", "s.yaml: field 'links.0.delay': Extra inputs are not permitted"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m.split(": ", 1)[1][:40] for _, m in BAD])
def test_bad_specs_are_one_line_naming_file_and_field(text: str, message: str) -> None:
    with pytest.raises(BadInput) as err:
        parse_spec_text(text, "s.yaml")
    assert str(err.value) == message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"nope.yaml: no such file$"):
        load_spec(tmp_path / "nope.yaml")
