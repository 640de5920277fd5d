"""Host↔host link measurement: a one-session TCP server and its client, started on two hosts by the launcher.

    python -m hetrl_cli.profiling.netbench serve --token T [--lifetime 30]
        binds a free port on all addresses, prints {"port": P} on stdout, serves ONE client session and
        exits; it also exits when its lifetime ends or its stdin closes (the launcher's SSH channel went
        away), so a failed launch never leaves it behind.
    python -m hetrl_cli.profiling.netbench client --host A --port P --token T
        measures latency as half the median round trip of small ping-pongs and bandwidth with a bulk
        transfer bounded by bytes and seconds (whichever comes first; the seconds raised to 25 round trips
        on a long link, so slow start does not dominate), prints one JSON object.

Session protocol (one TCP connection): client sends the token (the server drops anyone else), then
`pings` one-byte messages each echoed back, then b"B" and a stream of bulk bytes ended by shutdown(WR);
the server answers with the 8-byte count of bulk bytes it received, which stops the client's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import struct
import sys
import threading
import time

CHUNK = 1 << 20
BULK_MIN_RTTS = 25
"""The bulk transfer lasts at least this many measured round trips: TCP's slow start takes ~log2(BDP / 14 KiB)
of them (5 at 50 Mbit/s and 40 ms), so a 0.2 s transfer measured the emulated 50 Mbit/s, 40 ms RTT link
(docs/emulate.md) at 32 Mbit/s; lasting 25 round trips (1 s there) it measures 43-47."""
BULK_RAISED_MAX_S = 5.0
"""...but not beyond this (well inside the server's default 30 s lifetime)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("peer closed the connection mid-message")
        data += part
    return data


def _watch_stdin_eof() -> None:
    """Exit as soon as stdin reaches EOF: the launcher holds it open for as long as it wants us."""

    def watch() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        os._exit(4)

    threading.Thread(target=watch, daemon=True).start()


def serve(token: str, lifetime_s: float, bind: str, exit_on_eof: bool) -> int:
    """Serve one measurement session, then exit (0), or exit 5 when the lifetime ends first."""
    deadline = time.monotonic() + lifetime_s
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((bind, 0))
        listener.listen(4)
        print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
        if exit_on_eof:
            _watch_stdin_eof()
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([listener], [], [], left)
            if not ready:
                break
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    if _serve_session(conn, token.encode()):
                        return 0
                except (OSError, ConnectionError):
                    continue  # a stray or broken client: wait for the real one until the deadline
    print("netbench: lifetime ended before a client completed a session", file=sys.stderr)
    return 5


def _serve_session(conn: socket.socket, token: bytes) -> bool:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if _recv_exact(conn, len(token)) != token:
        return False
    while (byte := _recv_exact(conn, 1)) == b"p":
        conn.sendall(b"p")
    if byte != b"B":
        return False
    received = 0
    while part := conn.recv(CHUNK):
        received += len(part)
    conn.sendall(struct.pack("!Q", received))
    return True


def measure(host: str, port: int, token: str, pings: int, max_bytes: int, max_seconds: float, timeout_s: float) -> dict:
    """One session against a server: latency (RTT/2, median of `pings`) and bulk bandwidth (B/s)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(token.encode())
        rtts = []
        for _ in range(pings):
            start = time.perf_counter()
            sock.sendall(b"p")
            _recv_exact(sock, 1)
            rtts.append(time.perf_counter() - start)
        sock.sendall(b"B")
        if rtts:
            max_seconds = max(max_seconds, min(BULK_MIN_RTTS * statistics.median(rtts), BULK_RAISED_MAX_S))
        payload = b"\0" * CHUNK
        sent = 0
        start = time.perf_counter()
        while sent < max_bytes and time.perf_counter() - start < max_seconds:
            view = memoryview(payload)[: min(CHUNK, max_bytes - sent)]
            sock.sendall(view)
            sent += len(view)
        sock.shutdown(socket.SHUT_WR)
        (received,) = struct.unpack("!Q", _recv_exact(sock, 8))
        elapsed = time.perf_counter() - start
    if received != sent:
        raise ConnectionError(f"server received {received} of {sent} bytes")
    return {
        "latency_s": statistics.median(rtts) / 2 if rtts else 0.0,
        "bandwidth_Bps": sent / elapsed,
        "bytes": sent,
        "seconds": round(elapsed, 6),
        "pings": pings,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hetrl_cli.profiling.netbench")
    sub = parser.add_subparsers(dest="command", required=True)
    srv = sub.add_parser("serve", help="serve one measurement session")
    srv.add_argument("--token", required=True)
    srv.add_argument("--lifetime", type=float, default=30.0, help="seconds before giving up on a client")
    srv.add_argument("--bind", default="0.0.0.0")
    srv.add_argument("--exit-on-eof", action="store_true", help="exit when stdin closes (launched over SSH)")
    cli = sub.add_parser("client", help="measure against a server")
    cli.add_argument("--host", required=True)
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--token", required=True)
    cli.add_argument("--pings", type=int, default=20)
    cli.add_argument("--max-bytes", type=int, default=64 << 20)
    cli.add_argument("--max-seconds", type=float, default=1.0)
    cli.add_argument("--timeout", type=float, default=10.0, help="socket timeout in seconds")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.command == "serve":
        return serve(args.token, args.lifetime, args.bind, args.exit_on_eof)
    try:
        result = measure(args.host, args.port, args.token, args.pings, args.max_bytes, args.max_seconds, args.timeout)
    except (OSError, ConnectionError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 3
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
