"""Weight-sync GB/s per link kind on emulated links vs the cost model (issue 23, Benchmarks).

Two gloo ranks in different network namespaces move a bf16 payload rank 0 -> rank 1 through the runtime's own
bucketed relay (`runtime.comm.WeightChannel`, chain [0, 1]) for several payload and bucket sizes; the time of one
sync is from the sender's start to the receiver's last bucket (both namespaces share this machine's monotonic
clock), the median of REPEATS after a warm-up that exchanges the names and shapes. Link kinds:
- loopback: both ranks in one namespace over `lo` (an intra-host link; no rate limit);
- lan-10g / lan-1g: two namespaces joined by a veth pair, htb at 10 / 1 Gbit/s on both ends, the veth's own
  latency (tens of microseconds);
- wan-1g-rtt40 (and wan-1g-rtt0, the same line without delay): two namespaces joined by a userspace delay line
  (`hetrl_cli.emulate.delayline.DelayLine`, which also delays `hetrl emulate`'s links): each namespace has a
  TUN device, a line process forwards each packet to the other after it has been serialised at the link's
  rate and held for half the RTT, dropping it when the queue exceeds one bandwidth-delay product (a tail-drop
  router). netem is not in this kernel (PLATFORM.md), so the delay is
  made here; the TUN devices carry TSO super-packets (IFF_VNET_HDR), so TCP still counts 1500-byte segments.
The cost model's figure for the same bytes and link is `predicted_sync_s` (what `WeightSync.broadcast_tree_s`
gives for one training host and one generation host, plus the per-tensor host term).

    sudo .venv/bin/python bench/sync_links.py [--quick] [--kinds loopback,lan-1g] [--out FILE]
    → bench/results/sync_links.json (docs/benchmarks.md quotes it)

Namespaces are named hetrl-sl-*; they are removed in a finally, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from hetrl_cli.emulate.delayline import VNET_HDR, DelayLine, open_tun, pair_main

__all__ = ["VNET_HDR", "DelayLine", "open_tun"]  # the line, for tests/runtime/test_bench_sync_links.py

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "sync_links.json"
PREFIX = "hetrl-sl-"
SUBNET = "10.231.7"
PORT = 29651
REPEATS = 5
TENSOR_BYTES = 2 << 20
"""The payload is bf16 tensors of 2 MiB each (a 7B model's tensors are 2-500 MiB; this keeps the per-tensor
host term small next to the wire)."""


@dataclass(frozen=True)
class LinkKind:
    """One emulated link: how it is made and the figures the cost model is given for it."""

    name: str
    how: str
    """"lo" (one namespace), "veth" (htb-shaped veth pair) or "tun" (the userspace delay line)."""
    rate_Bps: float | None
    """The configured rate; None for loopback (the model gets the measured TCP rate instead)."""
    rtt_s: float
    """The configured round-trip delay (0 where none is added)."""
    profile_kind: str
    """The profile's LinkKind the link stands for."""


KINDS = {
    k.name: k
    for k in (
        LinkKind("loopback", "lo", None, 0.0, "loopback"),
        LinkKind("lan-10g", "veth", 10e9 / 8, 0.0, "lan"),
        LinkKind("lan-1g", "veth", 1e9 / 8, 0.0, "lan"),
        LinkKind("wan-1g-rtt0", "tun", 1e9 / 8, 0.0, "wan"),
        LinkKind("wan-1g-rtt40", "tun", 1e9 / 8, 0.040, "wan"),
    )
}


def predicted_sync_s(nbytes: float, tensors: int, bandwidth_Bps: float, latency_s: float) -> float:
    """The cost model's seconds for one weight sync of `nbytes` in `tensors` tensors from one host to one other
    host over a link of `bandwidth_Bps` and one-way `latency_s`: WeightSync.broadcast_tree_s (one region of one
    host: α + n/β, costmodel.comm.pipelined_broadcast_s) plus the per-tensor host term of WeightSync.parts
    (uncalibrated)."""
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.costmodel.comm import LinkInfo, pipelined_broadcast_s

    link = LinkInfo(bandwidth_Bps, latency_s, "lan", "bench link")
    return pipelined_broadcast_s(nbytes, [link]) + tensors * C.WEIGHT_SYNC_PER_TENSOR_S


def summarise(rows: list[dict]) -> list[dict]:
    """Per (kind, payload, bucket): measured median seconds and GB/s, the model's seconds and measured/model."""
    out = []
    for row in rows:
        median = statistics.median(row["seconds"])
        out.append(
            {
                **{k: row[k] for k in ("kind", "payload_bytes", "bucket_bytes", "chunk_bytes", "tensors")},
                "median_s": median,
                "spread_s": [min(row["seconds"]), max(row["seconds"])],
                "GB_per_s": row["payload_bytes"] / median / 1e9,
                "model_s": row["model_s"],
                "measured_over_model": median / row["model_s"],
                "model_nominal_s": row["model_nominal_s"],
                "measured_over_nominal": median / row["model_nominal_s"],
            }
        )
    return out


# ---- the delay line (hetrl_cli.emulate.delayline: the emulated cluster's latency uses the same line) ---------------

LINE_STATS: dict[str, dict] = {}
"""The delay line's packet counts per link kind (set when its link comes down)."""


# ---- namespaces -------------------------------------------------------------------------------------------------


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def teardown() -> None:
    for ns in (f"{PREFIX}a", f"{PREFIX}b"):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def link_up(kind: LinkKind) -> Iterator[tuple[str, str, str, str]]:
    """Make the link; yields (namespace of rank 0, of rank 1, rank 0's address, the interface gloo uses)."""
    a, b = f"{PREFIX}a", f"{PREFIX}b"
    teardown()
    sh("ip", "netns", "add", a)
    sh("ip", "-n", a, "link", "set", "lo", "up")
    line = None
    try:
        if kind.how == "lo":
            yield a, a, "127.0.0.1", "lo"
            return
        sh("ip", "netns", "add", b)
        sh("ip", "-n", b, "link", "set", "lo", "up")
        if kind.how == "veth":
            sh("ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b)
            for ns, host in ((a, 1), (b, 2)):
                sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{host}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                shape_veth(ns, "eth0", kind.rate_Bps or 0)
            yield a, b, f"{SUBNET}.1", "eth0"
            return
        line = subprocess.Popen(
            [sys.executable, __file__, "--delay-line", "--ns", a, b, "--rate-Bps", str(kind.rate_Bps),
             "--delay-s", str(kind.rtt_s / 2)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert line.stdout is not None
        if line.stdout.readline().strip() != "ready":
            raise RuntimeError("the delay line did not start")
        for ns, host in ((a, 1), (b, 2)):
            sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{host}/24", "dev", "tun0")
            sh("ip", "-n", ns, "link", "set", "tun0", "up", "txqueuelen", "10000")
        yield a, b, f"{SUBNET}.1", "tun0"
    finally:
        if line is not None:
            assert line.stdin is not None and line.stdout is not None
            line.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                line.wait(timeout=10)
            LINE_STATS[kind.name] = json.loads(line.stdout.read().strip() or "{}")
        teardown()


def shape_veth(ns: str, dev: str, rate_Bps: float) -> None:
    """htb at `rate_Bps` on a veth end with a 20 ms bfifo (as hetrl emulate shapes a region link)."""
    rate = f"{round(rate_Bps * 8)}bit"
    burst = str(max(16 << 10, round(rate_Bps * 1e-3)))
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
    sh("tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil",
       rate, "burst", burst, "cburst", burst, "quantum", "200000")  # fmt: skip
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:10", "bfifo", "limit", str(round(rate_Bps * 0.02)))


# ---- the two ranks ----------------------------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    """One rank: the warm-up and REPEATS syncs of every (payload, bucket); rank 1 prints one JSON row each."""
    import datetime

    import torch
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.comm import WeightChannel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.addr}:{PORT}", rank=args.rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    per = TENSOR_BYTES // 2
    for payload in args.payloads:
        count = max(1, payload // TENSOR_BYTES)
        named = [(f"w{i}", torch.full((per,), float(i % 7), dtype=torch.bfloat16)) for i in range(count)]
        for bucket, chunk in [(b, c) for b in args.buckets for c in args.chunks]:
            set_relay_chunk(comm, chunk)
            channel = WeightChannel(0, dist.group.WORLD, 2, [0, 1], "cpu", torch.bfloat16, bucket_bytes=bucket)
            seconds = []
            for attempt in range(args.repeats + 1):
                dist.barrier()
                start = time.monotonic()
                got = 0
                for pairs in channel.stream(named if args.rank == 0 else None):
                    got += sum(t.numel() for _, t in pairs)
                end = time.monotonic()
                stamps = torch.tensor([start, end], dtype=torch.float64)
                both = [torch.zeros(2, dtype=torch.float64) for _ in range(2)]
                dist.all_gather(both, stamps)
                if attempt:  # the first one also sends the names and shapes
                    seconds.append(float(both[1][1] - both[0][0]))
            assert got == count * per
            if args.rank == 1:
                print(json.dumps({"payload_bytes": count * TENSOR_BYTES, "bucket_bytes": bucket, "chunk_bytes": chunk,
                                  "tensors": count, "seconds": seconds}), flush=True)  # fmt: skip
    dist.destroy_process_group()


def set_relay_chunk(comm: object, chunk_bytes: int) -> None:
    """The relay's chunk size for this process (a diagnostic: the runtime always uses SYNC_CHUNK_BYTES)."""
    comm.SYNC_CHUNK_BYTES = chunk_bytes  # type: ignore[attr-defined]  # the tag arithmetic in _move_bucket
    relay = comm.relay  # type: ignore[attr-defined]
    relay.__defaults__ = (chunk_bytes, *relay.__defaults__[1:])


def measure_kind(
    kind: LinkKind, payloads: list[int], buckets: list[int], chunks: list[int], repeats: int
) -> tuple[list[dict], float]:
    """The rows of one link kind and the raw TCP rate measured over it (the loopback model's bandwidth)."""
    with link_up(kind) as (ns0, ns1, addr, ifname):
        tcp_Bps = tcp_rate(ns0, ns1, addr)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": ifname, "OMP_NUM_THREADS": "1"}
        common = ["--addr", addr, "--repeats", str(repeats), "--payloads", *map(str, payloads),
                  "--buckets", *map(str, buckets), "--chunks", *map(str, chunks)]  # fmt: skip
        procs = []
        for rank, ns in ((0, ns0), (1, ns1)):
            cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--worker", "--rank", str(rank), *common]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"{kind.name}: a rank failed ({[p.returncode for p in procs]})")
    latency = kind.rtt_s / 2
    rows = []
    for line in outs[1].splitlines():
        row = json.loads(line)
        row["kind"] = kind.name
        # as a profile measures the link (one TCP stream: hetrl profile's netbench), and as configured
        row["model_s"] = predicted_sync_s(row["payload_bytes"], row["tensors"], tcp_Bps, latency)
        row["model_nominal_s"] = predicted_sync_s(
            row["payload_bytes"], row["tensors"], kind.rate_Bps or tcp_Bps, latency
        )
        rows.append(row)
    return rows, tcp_Bps


TCP_PROBE = r"""
import socket, sys, time
mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 29652)); s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept(); got = 0; buf = bytearray(1 << 20); start = None
    while got < n:
        k = c.recv_into(buf)
        if start is None: start = time.monotonic()
        if not k: break
        got += k
    print(n / (time.monotonic() - start))
else:
    c = socket.create_connection((addr, 29652)); chunk = b"x" * (1 << 20)
    for _ in range(n >> 20): c.sendall(chunk)
    c.close()
"""


def tcp_rate(ns0: str, ns1: str, addr: str, nbytes: int = 256 << 20) -> float:
    """One TCP stream's rate rank 1 -> rank 0 (B/s): what a link probe measures."""
    recv = subprocess.Popen(["ip", "netns", "exec", ns0, sys.executable, "-c", TCP_PROBE, "recv", addr, str(nbytes)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert recv.stdout is not None
    recv.stdout.readline()
    sh("ip", "netns", "exec", ns1, sys.executable, "-c", TCP_PROBE, "send", addr, str(nbytes))
    return float(recv.communicate(timeout=300)[0].strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small payload, two buckets, 3 repeats")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--delay-line", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--addr", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=REPEATS, help=argparse.SUPPRESS)
    parser.add_argument("--payloads", type=int, nargs="+", default=[8 << 20, 64 << 20, 256 << 20], help="payload bytes")
    parser.add_argument("--buckets", type=int, nargs="+", default=[4 << 20, 32 << 20, 256 << 20], help="bucket bytes")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1 << 20], help="relay chunk sizes (bytes) to try")
    parser.add_argument("--ns", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--rate-Bps", dest="rate_Bps", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--delay-s", dest="delay_s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    if args.delay_line:
        return pair_main(args.ns, args.rate_Bps, args.delay_s)
    if os.geteuid() != 0:
        sys.exit("bench/sync_links.py needs root (network namespaces): run it with sudo")
    kinds = [KINDS[k] for k in args.kinds.split(",")]
    payloads, buckets, repeats = args.payloads, args.buckets, args.repeats
    if args.quick:
        payloads, buckets, repeats = [8 << 20], [4 << 20, 256 << 20], 3
    rows, tcp = [], {}
    started = time.time()
    try:
        for kind in kinds:
            kind_rows, tcp[kind.name] = measure_kind(kind, payloads, buckets, args.chunks, repeats)
            rows += kind_rows
            for row in summarise(kind_rows):
                print(json.dumps(row), flush=True)
    finally:
        teardown()
    result = {
        "command": " ".join(["bench/sync_links.py", *sys.argv[1:]]),
        "wall_s": time.time() - started,
        "kinds": {
            k.name: {**asdict(k), "tcp_stream_Bps": tcp.get(k.name), "delay_line": LINE_STATS.get(k.name)}
            for k in kinds
        },
        "rows": summarise(rows),
        "raw": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
