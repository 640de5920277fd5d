"""Hosts as network namespaces on one bridge, and the slow links between regions as htb classes.

Topology: one bridge `hetrl-emu-br` in this machine's root namespace holds the subnet's .1 (so `hetrl
profile` here reaches every host); each host is a netns `hetrl-emu-NAME` with a veth `eth0` plugged into the
bridge (`hetrl-emu-vN` on the bridge side) and the next address. The namespaces get no default route, so
their only reachable network is the subnet: nothing leaves the machine.

Shaping: one bridge, so a region↔region rate is made on the sender. Each host's `eth0` gets an htb root
qdisc with one class per region it has a shaped link to (rate = ceil = the link's bandwidth), a bfifo leaf
(~20 ms of queue at the rate) and u32 filters by destination address sending traffic for that region's hosts
into the class. Unclassified traffic (the same region, this machine) bypasses htb at veth speed. So every
host gets the configured rate towards each remote region — what `hetrl profile` measures (one pair at a
time) and what the cost model assumes (a bandwidth per host pair); flows from *different* hosts do not share
one pipe as they would on a real WAN.

Latency (netem is not in this kernel): a host with a delayed link also has a TUN device `delay0`, and policy
rules (`to ADDRESS/32 lookup 100`, one per host across a delayed link) send traffic for those hosts through it
(table 100: the subnet via `delay0`); the delay line process (delayline.py) forwards each packet into the far
host's `delay0` after the link's latency. The main routing table stays the connected subnet on `eth0`, and the
htb classes of delayed links sit on `delay0` instead of `eth0`.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from hetrl_cli.emulate.cgroups import PREFIX
from hetrl_cli.emulate.system import run_tool
from hetrl_cli.errors import HetrlError

BRIDGE = f"{PREFIX}br"
MIN_BURST_BYTES = 16 << 10
MIN_QUEUE_BYTES = 64 << 10
DELAY_DEVICE = "delay0"
DELAY_TABLE = "100"
"""The routing table of a host's delayed traffic: the subnet via `delay0`."""
DELAY_RULE_PRIORITY = "100"
"""After the local table (0), before main (32766): a delayed host's address leaves through `delay0`."""
DELAY_TXQUEUELEN = "10000"
"""Packets the TUN device holds for the line to read (its default 500 drops bursts of small segments)."""
QUEUE_SECONDS = 0.02
"""Queue of each shaped class, in seconds at its rate: enough for TCP to fill the link without much added delay."""


def netns_name(host: str) -> str:
    return f"{PREFIX}{host}"


def veth_name(index: int) -> str:
    return f"{PREFIX}v{index}"  # ≤ 15 characters (IFNAMSIZ) for index < 10000 (MAX_HOSTS is 200)


@dataclass(frozen=True)
class Shaping:
    """One htb class on a host's eth0: traffic to `destinations` at `rate_Bps`."""

    region: str
    rate_Bps: float
    burst_bytes: int | None
    destinations: tuple[str, ...]


# ---- checks --------------------------------------------------------------------------------------------


def check_subnet_free(subnet: ipaddress.IPv4Network) -> None:
    """Refuse a subnet that overlaps an address or route this machine already has (other than the default)."""
    taken: list[tuple[ipaddress.IPv4Network, str]] = []
    addrs = json.loads(run_tool(["ip", "-j", "-4", "addr", "show"], "reading this machine's addresses").stdout or "[]")
    for link in addrs:
        for info in link.get("addr_info", []):
            net = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
            taken.append((net, f"address {info['local']} on {link.get('ifname')}"))
    routes = json.loads(run_tool(["ip", "-j", "-4", "route", "show", "table", "all"], "reading routes").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst == "default":
            continue
        try:
            net = ipaddress.IPv4Network(dst, strict=False)
        except ValueError:
            continue
        taken.append((net, f"route {dst} via {route.get('dev', '?')}"))
    for net, what in taken:
        if net.overlaps(subnet) and not net.is_loopback:
            raise HetrlError(
                f"subnet {subnet} overlaps {what} on this machine: choose another private subnet in the spec "
                "(subnet: 10.213.0.0/24 style)"
            )


def existing_netns() -> list[str]:
    """Names of our namespaces on this machine."""
    done = run_tool(["ip", "-j", "netns", "list"], "listing network namespaces")
    names = [ns["name"] for ns in json.loads(done.stdout or "[]")]
    return [n for n in names if n.startswith(PREFIX)]


def existing_links() -> list[str]:
    """Names of our interfaces (bridge, veths) in the root namespace."""
    done = run_tool(["ip", "-j", "link", "show"], "listing network interfaces")
    names = [link["ifname"] for link in json.loads(done.stdout or "[]")]
    return [n.split("@")[0] for n in names if n.startswith(PREFIX)]


# ---- building ------------------------------------------------------------------------------------------


def create_bridge(address: ipaddress.IPv4Interface) -> None:
    what = f"creating bridge {BRIDGE}"
    run_tool(["ip", "link", "add", BRIDGE, "type", "bridge"], what)
    run_tool(["ip", "link", "set", BRIDGE, "addrgenmode", "none"], what)
    run_tool(["ip", "addr", "add", str(address), "dev", BRIDGE], what)
    run_tool(["ip", "link", "set", BRIDGE, "up"], what)


def create_netns(host: str) -> None:
    ns = netns_name(host)
    run_tool(["ip", "netns", "add", ns], f"creating netns {ns}")
    run_tool(["ip", "-n", ns, "link", "set", "lo", "up"], f"host {host}: bringing up lo")


def create_veth(host: str, index: int, address: ipaddress.IPv4Interface) -> None:
    """A veth pair: `eth0` inside the host's netns with `address`, the other end on the bridge."""
    ns, veth, what = netns_name(host), veth_name(index), f"host {host}: veth"
    run_tool(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns], what)
    run_tool(["ip", "link", "set", veth, "master", BRIDGE, "up"], what)
    # No IPv6 link-local address: the hosts speak IPv4 only, so no traffic can bypass the IPv4 filters.
    run_tool(["ip", "-n", ns, "link", "set", "eth0", "addrgenmode", "none"], what)
    run_tool(["ip", "-n", ns, "addr", "add", str(address), "dev", "eth0"], what)
    run_tool(["ip", "-n", ns, "link", "set", "eth0", "up"], what)


def create_delay_device(host: str, address: str, subnet: ipaddress.IPv4Network, destinations: list[str]) -> None:
    """A persistent TUN device `delay0` in the host (the delay line attaches to it) and the policy rules that
    send traffic for `destinations` through it. Without the line attached the device has no carrier and that
    traffic is dropped: a stopped line cuts the link rather than leaving it undelayed."""
    ip, what = ["ip", "-n", netns_name(host)], f"host {host}: delay device"
    run_tool([*ip, "tuntap", "add", "dev", DELAY_DEVICE, "mode", "tun", "vnet_hdr"], what)
    run_tool([*ip, "link", "set", DELAY_DEVICE, "addrgenmode", "none"], what)
    run_tool([*ip, "link", "set", DELAY_DEVICE, "up", "txqueuelen", DELAY_TXQUEUELEN], what)
    run_tool([*ip, "route", "add", str(subnet), "dev", DELAY_DEVICE, "src", address, "table", DELAY_TABLE], what)
    for dst in destinations:
        run_tool([*ip, "rule", "add", "to", f"{dst}/32", "lookup", DELAY_TABLE, "priority", DELAY_RULE_PRIORITY], what)


def shaping_device(cls: Shaping, delayed: frozenset[str]) -> str:
    """The device a class's traffic leaves by: DELAY_DEVICE where its destinations are reached through the delay
    line (`delayed`: the host's delayed destination addresses), else eth0."""
    return DELAY_DEVICE if cls.destinations and set(cls.destinations) <= delayed else "eth0"


def shape(host: str, classes: list[Shaping], delayed: frozenset[str] = frozenset()) -> None:
    """htb on each device the host's shaped links leave by: one rate-limited class per remote region, filters by
    destination address."""
    devices = [shaping_device(cls, delayed) for cls in classes]
    for device in sorted(set(devices)):
        _shape_device(host, device, [cls for cls, on in zip(classes, devices, strict=True) if on == device])


def _shape_device(host: str, device: str, classes: list[Shaping]) -> None:
    ns, what = netns_name(host), f"host {host}: tc shaping on {device}"
    tc = ["tc", "-n", ns]
    run_tool([*tc, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb"], what)
    for minor, cls in enumerate(classes, start=10):
        rate_bit = max(8, round(cls.rate_Bps * 8))
        burst = cls.burst_bytes or max(MIN_BURST_BYTES, round(cls.rate_Bps * 1e-3))
        quantum = min(max(round(cls.rate_Bps / 10), 1514), 200_000)  # htb's own r2q=10, kept in its bounds
        classid = f"1:{minor:x}"
        run_tool(
            [*tc, "class", "add", "dev", device, "parent", "1:", "classid", classid, "htb",
             "rate", f"{rate_bit}bit", "ceil", f"{rate_bit}bit", "burst", str(burst), "cburst", str(burst),
             "quantum", str(quantum)],
            what,
        )  # fmt: skip
        queue = max(MIN_QUEUE_BYTES, round(cls.rate_Bps * QUEUE_SECONDS))
        run_tool([*tc, "qdisc", "add", "dev", device, "parent", classid, "bfifo", "limit", str(queue)], what)
        for dst in cls.destinations:
            run_tool(
                [*tc, "filter", "add", "dev", device, "parent", "1:", "protocol", "ip", "prio", "1",
                 "u32", "match", "ip", "dst", f"{dst}/32", "flowid", classid],
                what,
            )  # fmt: skip


# ---- removing ------------------------------------------------------------------------------------------


def netns_pids(ns: str) -> list[int]:
    done = run_tool(["ip", "netns", "pids", ns], f"listing processes in netns {ns}", check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()] if done.returncode == 0 else []


def delete_link(name: str) -> bool:
    """Delete an interface of ours in the root namespace (a veth takes its peer with it); False if absent."""
    if name not in existing_links():
        return False
    run_tool(["ip", "link", "del", name], f"deleting interface {name}")
    return True


def delete_netns(ns: str) -> bool:
    """Delete a namespace (its processes must be stopped first, or it lives on unnamed); False if absent."""
    if ns not in existing_netns():
        return False
    run_tool(["ip", "netns", "del", ns], f"deleting netns {ns}")
    return True
