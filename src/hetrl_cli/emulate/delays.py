"""The spec's latencies, emulated: which host pairs are delayed, their `delay0` devices, and the delay line process.

A link with a latency delays every packet between a host of one of its regions and a host of the other by that
latency, one way (so a ping across it takes twice the latency). `up` makes a persistent TUN device `delay0` and
the policy rules to it in each host with a delayed link (netns.create_delay_device), then starts ONE delay line
process for the cluster (`python -m hetrl_cli.emulate.delayline --config STATE/delay-line.json`), which attaches
to every `delay0` and forwards host to host. The rates stay with htb (on `delay0` for a delayed link), so the
line only delays.

The line runs in a cgroup of its own, `hetrl-emu-_delayline` (no host name starts with '_'), without limits: it
is not any host's work, and `down` finds and stops it by that name even without state.json. It is recorded in
state.json as a process (marker: its config path) and that cgroup.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hetrl_cli.emulate import cgroups, netns
from hetrl_cli.emulate.delayline import READY, End, write_config
from hetrl_cli.emulate.spec import ClusterSpec, link_latency_s
from hetrl_cli.emulate.state import State
from hetrl_cli.errors import HetrlError

CONFIG = "delay-line.json"
LOG = "delay-line.log"
GROUP = "_delayline"
"""The line's cgroup is PREFIX + this."""
READY_TIMEOUT_S = 15.0
LINE_WEIGHT = 10
"""The line's cgroup weighs 10 default groups and the process runs at nice -10: a packet's delay should not grow
with the box's load. On the 2-core box at load ~10 a line of default weight measured round trips of 40.5 ms
median mostly, but 70.8 ms in one test run (2 x 20 ms configured). Cheap: at the emulated rates the line is idle
almost all the time."""
LINE_NICE = -10
PROCESS_WHAT = "delay line"


@dataclass(frozen=True)
class DelayedPair:
    """Packets from host `src` to host `dst` are held `delay_s` on the way."""

    src: str
    dst: str
    delay_s: float


def delay_plan(spec: ClusterSpec) -> list[DelayedPair]:
    """Every ordered host pair across a link with a latency above zero (both directions are listed)."""
    pairs = []
    for host in spec.hosts:
        for i, link in enumerate(spec.links):
            latency = link_latency_s(link, f"links.{i}.latency")
            if not latency or host.region not in (link.a, link.b):
                continue
            other = link.b if host.region == link.a else link.a
            pairs += [
                DelayedPair(host.name, h.name, latency) for h in spec.hosts if h.region == other and h.name != host.name
            ]
    return pairs


def delayed_destinations(spec: ClusterSpec, addresses: dict[str, str]) -> dict[str, frozenset[str]]:
    """Per host, the addresses its traffic reaches through `delay0` (hosts without a delayed link: absent)."""
    out: dict[str, set[str]] = {}
    for pair in delay_plan(spec):
        out.setdefault(pair.src, set()).add(addresses[pair.dst])
    return {host: frozenset(found) for host, found in out.items()}


def build(
    spec: ClusterSpec, addresses: dict[str, str], state: State, state_dir: Path, cpu_ctl: cgroups.Controller
) -> int | None:
    """`delay0` and its rules in every host with a delayed link, then the line attached to them and ready; the
    line's pid (None when the spec delays nothing). The devices live in the hosts' namespaces and go with them."""
    pairs = delay_plan(spec)
    if not pairs:
        return None
    hosts = [h.name for h in spec.hosts if any(p.src == h.name for p in pairs)]
    for name in hosts:
        destinations = [addresses[p.dst] for p in pairs if p.src == name]  # spec order, as the rules list them
        netns.create_delay_device(name, addresses[name], spec.subnet, destinations)
    config, log = state_dir / CONFIG, state_dir / LOG
    for path in (config, log):
        state.record(type="path", path=str(path))
    ends = [End(name, netns.netns_name(name), addresses[name]) for name in hosts]
    write_config(config, netns.DELAY_DEVICE, ends, [(p.src, p.dst, p.delay_s) for p in pairs])
    group = cgroups.group_path(cpu_ctl, GROUP)
    state.record(type="cgroup", path=str(group))
    cgroups.create_group(cpu_ctl, GROUP)
    cgroups.set_weight(cpu_ctl, group, LINE_WEIGHT)
    with log.open("ab") as log_fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hetrl_cli.emulate.delayline", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    state.record(type="process", pid=proc.pid, marker=str(config), host=PROCESS_WHAT)
    cgroups.join(group, proc.pid)
    with contextlib.suppress(PermissionError):  # without CAP_SYS_NICE the weight above still holds
        os.setpriority(os.PRIO_PROCESS, proc.pid, LINE_NICE)
    wait_ready(proc, log)
    return proc.pid


def wait_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the line says it is attached to every device, or a HetrlError with its last words."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        lines = log.read_text(errors="replace").splitlines()
        if READY in lines:
            return
        if proc.poll() is not None:
            raise HetrlError(f"the delay line exited with {proc.returncode}: {lines[-1] if lines else 'no output'}")
        if time.monotonic() > deadline:
            raise HetrlError(f"the delay line was not ready after {READY_TIMEOUT_S:g}s (log: {log})")
        time.sleep(0.02)
