"""bench/sync_links.py: the cost model's figure it compares with, its userspace delay line (timing on socket pairs),
and one real run over an emulated 1 Gbit/s, 40 ms RTT link measured against the model."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchload import bench_module

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    with bench_module("sync_links") as module:
        yield module


def test_predicted_sync_is_latency_plus_bytes_over_rate_plus_tensors(bench) -> None:
    # 8 MiB over 1 Gbit/s with 20 ms one way, 4 tensors at WEIGHT_SYNC_PER_TENSOR_S (1e-4 s)
    assert bench.predicted_sync_s(8 << 20, 4, 1e9 / 8, 0.020) == pytest.approx(0.020 + (8 << 20) / 1.25e8 + 4e-4)


def test_summary_reports_the_median_and_its_ratio_to_the_model(bench) -> None:
    row = {"kind": "k", "payload_bytes": 10**9, "bucket_bytes": 1, "chunk_bytes": 1, "tensors": 1,
           "seconds": [3.0, 1.0, 2.0], "model_s": 1.0, "model_nominal_s": 0.5}  # fmt: skip
    (out,) = bench.summarise([row])
    assert out["median_s"] == 2.0 and out["GB_per_s"] == 0.5
    assert out["measured_over_model"] == 2.0 and out["measured_over_nominal"] == 4.0
    assert out["spread_s"] == [1.0, 3.0]


def test_delay_line_serialises_at_its_rate_and_drops_past_its_queue(bench) -> None:
    line = bench.DelayLine((-1, -1), rate_Bps=1000.0, delay_s=0.5, queue_s=1.0)
    packet = bytes(bench.VNET_HDR + 500)  # 0.5 s on the wire at 1000 B/s
    for _ in range(4):
        line.admit(0, packet, now=0.0)
    assert [due for due, _ in line.queues[0]] == [1.0, 1.5, 2.0]  # serialised one after the other, + 0.5 s delay
    assert line.dropped == [1, 0]  # the fourth would wait 1.5 s in the queue (> 1 s)
    assert not line.queues[1]


def test_delay_line_delivers_each_way_after_the_delay(bench) -> None:
    """Real forwarding between two packet socket pairs standing in for the TUN devices."""
    a_host, a_line = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    b_host, b_line = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a_line, b_line):
        s.setblocking(False)
    stop_read, stop_write = os.pipe()
    line = bench.DelayLine((a_line.fileno(), b_line.fileno()), rate_Bps=1e6, delay_s=0.1, queue_s=1.0)
    thread = threading.Thread(target=line.run, args=(stop_read,), daemon=True)
    thread.start()
    try:
        payload = bytes(bench.VNET_HDR) + b"x" * 50_000  # 50 ms at 1 MB/s, then 100 ms of delay
        start = time.monotonic()
        a_host.send(payload)
        b_host.settimeout(5)
        assert b_host.recv(70_000) == payload
        assert 0.14 <= time.monotonic() - start < 1.0
        b_host.send(b"y" * 20)
        a_host.settimeout(5)
        assert a_host.recv(100) == b"y" * 20
    finally:
        os.write(stop_write, b"x")
        thread.join(timeout=5)
    assert not thread.is_alive()


def sync_links_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: network namespaces and TUN devices"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    if not Path("/dev/net/tun").exists():
        return "needs /dev/net/tun"
    return None


@pytest.mark.slow
def test_sync_over_a_40ms_link_is_within_2x_of_the_model(tmp_path: Path) -> None:
    """8 MiB through the runtime's relay (1 MiB chunks) over 1 Gbit/s with 40 ms RTT. The model, given the link as
    a profile measures it (one TCP stream's rate, half the RTT), was within 1.1-1.3x on the shared box; a relay
    that posts one receive at a time pays a round trip per chunk (~0.5 s here, ~3x the model)."""
    reason = sync_links_skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "sync.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "sync_links.py"), "--kinds", "wan-1g-rtt40", "--payloads",
         str(8 << 20), "--buckets", str(4 << 20), "--repeats", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert 0.5 <= row["measured_over_model"] <= 2.0, row
    assert row["median_s"] >= 0.04  # at least the round trip and the bytes at 1 Gbit/s: the delay is real


def test_set_relay_chunk_changes_the_relay_default_and_the_tag_arithmetic(bench) -> None:
    import types

    def relay(flat, chain, group, chunk_bytes=1 << 20, wait=True, tag_base=0):
        return chunk_bytes

    fake = types.SimpleNamespace(SYNC_CHUNK_BYTES=1 << 20, relay=relay)
    bench.set_relay_chunk(fake, 16 << 20)
    assert fake.SYNC_CHUNK_BYTES == 16 << 20
    assert relay(None, [], None) == 16 << 20
    assert relay.__defaults__ == (16 << 20, True, 0)
