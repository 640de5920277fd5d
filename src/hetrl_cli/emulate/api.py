"""`emulate up` / `emulate down`: build the one-box cluster from a spec, and remove all of it again.

up, in phases: 1) check the spec, root, the state dir and that no cluster is up; 2) keys; 3) the bridge;
4) per host: netns, veth, cgroups, host key, sshd config, sshd started as the host; 5) the delayed links'
devices and the delay line (delays.py), tc shaping; 6) wait for every sshd; 7) write known_hosts, hosts.txt
and the links files. Each resource is recorded in state.json before it is made, and a failure in any phase
rolls back everything recorded so far before re-raising.

down removes what state.json lists, then sweeps by name (`hetrl-emu-*` namespaces, interfaces, cgroups and
the processes inside them), so it also cleans up after a lost state dir. Running it again finds nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hetrl_cli.emulate import cgroups, delays, netns, sshd
from hetrl_cli.emulate.spec import ClusterSpec, HostSpec, link_bandwidth_Bps, link_latency_s, load_spec
from hetrl_cli.emulate.state import STATE_FILE, State, load_state
from hetrl_cli.emulate.system import kill_pids, pid_cmdline, require_root_and_tools
from hetrl_cli.errors import BadInput, HetrlError

DEFAULT_STATE_DIR = Path("/run/hetrl-emulate")
"""Under /run like /run/netns: both vanish at reboot, together."""
USER = "root"
CLIENT_KEY = "id_ed25519"
OUTPUT_NAMES = (CLIENT_KEY, f"{CLIENT_KEY}.pub", "authorized_keys", "known_hosts", "hosts.txt", "links.yaml",
                "links-configured.yaml", "hosts")  # fmt: skip
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9._/+-]{1,1024}$")
"""What hosts.txt accepts for identity= (the client key's path is written there)."""


@dataclass(frozen=True)
class EmulatedHost:
    name: str
    region: str
    address: str
    netns: str
    cpu: float
    """Cores (fraction of one) the host's processes share."""
    memory_bytes: int | None
    sshd_pid: int
    cpus: tuple[int, ...] = ()
    """The CPUs its processes may run on (affinity); () = not pinned, all of this machine's."""


@dataclass(frozen=True)
class EmulatedLink:
    a: str
    b: str
    bandwidth_Bps: float | None
    """Shaped rate each host gets towards the other region; None = not shaped."""
    latency_s: float | None
    """One way; added by the delay line (delays.py) and recorded in links.yaml."""


@dataclass(frozen=True)
class EmulatedCluster:
    """What `up` made and where its files are."""

    state_dir: Path
    hosts: list[EmulatedHost]
    links: list[EmulatedLink]
    hosts_file: Path
    known_hosts: Path
    identity: Path
    links_file: Path
    """Latencies only: pass to `hetrl profile --links` (bandwidths are then measured)."""
    links_configured_file: Path
    """Bandwidths and latencies as configured (a profile using it does not measure those links)."""
    delay_line_pid: int | None = None
    """The delay line process (None when the spec has no latency)."""

    def as_json(self) -> dict:
        """What `up` made, as plain data (`hetrl emulate up --json`): paths as strings."""
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data, default=str))

    def summary(self) -> list[str]:
        """Short human lines for the CLI."""
        regions = sorted({h.region for h in self.hosts})
        lines = [f"emulated cluster up: {len(self.hosts)} hosts in {len(regions)} regions (state {self.state_dir})"]
        for h in self.hosts:
            memory = f", memory {h.memory_bytes / 2**20:.0f} MiB" if h.memory_bytes else ""
            lines.append(
                f"  {h.name:<12} {h.address:<15} region {h.region:<10} cpu {h.cpu:g} core{memory}{on_cpus(h.cpus)}"
            )
        for lk in self.links:
            rate = f"{lk.bandwidth_Bps * 8 / 1e6:g} Mbit/s" if lk.bandwidth_Bps else "not shaped"
            latency = f", latency {lk.latency_s * 1e3:g} ms one way (delay line)" if lk.latency_s else ""
            lines.append(f"  link {lk.a} <-> {lk.b}: {rate}{latency}")
        lines.append(f"hosts file: {self.hosts_file}")
        lines.append(
            f"profile it: hetrl profile {self.hosts_file} --known-hosts {self.known_hosts} --links {self.links_file}"
        )
        return lines


# ---- up ------------------------------------------------------------------------------------------------


def emulate_up(spec_path: Path, state_dir: Path = DEFAULT_STATE_DIR) -> EmulatedCluster:
    """Build the cluster of `spec_path`; its hosts.txt, keys and state go to `state_dir`."""
    # 1) everything that can be refused is refused before anything is made
    spec = load_spec(spec_path)
    cpus = sorted(os.sched_getaffinity(0))
    _check_cpu_shares(spec, len(cpus), str(spec_path))
    cpu_sets = host_cpu_sets(spec, cpus, str(spec_path))
    require_root_and_tools()
    state_dir = _check_state_dir(state_dir)
    _refuse_if_up(state_dir)
    netns.check_subnet_free(spec.subnet)
    cpu_ctl, memory_ctl = _controllers(spec)
    state = State(path=state_dir / STATE_FILE, spec=str(spec_path))
    state.save()
    try:
        cluster = _build(spec, state_dir, state, cpu_ctl, memory_ctl, cpu_sets)
    except BaseException as exc:
        try:
            _teardown(state)
        except HetrlError as cleanup:
            raise HetrlError(f"{exc} (and the rollback failed: {cleanup}; run `hetrl emulate down`)") from exc
        raise
    state.complete = True
    state.save()
    return cluster


def _check_cpu_shares(spec: ClusterSpec, cores: int, where: str) -> None:
    for i, host in enumerate(spec.hosts):
        if host.cpu > cores:
            raise BadInput(f"{where}: field 'hosts.{i}.cpu': {host.cpu:g} cores, but this machine has {cores}")


PACK_SLACK = 1e-9
"""Float room left on a CPU that still counts as room (0.25 × 4 must fill a CPU exactly)."""


def pack_cpus(shares: list[float], cpus: list[int]) -> list[tuple[int, ...]] | None:
    """CPUs for each host, so that the hosts sharing a CPU fit in it together; None when they do not pack.
    First-fit, largest share first, from the highest-numbered CPU down; a host of share above 1 takes
    ceil(share) whole CPUs to itself.

    >>> pack_cpus([1.0, 0.5, 0.25], [0, 1])
    [(1,), (0,), (0,)]
    >>> pack_cpus([1.0, 0.75, 0.5], [0, 1]) is None
    True
    """
    room = dict.fromkeys(sorted(cpus, reverse=True), 1.0)
    out: list[tuple[int, ...]] = [()] * len(shares)
    for i in sorted(range(len(shares)), key=lambda i: -shares[i]):
        if shares[i] > 1:
            whole = [cpu for cpu, left in room.items() if left >= 1 - PACK_SLACK][: math.ceil(shares[i])]
            if len(whole) < math.ceil(shares[i]):
                return None
            room.update(dict.fromkeys(whole, 0.0))
            out[i] = tuple(sorted(whole))
            continue
        cpu = next((cpu for cpu, left in room.items() if left >= shares[i] - PACK_SLACK), None)
        if cpu is None:
            return None
        room[cpu] -= shares[i]
        out[i] = (cpu,)
    return out


def host_cpu_sets(spec: ClusterSpec, cpus: list[int], where: str) -> list[tuple[int, ...]]:
    """Each host's CPUs as the spec's `pin_cpus` asks, () for all of them (docs/emulate.md).

    auto: pinned only where every host can have whole CPUs no other host uses. A quota caps how much a host
    runs, not where, so unpinned hosts run on each other's CPUs; but hosts pinned together onto one CPU slow
    each other more (the suite's cluster, 2 CPUs: mid and slow sharing one measured 0.30-0.41 and 0.12-0.15 of
    the fast host's decode rate in eight profiles, against their shares 0.5 and 0.25, which two unpinned
    profiles measured 0.49-0.52 and 0.16-0.24). true: packed, CPUs shared where needed, or refused; false: never."""
    unpinned: list[tuple[int, ...]] = [()] * len(spec.hosts)
    if spec.pin_cpus is False:
        return unpinned
    if spec.pin_cpus == "auto":
        return pack_cpus([float(math.ceil(h.cpu)) for h in spec.hosts], cpus) or unpinned
    packed = pack_cpus([h.cpu for h in spec.hosts], cpus)
    if packed is None:
        total = sum(h.cpu for h in spec.hosts)
        raise BadInput(
            f"{where}: field 'pin_cpus': the hosts' shares ({total:g} cores in all) do not pack onto the "
            f"{len(cpus)} CPU(s) here; lower the shares or set pin_cpus: auto"
        )
    return packed


def on_cpus(cpus: tuple[int, ...]) -> str:
    """', on CPU 1' / ', on CPUs 2,3' for the summary and hosts.txt ('' when not pinned)."""
    if not cpus:
        return ""
    return f", on CPU{'s' if len(cpus) > 1 else ''} {','.join(map(str, cpus))}"


def _check_state_dir(state_dir: Path) -> Path:
    state_dir = Path(os.path.abspath(state_dir))
    if not _PLAIN_PATH.match(str(state_dir)) or ".." in state_dir.parts:
        raise BadInput(f"--state-dir {state_dir}: use a plain path (letters, digits, '._/+-'): it goes into hosts.txt")
    if state_dir.exists() and not state_dir.is_dir():
        raise BadInput(f"--state-dir {state_dir}: exists and is not a directory")
    return state_dir


def _refuse_if_up(state_dir: Path) -> None:
    if (state_dir / STATE_FILE).exists():
        raise HetrlError(
            f"an emulated cluster is already up (state {state_dir / STATE_FILE}): "
            f"run `hetrl emulate down --state-dir {state_dir}` first"
        )
    leftovers = [*netns.existing_netns(), *netns.existing_links(), *map(str, cgroups.sweep_groups())]
    if leftovers:
        raise HetrlError(
            f"an emulated cluster (or what a crash left of one) is on this machine ({', '.join(leftovers[:3])}"
            f"{', ...' if len(leftovers) > 3 else ''}): one at a time; run `hetrl emulate down` first"
        )
    stale = [name for name in OUTPUT_NAMES if (state_dir / name).exists()]
    if stale:
        raise HetrlError(
            f"--state-dir {state_dir} already holds {stale[0]} but no {STATE_FILE}: remove it or choose another"
        )


def _controllers(spec: ClusterSpec) -> tuple[cgroups.Controller, cgroups.Controller | None]:
    cpu_ctl = cgroups.find_controller("cpu")
    if cpu_ctl is None:
        raise HetrlError(
            "no cgroup cpu controller on this machine (v1 /sys/fs/cgroup/cpu or v2 cpu.max): cannot cap CPUs"
        )
    memory_ctl = None
    if any(h.memory is not None for h in spec.hosts):
        memory_ctl = cgroups.find_controller("memory")
        if memory_ctl is None:
            raise HetrlError("the spec sets memory limits but this machine has no cgroup memory controller")
    return cpu_ctl, memory_ctl


def _build(
    spec: ClusterSpec,
    state_dir: Path,
    state: State,
    cpu_ctl: cgroups.Controller,
    memory_ctl: cgroups.Controller | None,
    cpu_sets: list[tuple[int, ...]],
) -> EmulatedCluster:
    # 2) keys: one client key, authorised on every host
    identity = state_dir / CLIENT_KEY
    _record_paths(state, identity, identity.with_name(f"{CLIENT_KEY}.pub"), state_dir / "authorized_keys")
    authorized = state_dir / "authorized_keys"
    authorized.write_text(sshd.keygen(identity, "hetrl-emulate-client") + "\n")
    # 3) the bridge holds .1: this machine's side of the subnet
    addresses = list(spec.subnet.hosts())
    state.record(type="bridge", name=netns.BRIDGE)
    netns.create_bridge(ipaddress.IPv4Interface(f"{addresses[0]}/{spec.subnet.prefixlen}"))
    # 4) the hosts
    period_us = round(spec.cpu_period_ms * 1000)
    controllers = (cpu_ctl, memory_ctl)
    started = []
    for index, host in enumerate(spec.hosts):
        address = ipaddress.IPv4Interface(f"{addresses[index + 1]}/{spec.subnet.prefixlen}")
        started.append(_make_host(host, index, address, state, state_dir, controllers, period_us, cpu_sets[index]))
    # 5) links: the delayed ones through the delay line, htb classes on each host towards the regions it has a
    # shaped link to
    host_addresses = {s.spec.name: s.address for s in started}
    line_pid = delays.build(spec, host_addresses, state, state_dir, cpu_ctl)
    plan = shaping_plan(spec, host_addresses)
    delayed = delays.delayed_destinations(spec, host_addresses)
    for name, classes in plan.items():
        netns.shape(name, classes, delayed.get(name, frozenset()))
    # 6) every sshd listening
    for s in started:
        sshd.wait_listening(s.spec.name, s.address, s.proc, s.log)
    # 7) the files the rest of hetrl reads
    return dataclasses.replace(_write_outputs(spec, state_dir, state, started), delay_line_pid=line_pid)


def _record_paths(state: State, *paths: Path) -> None:
    for path in paths:
        state.record(type="path", path=str(path))


@dataclass(frozen=True)
class _Started:
    """A host whose sshd was started but not yet waited for."""

    spec: HostSpec
    address: str
    proc: subprocess.Popen[bytes]
    log: Path
    host_key: str
    cpus: tuple[int, ...]


def _make_host(
    host: HostSpec,
    index: int,
    address: ipaddress.IPv4Interface,
    state: State,
    state_dir: Path,
    controllers: tuple[cgroups.Controller, cgroups.Controller | None],
    period_us: int,
    cpus: tuple[int, ...],
) -> _Started:
    """One host: netns, veth, cgroups, host key, config, sshd (started, not yet waited for)."""
    ns = netns.netns_name(host.name)
    state.record(type="netns", name=ns)
    netns.create_netns(host.name)
    state.record(type="veth", name=netns.veth_name(index))
    netns.create_veth(host.name, index, address)
    cpu_ctl, memory_ctl = controllers
    groups = [cgroups.group_path(cpu_ctl, host.name)]
    state.record(type="cgroup", path=str(groups[0]))
    cgroups.create_cpu_group(cpu_ctl, host.name, host.cpu, period_us)
    if host.memory is not None and memory_ctl is not None:
        memory_group = cgroups.group_path(memory_ctl, host.name)  # the same directory under cgroup v2
        state.record(type="cgroup", path=str(memory_group))
        cgroups.create_memory_group(memory_ctl, host.name, host.memory)
        groups += [memory_group] if memory_group not in groups else []
    host_dir = state_dir / "hosts" / host.name
    _record_paths(state, state_dir / "hosts")
    host_dir.mkdir(parents=True, exist_ok=True)
    host_key = sshd.keygen(host_dir / "host_ed25519", f"hetrl-emulate-{host.name}")
    config = sshd.write_config(host_dir, str(address.ip), state_dir / "authorized_keys")
    log = host_dir / "sshd.log"
    proc = sshd.start(host.name, ns, groups, config, log, cpus)
    state.record(type="process", pid=proc.pid, marker=str(config), host=host.name)
    return _Started(host, str(address.ip), proc, log, host_key, cpus)


def shaping_plan(spec: ClusterSpec, addresses: dict[str, str]) -> dict[str, list[netns.Shaping]]:
    """The htb classes of every host: one per shaped link it is an end of, towards the other end's hosts.

    `addresses` maps host name → address. Hosts without shaped links map to [].
    """
    plan: dict[str, list[netns.Shaping]] = {}
    for host in spec.hosts:
        classes = []
        for i, link in enumerate(spec.links):
            rate = link_bandwidth_Bps(link, f"links.{i}.bandwidth")
            if rate is None or host.region not in (link.a, link.b):
                continue
            other = link.b if host.region == link.a else link.a
            destinations = tuple(addresses[h.name] for h in spec.hosts if h.region == other and h.name != host.name)
            if destinations:
                classes.append(netns.Shaping(other, rate, link.burst, destinations))
        plan[host.name] = classes
    return plan


def price_option(host: HostSpec) -> str:
    """' price=0.4' for a host the spec prices (hosts.txt's key), '' otherwise."""
    return "" if host.price_per_gpu_hour is None else f" price={host.price_per_gpu_hour!r}"


def _write_outputs(spec: ClusterSpec, state_dir: Path, state: State, started: list[_Started]) -> EmulatedCluster:
    """known_hosts, hosts.txt (checked by the real parser) and the two links files."""
    from hetrl_cli.artifacts.hosts import parse_hosts_text
    from hetrl_cli.artifacts.io import write_text_atomic

    known_hosts, hosts_file = state_dir / "known_hosts", state_dir / "hosts.txt"
    links_file, configured_file = state_dir / "links.yaml", state_dir / "links-configured.yaml"
    _record_paths(state, known_hosts, hosts_file, links_file, configured_file)
    write_text_atomic(known_hosts, "".join(f"{s.address} {s.host_key}\n" for s in started))
    identity = state_dir / CLIENT_KEY
    lines = [
        f"# Emulated by `hetrl emulate up {state.spec}`; remove with `hetrl emulate down --state-dir {state_dir}`."
    ]
    for s in started:
        memory = f", memory {s.spec.memory} B" if s.spec.memory else ""
        lines.append(
            f"{USER}@{s.address}:{sshd.SSH_PORT} region={s.spec.region} identity={identity} python={sys.executable}"
            f"{price_option(s.spec)}  # host {s.spec.name}: cpu {s.spec.cpu:g} core{memory}{on_cpus(s.cpus)}"
        )
    hosts_text = "\n".join(lines) + "\n"
    parse_hosts_text(hosts_text, str(hosts_file))  # what we write must be what hetrl reads
    write_text_atomic(hosts_file, hosts_text)
    links = [
        EmulatedLink(lk.a, lk.b, link_bandwidth_Bps(lk, f"links.{i}"), link_latency_s(lk, f"links.{i}"))
        for i, lk in enumerate(spec.links)
    ]
    write_text_atomic(links_file, _links_yaml(links, state.spec, with_bandwidth=False))
    write_text_atomic(configured_file, _links_yaml(links, state.spec, with_bandwidth=True))
    hosts = [
        EmulatedHost(s.spec.name, s.spec.region, s.address, netns.netns_name(s.spec.name), s.spec.cpu, s.spec.memory,
                     s.proc.pid, s.cpus)
        for s in started
    ]  # fmt: skip
    return EmulatedCluster(state_dir, hosts, links, hosts_file, known_hosts, identity, links_file, configured_file)


def _links_yaml(links: list[EmulatedLink], spec_path: str, with_bandwidth: bool) -> str:
    """A links file for `hetrl profile --links` (ends as region:NAME, bandwidth in B/s, latency in s)."""
    import yaml

    if with_bandwidth:
        head = (
            f"# The links of {spec_path} as configured. With this file `hetrl profile` does not measure a pair\n"
            "# that it gives both bandwidth and latency for: the planner sees exactly the spec.\n"
        )
    else:
        head = (
            f"# Latencies of {spec_path}. The delay line adds them (one way) to every packet between the\n"
            "# regions; `hetrl profile --links` takes them from here rather than from its ping-pongs (which also\n"
            "# see the line's own 0.3-1.7 ms on a loaded box); bandwidths are left out so that they are measured.\n"
        )
    entries = []
    for lk in links:
        entry: dict[str, object] = {"a": f"region:{lk.a}", "b": f"region:{lk.b}"}
        if with_bandwidth and lk.bandwidth_Bps is not None:
            entry["bandwidth"] = lk.bandwidth_Bps
        if lk.latency_s is not None:
            entry["latency"] = lk.latency_s
        if len(entry) > 2:
            entries.append(entry)
    return head + yaml.safe_dump({"links": entries}, sort_keys=False)


# ---- down ----------------------------------------------------------------------------------------------


def emulate_down(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Remove the cluster recorded in `state_dir`, then anything else named `hetrl-emu-*`; what it removed."""
    require_root_and_tools()
    state_dir = Path(os.path.abspath(state_dir))
    removed: list[str] = []
    try:
        state = load_state(state_dir)
    except BadInput as exc:  # a damaged record must not keep the machine dirty: the sweep below still runs
        removed.append(f"ignored {exc}")
        state = None
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    if state is not None:
        removed += _teardown(state)
    removed += _sweep()
    return removed


def _teardown(state: State) -> list[str]:
    """Remove what `state` lists: processes, interfaces, namespaces, cgroups, files; then the state itself."""
    removed: list[str] = []
    for proc in state.of_type("process"):
        cmdline = pid_cmdline(int(proc["pid"]))
        if cmdline and str(proc.get("marker", "\0")) in cmdline and kill_pids([int(proc["pid"])]):
            what = proc.get("host", "?")
            removed.append(
                f"{what} pid {proc['pid']}" if what == delays.PROCESS_WHAT else f"sshd pid {proc['pid']} (host {what})"
            )
    removed += _remove_network([r["name"] for r in state.of_type("netns")],
                               [r["name"] for r in [*state.of_type("veth"), *state.of_type("bridge")]])  # fmt: skip
    for group in reversed(state.of_type("cgroup")):
        if cgroups.remove_group(Path(group["path"])):
            removed.append(f"cgroup {group['path']}")
    files = 0
    for item in reversed(state.of_type("path")):
        path = Path(item["path"])
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            files += 1
        elif path.exists() or path.is_symlink():
            path.unlink()
            files += 1
    state.path.unlink(missing_ok=True)
    if files:
        removed.append(f"{files} files in {state.path.parent}")
    _rmdir_if_empty(state.path.parent)
    return removed


def _remove_network(namespaces: list[str], links: list[str]) -> list[str]:
    """Stop every process in the namespaces, delete the interfaces (veths before the bridge), then the namespaces."""
    removed: list[str] = []
    present = set(netns.existing_netns())
    for ns in namespaces:
        if ns in present:
            pids = kill_pids(netns.netns_pids(ns))
            removed += [f"process {pid} in netns {ns}" for pid in pids]
    for name in sorted(links, key=lambda n: n == netns.BRIDGE):
        if netns.delete_link(name):
            removed.append(f"{'bridge' if name == netns.BRIDGE else 'interface'} {name}")
    for ns in namespaces:
        if netns.delete_netns(ns):
            removed.append(f"netns {ns}")
    return removed


def _sweep() -> list[str]:
    """Everything named with our prefix, whoever recorded it (a lost or damaged state dir)."""
    removed = _remove_network(netns.existing_netns(), netns.existing_links())
    for group in cgroups.sweep_groups():
        if cgroups.remove_group(group):
            removed.append(f"cgroup {group}")
    return removed


def _rmdir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()
