"""The end-of-`profile` summary: hosts with their devices, and links (listed, or grouped when many).

Used for SSH profiles and catalog profiles alike, so every figure says whether it was measured or is a
datasheet peak. Draws on the given (stderr) console; never prints to stdout.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link

if TYPE_CHECKING:
    from rich.console import Console

LIST_LINKS_UP_TO = 12
"""More links than this are summarised per region pair, kind and source."""


def bandwidth_text(bps: float) -> str:
    """B/s → `12.5 GB/s` (bytes, SI) with the bit rate for network-sized figures: `1.25 GB/s (10 Gb/s)`."""
    for scale, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if bps >= scale:
            text = f"{bps / scale:.3g} {unit}"
            break
    else:
        text = f"{bps:.3g} B/s"
    gbit = bps * 8 / 1e9
    return f"{text} ({gbit:.3g} Gb/s)" if gbit < 1000 else text


def latency_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def bytes_text(n: int | float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def compute_text(device: Device) -> str:
    """Best figure per device: measured (m) before datasheet peak (p), bf16 before fp32."""
    for table, mark in ((device.measured_tflops, "m"), (device.peak_tflops, "p")):
        for dtype in ("bf16", "fp16", "fp32"):
            if dtype in table:
                value = table[dtype]
                figure = f"{value:.3g} TFLOP/s" if value >= 1 else f"{value * 1e3:.3g} GFLOP/s"
                return f"{figure} {dtype} ({mark})"
    return "-"


def _intra_text(link: IntraLink | None) -> str:
    if link is None:
        return "-"
    return f"{link.kind} {bandwidth_text(link.bandwidth_Bps).split(' (')[0]} ({link.source})"


def _device_text(devices: list[Device]) -> str:
    names = Counter(d.name for d in devices)
    return ", ".join(f"{count}× {name}" for name, count in names.items()) or "-"


HOST_COLUMNS = ("host", "region", "devices", "memory", "compute", "mem BW", "cores", "decode", "forward", "intra-host")


def hosts_table(profile: ClusterProfile) -> Table:
    table = Table(
        title=f"{profile.name}: {len(profile.hosts)} hosts, {len(profile.devices)} devices", title_justify="left"
    )
    for column in HOST_COLUMNS:
        table.add_column(column, overflow="fold")
    by_host: dict[str, list[Device]] = {h.name: [] for h in profile.hosts}
    for device in profile.devices:
        by_host[device.host].append(device)
    for host in profile.hosts:
        table.add_row(*_host_row(host, by_host[host.name]))
    return table


def _host_row(host: Host, devices: list[Device]) -> list[str]:
    if host.status == "missing":
        reason = escape(host.error or "not profiled")
        row = [f"[red]{escape(host.name)}[/]", host.region, f"[red]missing: {reason}[/]"]
        return row + [""] * (len(HOST_COLUMNS) - len(row))
    first = devices[0] if devices else None
    cores = first.cores if first and first.cores is not None else host.cpu_count
    return [
        escape(host.name),
        host.region,
        _device_text(devices),
        bytes_text(first.memory_bytes) if first else "-",
        compute_text(first) if first else "-",
        f"{first.memory_gbps:.3g} GB/s" if first else "-",
        f"{cores:g}" if cores is not None else "-",
        f"{first.decode_steps_per_s:.0f} steps/s" if first and first.decode_steps_per_s else "-",
        f"{first.forward_tokens_per_s / 1e3:.1f}k tokens/s" if first and first.forward_tokens_per_s else "-",
        _intra_text(host.intra_link),
    ]


def links_table(profile: ClusterProfile) -> Table:
    """Each link when few; else one row per (region pair, kind, source) with count and spread."""
    if len(profile.links) <= LIST_LINKS_UP_TO:
        table = Table(title="links", title_justify="left")
        for column in ("a", "b", "bandwidth", "latency", "kind", "source"):
            table.add_column(column)
        for link in profile.links:
            table.add_row(
                escape(link.a),
                escape(link.b),
                bandwidth_text(link.bandwidth_Bps),
                latency_text(link.latency_s),
                link.kind,
                link.source,
            )
        return table
    region = {h.name: h.region for h in profile.hosts}
    groups: dict[tuple[str, str, str, str], list[Link]] = {}
    for link in profile.links:
        ra, rb = sorted((region[link.a], region[link.b]))
        groups.setdefault((ra, rb, link.kind, link.source), []).append(link)
    table = Table(title=f"links ({len(profile.links)}, grouped)", title_justify="left")
    for column in ("regions", "kind", "source", "links", "bandwidth (min / median)", "latency (median)"):
        table.add_column(column)
    for (ra, rb, kind, source), links in sorted(groups.items()):
        bws = [lk.bandwidth_Bps for lk in links]
        table.add_row(
            f"{ra} ↔ {rb}",
            kind,
            source,
            str(len(links)),
            f"{bandwidth_text(min(bws))} / {bandwidth_text(statistics.median(bws))}",
            latency_text(statistics.median(lk.latency_s for lk in links)),
        )
    return table


def print_profile_summary(profile: ClusterProfile, console: Console) -> None:
    """Hosts and devices, links, notes and the fingerprint, on `console` (stderr in the CLI)."""
    console.print(hosts_table(profile))
    if profile.links:
        console.print(links_table(profile))
    elif len([h for h in profile.hosts if h.status == "ok"]) > 1:
        console.print("[yellow]no host-to-host links in this profile[/]")
    missing = [h for h in profile.hosts if h.status == "missing"]
    if missing:
        console.print(f"[yellow]partial profile: {len(missing)} host(s) missing[/]")
    for note in profile.notes:
        console.print(f"[dim]· {escape(note)}[/]", highlight=False)
    fingerprint = profile.fingerprint or profile.compute_fingerprint()
    console.print(f"method {profile.method}, fingerprint {fingerprint}", highlight=False)
