"""`python -m hetrl_cli.runtime.storebind ADDRESS MODULE ARGS...`: run MODULE as `python -m MODULE ARGS...` would
(accelerate's launcher, torchrun, or a lone worker), with every c10d TCPStore server it starts listening on
ADDRESS only.

Why: torch's TCPStore server listens on every interface (`*:PORT`, IPv4 and IPv6) and has no bind-address
option, only `master_listen_fd`: a listening socket the caller made. The store holds the run's rendezvous;
whoever reaches its port can read and write it. torchrun's agent (or rank 0 of a one-process run) creates the
store deep inside torch, so this wrapper swaps `torch.distributed.TCPStore` for a subclass that, for a server
without a socket of its own, makes one bound to ADDRESS (loopback for a one-host run; the host's address from
hosts.txt for a multi-host run) and hands it over. Clients and every other argument pass through unchanged.
Gloo's own listeners follow GLOO_SOCKET_IFNAME, which the launchers set to the run's interface.
"""

from __future__ import annotations

import contextlib
import errno
import runpy
import socket
import sys
from typing import Any

TCPSTORE_PARAMS = (
    "host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
    "master_listen_fd", "use_libuv",
)  # fmt: skip
"""torch.distributed.TCPStore's parameters, in order (positional calls are mapped onto these names)."""


def listening_socket(address: str, port: int) -> socket.socket | None:
    """A TCP socket listening on (address, port); None when the port is taken there (a multi-tenant store
    already serves it in this process: torch then reuses that server or reports the clash itself)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        why = f"cannot listen on {address}:{port} for the run's rendezvous: {exc.strerror}"
        raise OSError(exc.errno, why) from None
    return sock


def resolve(address: str) -> str:
    """The IP address `address` (a name or address from hosts.txt) has on this host: IPv4 for a name, as
    the launchers' `--master_addr` resolves; an IPv6 literal as given."""
    if ":" in address:
        return address.strip("[]")
    try:
        return socket.gethostbyname(address)
    except OSError as exc:
        raise OSError(f"cannot resolve {address!r} on this host to bind the run's rendezvous store: {exc}") from None


def bind_stores(address: str) -> None:
    """From now on, TCPStore servers created in this process listen on `address` only."""
    import torch.distributed as dist

    original = dist.TCPStore

    class BoundTCPStore(original):  # type: ignore[misc, valid-type]
        """A TCPStore whose server socket listens on the run's address, not on every interface."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given = dict(zip(TCPSTORE_PARAMS, args, strict=False)) | kwargs
            if given.get("is_master") and given.get("master_listen_fd") is None:
                sock = listening_socket(resolve(address), int(given.get("port") or 0))
                if sock is not None:
                    given["port"] = sock.getsockname()[1]
                    given["master_listen_fd"] = sock.detach()  # the store owns (and closes) it from here
            super().__init__(**given)

    for module in list(sys.modules.values()):
        with contextlib.suppress(Exception):
            if getattr(module, "TCPStore", None) is original:
                module.TCPStore = BoundTCPStore  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        sys.exit("usage: python -m hetrl_cli.runtime.storebind ADDRESS MODULE [ARGS...]")
    address, module, *rest = args
    bind_stores(address)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
