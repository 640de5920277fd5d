"""The spec's latency, emulated by the userspace delay line: which host pairs it delays and on which device
their rate is shaped, the line's routing (on socket pairs standing in for TUN devices), and up/down with the
line: `down` stops it (also after a crash or without state.json), and a stopped line cuts the link rather than
leaving it undelayed. The example cluster's round trips and profile: test_delay_cluster.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.emulate import delays, netns
from hetrl_cli.emulate.api import emulate_down, emulate_up, shaping_plan
from hetrl_cli.emulate.delayline import VNET_HDR, DelayLine, End, Lane, load_config, write_config
from hetrl_cli.emulate.spec import load_spec, parse_spec_text
from hetrl_cli.emulate.system import pid_cmdline

from .conftest import EXAMPLE, leftovers, sshd_pids

LATENCY_S = 0.020
"""The example's east <-> west one-way latency."""

# ---- which pairs, which devices ----------------------------------------------------------------------------


def test_the_example_delays_every_cross_region_pair_both_ways_and_nothing_inside_a_region() -> None:
    pairs = delays.delay_plan(load_spec(EXAMPLE))
    assert sorted((p.src, p.dst, p.delay_s) for p in pairs) == [
        ("fast", "slow", LATENCY_S),
        ("mid", "slow", LATENCY_S),
        ("slow", "fast", LATENCY_S),
        ("slow", "mid", LATENCY_S),
    ]


def test_links_without_latency_are_not_delayed_and_a_same_region_link_delays_its_hosts() -> None:
    spec = parse_spec_text(
        """
hosts: [{name: a1, region: a, cpu: 0.1}, {name: a2, region: a, cpu: 0.1}, {name: b1, region: b, cpu: 0.1}]
links: [{a: a, b: b, bandwidth: 1Gbps}, {a: a, b: a, latency: 5ms}]
""",
        "s.yaml",
    )
    assert {(p.src, p.dst, p.delay_s) for p in delays.delay_plan(spec)} == {("a1", "a2", 0.005), ("a2", "a1", 0.005)}


def test_a_delayed_links_rate_is_shaped_on_the_delay_device() -> None:
    """Its traffic leaves by delay0, so its htb class must be there; an undelayed link's stays on eth0."""
    spec = parse_spec_text(
        """
hosts: [{name: a1, region: a, cpu: 0.1}, {name: b1, region: b, cpu: 0.1}, {name: c1, region: c, cpu: 0.1}]
links: [{a: a, b: b, bandwidth: 50Mbit/s, latency: 20ms}, {a: a, b: c, bandwidth: 1Gbps}]
""",
        "s.yaml",
    )
    addresses = {"a1": "10.0.0.2", "b1": "10.0.0.3", "c1": "10.0.0.4"}
    delayed = delays.delayed_destinations(spec, addresses)
    assert delayed == {"a1": frozenset({"10.0.0.3"}), "b1": frozenset({"10.0.0.2"})}
    plan = shaping_plan(spec, addresses)
    assert [(c.region, netns.shaping_device(c, delayed["a1"])) for c in plan["a1"]] == [
        ("b", netns.DELAY_DEVICE),
        ("c", "eth0"),
    ]
    assert [netns.shaping_device(c, frozenset()) for c in plan["c1"]] == ["eth0"]


def test_the_config_round_trips(tmp_path: Path) -> None:
    ends = [End("fast", "hetrl-emu-fast", "10.213.0.2"), End("slow", "hetrl-emu-slow", "10.213.0.4")]
    write_config(tmp_path / "c.json", "delay0", ends, [("fast", "slow", 0.02), ("slow", "fast", 0.02)])
    device, loaded, lanes = load_config(tmp_path / "c.json")
    assert (device, loaded) == ("delay0", ends)
    assert lanes == [Lane(0, 1, 0.02), Lane(1, 0, 0.02)]


# ---- the routed line on socket pairs -----------------------------------------------------------------------


def ipv4_packet(dst: str, payload: bytes) -> bytes:
    """A vnet header and an IPv4 header (only the version and the destination matter to the line)."""
    header = bytearray(20)
    header[0] = 0x45
    header[16:20] = bytes(int(octet) for octet in dst.split("."))
    return bytes(VNET_HDR) + bytes(header) + payload


def test_the_routed_line_sends_each_packet_to_its_destination_after_that_lanes_delay() -> None:
    """Three ends; a -> b held 0.1 s, a -> c 0.3 s, nothing a -> a or b -> c: unroutable, dropped."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    for _, line_end in pairs:
        line_end.setblocking(False)
    addresses = ["10.9.0.2", "10.9.0.3", "10.9.0.4"]
    lanes = [Lane(0, 1, 0.1), Lane(0, 2, 0.3), Lane(1, 0, 0.1)]
    line = DelayLine.routed([end.fileno() for _, end in pairs], lanes, addresses)
    stop_read, stop_write = os.pipe()
    thread = threading.Thread(target=line.run, args=(stop_read,), daemon=True)
    thread.start()
    (a, _), (b, _), (c, _) = pairs
    try:
        to_c, to_b = ipv4_packet("10.9.0.4", b"for c"), ipv4_packet("10.9.0.3", b"for b")
        start = time.monotonic()
        a.send(to_c)
        a.send(to_b)
        a.send(ipv4_packet("10.9.0.2", b"to itself"))
        b.send(ipv4_packet("10.9.0.4", b"no lane"))
        b.settimeout(5)
        c.settimeout(5)
        assert b.recv(100) == to_b
        b_at = time.monotonic() - start
        assert c.recv(100) == to_c
        c_at = time.monotonic() - start
        assert 0.1 <= b_at < 0.25 and 0.3 <= c_at < 0.5, (b_at, c_at)  # the later-sent packet came first
        b.send(ipv4_packet("10.9.0.2", b"back"))
        a.settimeout(5)
        assert a.recv(100).endswith(b"back")
    finally:
        os.write(stop_write, b"x")
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert line.stats()["unroutable"] == [1, 1, 0] and line.stats()["packets"] == [2, 1, 0]


# ---- up and down with the line -----------------------------------------------------------------------------

DELAYED = """
subnet: 10.213.0.0/24
hosts:
  - {name: big, region: a, cpu: 1.0}
  - {name: small, region: b, cpu: 0.5}
links:
  - {a: a, b: b, bandwidth: 100Mbit/s, latency: 5ms}
"""


def line_pids(state_dir: Path) -> list[int]:
    """Live delay line processes started with a config in `state_dir`."""
    marker = str(state_dir / delays.CONFIG)
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        cmdline = pid_cmdline(int(proc.name)) or ""
        if marker in cmdline and "hetrl_cli.emulate.delayline" in cmdline:
            with_state = Path(f"/proc/{proc.name}/stat")
            try:
                if with_state.read_text().rpartition(")")[2].split()[0] != "Z":
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def emulated(test: Callable[..., None]) -> Callable[..., None]:
    return pytest.mark.slow(pytest.mark.root(pytest.mark.usefixtures("need_emulation")(test)))


@pytest.fixture
def delayed_spec(tmp_path: Path) -> Path:
    path = tmp_path / "delayed.yaml"
    path.write_text(DELAYED)
    return path


@emulated
def test_down_stops_the_line_and_removes_everything(delayed_spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cluster = emulate_up(delayed_spec, state)
    try:
        assert line_pids(state) == [cluster.delay_line_pid]
        assert any("one way (delay line)" in line for line in cluster.summary())
    finally:
        removed = emulate_down(state)
    assert f"delay line pid {cluster.delay_line_pid}" in removed
    assert any(r.startswith("cgroup ") and r.endswith("hetrl-emu-_delayline") for r in removed)
    assert line_pids(state) == [] and leftovers() == [] and not state.exists()


CRASH_AFTER_LINE = """
import os, signal, sys
from pathlib import Path
from hetrl_cli.emulate import api, sshd
sshd.wait_listening = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die after the line started
api.emulate_up(Path(sys.argv[1]), Path(sys.argv[2]))
"""


@emulated
def test_down_after_a_crashed_up_stops_the_line(delayed_spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_LINE, str(delayed_spec), str(state)], capture_output=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert line_pids(state)
    emulate_down(state)
    assert line_pids(state) == [] and leftovers() == [] and sshd_pids(state) == []


@emulated
def test_down_without_state_finds_the_line_by_its_cgroup(delayed_spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    emulate_up(delayed_spec, state)
    (state / "state.json").unlink()
    removed = emulate_down(tmp_path / "elsewhere")
    assert any(r.endswith("hetrl-emu-_delayline") for r in removed)
    assert line_pids(state) == [] and leftovers() == []


@emulated
def test_a_stopped_line_cuts_the_link_rather_than_leaving_it_undelayed(delayed_spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cluster = emulate_up(delayed_spec, state)
    try:
        assert cluster.delay_line_pid is not None
        os.kill(cluster.delay_line_pid, signal.SIGKILL)
        os.waitpid(cluster.delay_line_pid, 0)  # our child (up ran here): reap it
        small = next(h.address for h in cluster.hosts if h.name == "small")
        script = f"import socket; socket.create_connection(({small!r}, 22), timeout=2)"
        argv = ["ip", "netns", "exec", netns.netns_name("big"), sys.executable, "-c", script]
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0 and "timed out" in probe.stderr, probe.stderr
    finally:
        emulate_down(state)
    assert leftovers() == []
