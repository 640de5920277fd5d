"""A userspace delay line: packets between network namespaces, each held for a fixed one-way delay.

netem, the only qdisc that delays packets, is not in this kernel (docs/emulate.md), so the delay is made here:
each end of the line is a TUN device in a namespace; this process reads every packet an end sends and writes it
into the TUN device of the end it is for once its lane's delay has passed (and, where the lane has a rate, after
it has been serialised at that rate behind the lane's earlier packets, dropped when that wait would exceed the
lane's queue: a tail-drop router). The devices carry TSO super-packets (IFF_VNET_HDR), so a 64 KiB TCP burst is
one read and one write, and TCP still counts 1500-byte segments; bench/sync_links.py measured it at 1 Gbit/s.

Two users:
- `hetrl emulate up` runs one line per cluster, `python -m hetrl_cli.emulate.delayline --config FILE`, over the
  persistent TUN device `delay0` it made in each host with a delayed link; lanes go host to host, routed by the
  packet's IPv4 destination, and only delay (htb on `delay0` sets the rates, as on `eth0`);
- bench/sync_links.py joins two namespaces with the two-ended line (`DelayLine(fds, rate, delay, queue)`,
  `pair_main`), with the rate in the line.

Standard library only: it starts in a fraction of a second and imports nothing of hetrl's.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import struct
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TUN, IFF_NO_PI, IFF_VNET_HDR = 0x0001, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
CLONE_NEWNET = 0x40000000
VNET_HDR = 10
"""Bytes of the virtio-net header in front of each packet (IFF_VNET_HDR)."""
READ_BYTES = 70000
"""Larger than a TSO super-packet (64 KiB) plus its header."""
READ_BURST = 64
"""Packets read from one device before the others get a turn."""
IDLE_WAIT_S = 0.5
CONFIG_KIND = "hetrl-delay-line"
READY = "ready"


def enter_netns(path: str) -> None:
    """Move this thread into the network namespace at `path` (/run/netns/NAME)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


def open_tun(netns: str | None, name: str = "tun0") -> int:
    """A non-blocking fd on TUN device `name` inside `netns` (created unless a persistent one exists; opened
    there because a TUN device belongs to its opener's namespace); this process stays in its own namespace."""
    home = f"/proc/{os.getpid()}/task/{os.getpid()}/ns/net"
    keep = os.open(home, os.O_RDONLY)
    try:
        if netns:
            enter_netns(f"/run/netns/{netns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), IFF_TUN | IFF_NO_PI | IFF_VNET_HDR))
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.setns(keep, CLONE_NEWNET)
        os.close(keep)
    return fd


@dataclass(frozen=True)
class Lane:
    """One direction from end `src` to end `dst`: each packet held `delay_s`; with `rate_Bps`, first serialised
    at that rate behind the lane's queue, dropped when it would wait longer than `queue_s`."""

    src: int
    dst: int
    delay_s: float
    rate_Bps: float | None = None
    queue_s: float = 0.01


class DelayLine:
    """Packets between TUN fds, each lane in order. Built as the symmetric two-ended line (what the benchmark
    uses: every packet goes to the other end); `DelayLine.routed` builds one whose lanes are chosen by each
    packet's IPv4 destination (the emulated cluster)."""

    def __init__(self, fds: Sequence[int], rate_Bps: float | None, delay_s: float, queue_s: float) -> None:
        lanes = [Lane(0, 1, delay_s, rate_Bps, queue_s), Lane(1, 0, delay_s, rate_Bps, queue_s)]
        self._setup(fds, lanes, {}, default_lane={0: 0, 1: 1})

    @classmethod
    def routed(cls, fds: Sequence[int], lanes: Sequence[Lane], addresses: Sequence[str]) -> DelayLine:
        """A line whose packet from end i to the IPv4 address of end j takes the lane (i, j); packets no lane
        covers are counted in `unroutable` and dropped. `addresses[j]` is end j's address."""
        line = cls.__new__(cls)
        by_address = {bytes(int(octet) for octet in address.split(".")): j for j, address in enumerate(addresses)}
        index = {(lane.src, lane.dst): k for k, lane in enumerate(lanes)}
        routes = {(i, addr): index[i, j] for addr, j in by_address.items() for i in range(len(fds)) if (i, j) in index}
        line._setup(fds, list(lanes), routes, default_lane={})
        return line

    def _setup(
        self,
        fds: Sequence[int],
        lanes: list[Lane],
        routes: Mapping[tuple[int, bytes], int],
        default_lane: Mapping[int, int],
    ) -> None:
        self.fds, self.lanes = tuple(fds), lanes
        self.routes, self.default_lane = dict(routes), dict(default_lane)
        self.queues: tuple[deque[tuple[float, bytes]], ...] = tuple(deque() for _ in lanes)
        """Per lane: (time it is due at the far end, packet), in order."""
        self.free_at = [0.0] * len(lanes)
        self.active: set[int] = set()
        ends = len(self.fds)
        self.dropped, self.packets, self.bytes, self.unroutable = [0] * ends, [0] * ends, [0] * ends, [0] * ends
        """Per sending end."""

    def lane_of(self, side: int, packet: bytes) -> int | None:
        """The lane a packet from end `side` takes: by its IPv4 destination, else the end's default lane."""
        if self.routes and len(packet) >= VNET_HDR + 20 and packet[VNET_HDR] >> 4 == 4:
            lane = self.routes.get((side, packet[VNET_HDR + 16 : VNET_HDR + 20]))
            if lane is not None:
                return lane
        return self.default_lane.get(side)

    def admit(self, side: int, packet: bytes, now: float) -> None:
        """Queue `packet` (from fds[side]) on its lane, serialised behind what is queued where the lane has a
        rate; drop it when that queue is full or no lane takes it."""
        k = self.lane_of(side, packet)
        if k is None:
            self.unroutable[side] += 1
            return
        lane, size = self.lanes[k], len(packet) - VNET_HDR
        leave = now
        if lane.rate_Bps:
            start = max(now, self.free_at[k])
            if start - now > lane.queue_s:
                self.dropped[side] += 1
                return
            leave = self.free_at[k] = start + size / lane.rate_Bps
        self.packets[side] += 1
        self.bytes[side] += size
        self.queues[k].append((leave + lane.delay_s, packet))
        self.active.add(k)

    def release(self, now: float) -> None:
        """Write every packet that is due to its far end."""
        for k in list(self.active):
            queue, lane = self.queues[k], self.lanes[k]
            while queue and queue[0][0] <= now:
                try:
                    os.write(self.fds[lane.dst], queue.popleft()[1])
                except OSError:  # the far device is not up yet, or its queue is full: lost, as on a wire
                    self.dropped[lane.src] += 1
            if not queue:
                self.active.discard(k)

    def run(self, stop_fd: int | None = None) -> None:
        """Forward until `stop_fd` is readable or closed (None: until this process is stopped)."""
        poller = select.poll()
        side_of = {fd: side for side, fd in enumerate(self.fds)}
        for fd in [*self.fds, *([] if stop_fd is None else [stop_fd])]:
            poller.register(fd, select.POLLIN)
        while True:
            due = [self.queues[k][0][0] for k in self.active]
            wait_s = max(0.0, min(due) - time.monotonic()) if due else IDLE_WAIT_S
            ready = poller.poll(wait_s * 1000)
            now = time.monotonic()
            for fd, _ in ready:
                if fd == stop_fd:
                    return
                with contextlib.suppress(BlockingIOError):
                    for _ in range(READ_BURST):
                        self.admit(side_of[fd], os.read(fd, READ_BYTES), now)
            self.release(time.monotonic())

    def stats(self) -> dict[str, list[int]]:
        """Counts per sending end."""
        return {"dropped": self.dropped, "packets": self.packets, "bytes": self.bytes, "unroutable": self.unroutable}


def pair_main(namespaces: Sequence[str], rate_Bps: float, delay_s: float) -> None:
    """The benchmark's line: TUN devices `tun0` in two namespaces, 'ready' on stdout, forward until stdin ends,
    then the counts as one JSON line."""
    fds = (open_tun(namespaces[0]), open_tun(namespaces[1]))
    print(READY, flush=True)
    queue_s = max(0.01, 2 * delay_s)  # one bandwidth-delay product of the round trip, at least 10 ms
    line = DelayLine(fds, rate_Bps, delay_s, queue_s)
    line.run(sys.stdin.fileno())
    print(json.dumps(line.stats()), flush=True)


# ---- the emulated cluster's line -----------------------------------------------------------------------------


@dataclass(frozen=True)
class End:
    """A host on the line: its netns, its address, and its TUN device there."""

    host: str
    netns: str
    address: str


def write_config(path: Path, device: str, ends: Sequence[End], lanes: Sequence[tuple[str, str, float]]) -> None:
    """The line's config: the ends and the (from host, to host, one-way delay s) lanes."""
    data = {
        "kind": CONFIG_KIND,
        "device": device,
        "ends": [{"host": e.host, "netns": e.netns, "address": e.address} for e in ends],
        "lanes": [{"from": a, "to": b, "delay_s": d} for a, b, d in lanes],
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def load_config(path: Path) -> tuple[str, list[End], list[Lane]]:
    data = json.loads(path.read_text())
    if data.get("kind") != CONFIG_KIND:
        raise ValueError(f"{path}: not a {CONFIG_KIND} config")
    ends = [End(e["host"], e["netns"], e["address"]) for e in data["ends"]]
    index = {e.host: i for i, e in enumerate(ends)}
    lanes = [Lane(index[x["from"]], index[x["to"]], float(x["delay_s"])) for x in data["lanes"]]
    return str(data["device"]), ends, lanes


def main(argv: list[str] | None = None) -> int:
    """The emulated cluster's line: attach to each host's device, say 'ready', forward until SIGTERM, then print
    the counts (into the log `emulate up` gives it)."""
    parser = argparse.ArgumentParser(prog="python -m hetrl_cli.emulate.delayline")
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args(argv)
    device, ends, lanes = load_config(args.config)
    fds = [open_tun(end.netns, device) for end in ends]
    line = DelayLine.routed(fds, lanes, [end.address for end in ends])

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    print(READY, flush=True)
    try:
        line.run()
    finally:
        print(json.dumps({"hosts": [e.host for e in ends], **line.stats()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
