"""α-β communication: link lookup between hosts and one function per collective.

A message of n bytes over a link costs α + n/β (Hockney 1994). Collectives are ring algorithms, the
bandwidth-optimal ones NCCL uses for large messages (Patarasuk & Yuan 2009; Thakur et al. 2005):
  all-reduce       2(p-1)·α + 2(p-1)/p · n/β
  reduce-scatter    (p-1)·α +  (p-1)/p · n/β      (all-gather the same)
A ring runs at the speed of its slowest hop, so a group is priced on its bottleneck link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.costmodel import constants as C


@dataclass(frozen=True)
class LinkInfo:
    """A (calibrated) link: bandwidth in B/s, latency in s, and a label for explanations."""

    bandwidth_Bps: float
    latency_s: float
    kind: str
    label: str

    def worst(self, other: LinkInfo) -> LinkInfo:
        """The bottleneck of two hops: the lower bandwidth, the higher latency."""
        slow = self if self.bandwidth_Bps <= other.bandwidth_Bps else other
        latency = max(self.latency_s, other.latency_s)
        if latency == slow.latency_s:
            return slow
        return LinkInfo(slow.bandwidth_Bps, latency, slow.kind, slow.label)


LOCAL = LinkInfo(float("inf"), 0.0, "loopback", "same device")


def describe_bandwidth(bandwidth_Bps: float) -> str:
    """'1 Gbps', '25 GB/s': network links in bits, device links in bytes, as people quote them."""
    gbps = bandwidth_Bps * 8 / 1e9
    if gbps < 100:
        return f"{gbps:.3g} Gbps"
    return f"{bandwidth_Bps / 1e9:.3g} GB/s"


class Links:
    """Host-pair and intra-host links of a profile, with link-kind calibration applied."""

    def __init__(self, profile: ClusterProfile, link_calibration: dict[str, dict[str, float]] | None = None) -> None:
        self._cal = link_calibration or {}
        self._hosts = {h.name: h for h in profile.hosts}
        self._region = {h.name: h.region for h in profile.hosts}
        self._pairs: dict[frozenset[str], LinkInfo] = {}
        for lk in profile.links:
            if lk.a != lk.b:
                self._pairs[frozenset((lk.a, lk.b))] = self._make(lk.bandwidth_Bps, lk.latency_s, lk.kind, lk.a, lk.b)
        self._intra: dict[str, LinkInfo] = {}
        for h in profile.hosts:
            il = h.intra_link
            if il is not None:
                self._intra[h.name] = self._make(il.bandwidth_Bps, il.latency_s, il.kind, h.name, h.name)
            else:
                self._intra[h.name] = self._make(
                    C.DEFAULT_INTRA_BANDWIDTH_Bps, C.DEFAULT_INTRA_LATENCY_S, "pcie", h.name, h.name
                )
        self._ring_cache: dict[tuple[frozenset[str], frozenset[str]], LinkInfo] = {}

    def _make(self, bandwidth_Bps: float, latency_s: float, kind: str, a: str, b: str) -> LinkInfo:
        cal = self._cal.get(kind, {})
        bw = bandwidth_Bps * cal.get("bandwidth", 1.0)
        lat = latency_s * cal.get("latency", 1.0)
        where = f"inside {a}" if a == b else f"{a}<->{b}"
        return LinkInfo(bw, lat, kind, f"{describe_bandwidth(bw)} {kind} link {where}")

    def region(self, host: str) -> str:
        return self._region.get(host, "default")

    def intra(self, host: str) -> LinkInfo:
        """Between two devices of one host."""
        return self._intra[host]

    def between(self, a: str, b: str) -> LinkInfo:
        """Between two hosts (or inside one when a == b); a pair the profile lacks gets the slowest WAN figures."""
        if a == b:
            return self._intra[a]
        key = frozenset((a, b))
        link = self._pairs.get(key)
        if link is None:
            link = self._make(C.UNKNOWN_LINK_BANDWIDTH_Bps, C.UNKNOWN_LINK_LATENCY_S, "wan", a, b)
            link = LinkInfo(link.bandwidth_Bps, link.latency_s, "wan", link.label + " (not in profile: assumed)")
            self._pairs[key] = link
        return link

    def ring(self, hosts: frozenset[str], multi: frozenset[str] = frozenset()) -> LinkInfo:
        """Bottleneck of a ring over `hosts` ordered by (region, name) — one crossing per region boundary
        pair — plus the intra links of the hosts in `multi` (those holding more than one ring member)."""
        key = (hosts, multi)
        cached = self._ring_cache.get(key)
        if cached is not None:
            return cached
        order = sorted(hosts, key=lambda h: (self.region(h), h))
        link: LinkInfo | None = None
        if len(order) > 1:
            for i, h in enumerate(order):
                nxt = order[(i + 1) % len(order)]
                if len(order) == 2 and i == 1:
                    break
                hop = self.between(h, nxt)
                link = hop if link is None else link.worst(hop)
        for h in multi:
            hop = self._intra[h]
            link = hop if link is None else link.worst(hop)
        result = link or LOCAL
        self._ring_cache[key] = result
        return result

    def best_between(
        self, src_hosts: frozenset[str], dst_hosts: frozenset[str], nbytes: float = 0.0
    ) -> tuple[LinkInfo, str, str]:
        """The host pair from one host set to another that moves `nbytes` soonest (α + n/β; the highest
        bandwidth when nbytes is 0). A host in both sets offers its intra link (a local copy)."""
        best: tuple[float, float, LinkInfo, str, str] | None = None
        for a in sorted(src_hosts):
            for b in sorted(dst_hosts):
                link = self.between(a, b)
                cost = link.latency_s + nbytes / link.bandwidth_Bps if nbytes > 0 else -link.bandwidth_Bps
                key = (cost, link.latency_s)
                if best is None or key < best[:2]:
                    best = (cost, link.latency_s, link, a, b)
        assert best is not None, "best_between needs two non-empty host sets"
        return best[2], best[3], best[4]


def p2p_s(nbytes: float, link: LinkInfo) -> float:
    """One point-to-point message: α + n/β."""
    if nbytes <= 0:
        return 0.0
    return link.latency_s + nbytes / link.bandwidth_Bps


def allreduce_s(nbytes: float, p: int, link: LinkInfo) -> float:
    """All-reduce of n bytes over p members: the cheaper of ring, 2(p-1)·α + 2(p-1)/p · n/β, and recursive
    doubling, ⌈log2 p⌉·(α + n/β) (Thakur et al. 2005) — NCCL and vLLM's custom all-reduce switch to a
    latency-optimal algorithm for the small messages of decode steps."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    ring = 2 * (p - 1) * link.latency_s + 2 * (p - 1) / p * nbytes / link.bandwidth_Bps
    rounds = math.ceil(math.log2(p))
    doubling = rounds * (link.latency_s + nbytes / link.bandwidth_Bps)
    return min(ring, doubling)


def reduce_scatter_s(nbytes: float, p: int, link: LinkInfo) -> float:
    """Ring reduce-scatter (or all-gather) of n bytes over p members: (p-1)·α + (p-1)/p · n/β."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return (p - 1) * link.latency_s + (p - 1) / p * nbytes / link.bandwidth_Bps


allgather_s = reduce_scatter_s


def pipelined_broadcast_s(nbytes: float, hops: list[LinkInfo]) -> float:
    """A chunked broadcast along a chain/tree path: the bytes stream at the slowest hop's bandwidth and
    every hop adds its latency once (NCCL pipelines broadcast chunks along the ring)."""
    if nbytes <= 0 or not hops:
        return 0.0
    bw = min(h.bandwidth_Bps for h in hops)
    return sum(h.latency_s for h in hops) + nbytes / bw
