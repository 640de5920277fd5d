"""The example cluster, up for real: SSH with strict host keys, own hostnames, real CPU caps, real slow link,
the files it writes, and `hetrl profile` seeing the differences.

Tolerances are stated next to each assert. CPU caps are upper bounds the kernel enforces, so their upper
limits are tight; lower limits are loose because this 2-core machine is shared with other test processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.artifacts.hosts import load_hosts
from hetrl_cli.emulate.api import EmulatedCluster, EmulatedHost, host_cpu_sets
from hetrl_cli.emulate.spec import load_spec
from hetrl_cli.profiling.links import load_link_overrides

from .conftest import EXAMPLE, remote_affinity, ssh, ssh_argv, ssh_popen

pytestmark = [pytest.mark.slow, pytest.mark.root]

SLOW_LINK_Bps = 50e6 / 8
"""The example's east <-> west bandwidth."""
RATE_TOLERANCE = 0.30
"""A shaped TCP transfer runs within ±30 % of the configured rate (measured: 47-49 Mbit/s of 50)."""

BUSY = """
import os, sys, time
seconds = float(sys.argv[1])
wall0, cpu0 = time.monotonic(), os.times()
while time.monotonic() - wall0 < seconds:
    pass
cpu1, wall = os.times(), time.monotonic() - wall0
print((cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall)
"""

# A one-connection bulk receiver and sender; the receiver times from the first byte to EOF.
TRANSFER = """
import socket, sys, time
if sys.argv[1] == "serve":
    with socket.create_server((sys.argv[2], 0)) as server:
        print(server.getsockname()[1], flush=True)
        server.settimeout(30)
        conn, _ = server.accept()
        total, start = 0, None
        while chunk := conn.recv(1 << 20):
            start = start or time.monotonic()
            total += len(chunk)
        print(total / (time.monotonic() - start), flush=True)
else:
    conn = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=30)
    block, end = b"x" * (1 << 16), time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        conn.sendall(block)
    conn.close()
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The helper scripts on the shared filesystem, where every emulated host sees them."""
    root = tmp_path_factory.mktemp("scripts")
    (root / "busy.py").write_text(BUSY)
    (root / "transfer.py").write_text(TRANSFER)
    return {"busy": root / "busy.py", "transfer": root / "transfer.py"}


def host(cluster: EmulatedCluster, name: str) -> EmulatedHost:
    return next(h for h in cluster.hosts if h.name == name)


def test_every_host_answers_over_ssh_with_its_own_hostname_address_and_cgroup(cluster: EmulatedCluster) -> None:
    for h in cluster.hosts:
        done = ssh(cluster, h.name, "hostname; cat /proc/self/cgroup; ip -4 -o addr show dev eth0; ip route")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == h.name
        assert any(line.endswith(f":/hetrl-emu-{h.name}") and ":cpu" in line for line in lines), done.stdout
        assert f"inet {h.address}/24" in done.stdout
        routes = [line for line in lines if line.startswith(("default", "10.", "0.0.0.0"))]
        assert routes == [f"10.213.0.0/24 dev eth0 proto kernel scope link src {h.address} "], routes  # no way out
    assert sorted(h.name for h in cluster.hosts) == ["fast", "mid", "slow"]
    assert len({h.address for h in cluster.hosts}) == 3


def test_each_host_runs_on_the_cpus_pin_cpus_gives_it(cluster: EmulatedCluster) -> None:
    """What a process started over SSH may run on: the example's default `pin_cpus: auto` pins only where each
    host gets CPUs of its own (4 or more CPUs here); on fewer every host keeps all of them."""
    allowed = sorted(os.sched_getaffinity(0))
    expected = host_cpu_sets(load_spec(EXAMPLE), allowed, str(EXAMPLE))
    for h, cpus in zip(cluster.hosts, expected, strict=True):
        assert h.cpus == cpus
        assert remote_affinity(cluster, h.name) == str(list(cpus or allowed)), h.name


def test_a_wrong_host_key_is_refused(cluster: EmulatedCluster, tmp_path: Path) -> None:
    """known_hosts holds each host's own key: presenting host fast's key for mid fails strict checking."""
    lines = cluster.known_hosts.read_text().splitlines()
    swapped = tmp_path / "known_hosts"
    swapped.write_text(f"{lines[1].split()[0]} {' '.join(lines[0].split()[1:])}\n")
    argv = [a.replace(str(cluster.known_hosts), str(swapped)) for a in ssh_argv(cluster, "mid", "true")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in done.stderr


@pytest.mark.parametrize(("name", "low", "high"), [("slow", 0.15, 0.40), ("mid", 0.30, 0.65)])
def test_cpu_share_is_enforced(
    cluster: EmulatedCluster, scripts: dict[str, Path], name: str, low: float, high: float
) -> None:
    """A busy loop on a host gets its share of one core: CPU seconds / wall seconds over 2 s (configured
    0.25 and 0.5; measured 0.24-0.25 and 0.49)."""
    done = ssh(cluster, name, sys.executable, str(scripts["busy"]), "2")
    assert done.returncode == 0, done.stderr
    ratio = float(done.stdout)
    assert low <= ratio <= high, f"{name}: {ratio:.3f} of a core, configured {host(cluster, name).cpu}"
    stat = Path(f"/sys/fs/cgroup/cpu/hetrl-emu-{name}/cpu.stat")
    if stat.is_file():  # cgroup v1: the kernel says it throttled the group
        assert int(re.search(r"nr_throttled (\d+)", stat.read_text())[1]) > 0


def transfer_Bps(cluster: EmulatedCluster, scripts: dict[str, Path], src: str, dst: str, seconds: float) -> float:
    """Bytes/s of one TCP stream from host `src` to host `dst`, both ends started over SSH."""
    server = ssh_popen(cluster, dst, sys.executable, str(scripts["transfer"]), "serve", host(cluster, dst).address)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        assert port.isdigit(), server.stderr.read() if server.stderr else ""
        args = ["send", host(cluster, dst).address, port, str(seconds)]
        client = ssh(cluster, src, sys.executable, str(scripts["transfer"]), *args, timeout=seconds + 30)
        assert client.returncode == 0, client.stderr
        out, err = server.communicate(timeout=30)
        assert server.returncode == 0, err
        return float(out)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


@pytest.mark.parametrize(("src", "dst"), [("fast", "slow"), ("slow", "mid")])
def test_the_slow_link_runs_at_its_rate_both_ways(
    cluster: EmulatedCluster, scripts: dict[str, Path], src: str, dst: str
) -> None:
    rate = transfer_Bps(cluster, scripts, src, dst, seconds=2.0)
    assert abs(rate / SLOW_LINK_Bps - 1) <= RATE_TOLERANCE, f"{src}->{dst}: {rate * 8 / 1e6:.1f} Mbit/s, configured 50"


def test_inside_a_region_is_much_faster(cluster: EmulatedCluster, scripts: dict[str, Path]) -> None:
    """Not shaped: veth speed, capped only by the hosts' CPU (measured ~5 Gbit/s; asserted ≥ 10× the slow link)."""
    rate = transfer_Bps(cluster, scripts, "fast", "mid", seconds=1.0)
    assert rate >= 10 * SLOW_LINK_Bps, f"fast->mid: {rate * 8 / 1e6:.0f} Mbit/s"


def test_written_files_are_what_hetrl_reads(cluster: EmulatedCluster) -> None:
    entries = load_hosts(cluster.hosts_file)
    assert [(e.user, e.host, e.port, e.region) for e in entries] == [
        ("root", h.address, 22, h.region) for h in cluster.hosts
    ]
    assert all(e.identity == str(cluster.identity) and e.python == sys.executable for e in entries)
    [latency_only] = load_link_overrides(cluster.links_file, entries)
    assert (latency_only.a, latency_only.b) == ("region:east", "region:west")
    assert (latency_only.bandwidth_Bps, latency_only.latency_s) == (None, 0.02)
    [configured] = load_link_overrides(cluster.links_configured_file, entries)
    assert (configured.bandwidth_Bps, configured.latency_s) == (SLOW_LINK_Bps, 0.02)
    state = json.loads((cluster.state_dir / "state.json").read_text())
    assert state["complete"] is True
    assert {r["type"] for r in state["resources"]} == {"path", "bridge", "netns", "veth", "cgroup", "process"}
    assert oct(cluster.identity.stat().st_mode & 0o777) == "0o600"


Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]

PEAK = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(512, 512), torch.randn(512, 512)
best = float("inf")
for _ in range(40):
    start = time.perf_counter(); torch.mm(a, b); best = min(best, time.perf_counter() - start)
print(2 * 512**3 / best / 1e9)
"""
CAP_TOLERANCE = 1.5
"""A capped host measures at most 1.5 × its share of the uncapped single-core peak (measured: ~1.0 ×)."""


UNCAPPED_RATE = """
import torch
from hetrl_cli.profiling import probe
torch.set_num_threads(1)
print(max(probe.{call} for _ in range(3)))
"""


def uncapped_rate(call: str) -> float:
    """A probe rate (`call` on hetrl_cli.profiling.probe, e.g. "decode_steps_per_s(torch, 0.2)") in one
    uncapped single-thread process: the best of three runs."""
    return _python_number(UNCAPPED_RATE.format(call=call))


def _python_number(script: str) -> float:
    """What `script` prints, run by this interpreter in a process of its own (uncapped)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return float(done.stdout)


def single_core_peak_gflops() -> float:
    """Best-case fp32 GFLOP/s of one uncapped core on the probe's quick matmul (the fastest of 40 steps, so
    other load on the machine hardly lowers it)."""
    return _python_number(PEAK)


def test_hetrl_profile_sees_the_slow_hosts_and_the_slow_link(
    cluster: EmulatedCluster, hetrl: Hetrl, tmp_path: Path
) -> None:
    """The issue's check, through the real CLI with quick probes:
    - cores: exactly the configured shares (the probe reads the cgroup quota);
    - GFLOP/s, decode steps/s and forward tokens/s: each capped host measures at most 1.5 × its share of one
      uncapped core's.
      The cap is an upper bound the kernel enforces; other load only lowers a measurement, so a lower bound
      or the order of close hosts would be flaky on a shared 2-core machine (the three probes alone want
      1.75 cores);
    - links: the two east <-> west pairs measure within ±30 % of 50 Mbit/s and carry the spec's 20 ms latency
      from links.yaml; the east pair measures ≥ 10× faster with a sub-millisecond latency."""
    peak = single_core_peak_gflops()
    decode_peak = uncapped_rate("decode_steps_per_s(torch, 0.2)")
    forward_peak = uncapped_rate("forward_tokens_per_s(torch, 4)")
    out = tmp_path / "emu.json"
    done = hetrl(
        "profile", cluster.hosts_file, "--known-hosts", cluster.known_hosts, "--links", cluster.links_file,
        "--timeout", "120", "-o", out, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    by_address = {f"{h.address}:22": h for h in cluster.hosts}
    devices = {by_address[d["id"].split("/")[0]].name: d for d in profile["devices"]}
    assert {name: d["cores"] for name, d in devices.items()} == {h.name: h.cpu for h in cluster.hosts}
    gflops = {name: d["measured_tflops"]["fp32"] * 1e3 for name, d in devices.items()}
    for h in cluster.hosts:
        bound = CAP_TOLERANCE * min(h.cpu, 1.0) * peak
        assert 0 < gflops[h.name] <= bound, f"{h.name}: {gflops[h.name]:.1f} GFLOP/s > {bound:.1f} (peak {peak:.1f})"
        rate, rate_bound = devices[h.name]["decode_steps_per_s"], CAP_TOLERANCE * min(h.cpu, 1.0) * decode_peak
        assert 0 < rate <= rate_bound, f"{h.name}: {rate:.1f} decode steps/s > {rate_bound:.1f} ({decode_peak:.1f})"
        tokens, tokens_bound = devices[h.name]["forward_tokens_per_s"], CAP_TOLERANCE * min(h.cpu, 1.0) * forward_peak
        assert 0 < tokens <= tokens_bound, f"{h.name}: {tokens:.0f} tokens/s > {tokens_bound:.0f} ({forward_peak:.0f})"
    links: dict[frozenset[str], list[dict]] = {}
    for lk in profile["links"]:
        links.setdefault(frozenset((by_address[lk["a"]].region, by_address[lk["b"]].region)), []).append(lk)
    wan = links[frozenset(("east", "west"))]
    assert len(wan) == 2
    for lk in wan:
        assert abs(lk["bandwidth_Bps"] / SLOW_LINK_Bps - 1) <= RATE_TOLERANCE, lk
        assert lk["latency_s"] == 0.02 and lk["source"] == "override"
    [lan] = links[frozenset(("east",))]
    assert lan["bandwidth_Bps"] >= 10 * SLOW_LINK_Bps and lan["latency_s"] < 1e-3 and lan["source"] == "measured"
