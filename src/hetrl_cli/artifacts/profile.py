"""ClusterProfile: the devices and links of a cluster, measured over SSH or built from a catalog.

Units are in the field names: bytes, B/s (bytes per second), seconds, TFLOP/s, GB/s (1e9 bytes/s).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from hetrl_cli.artifacts.base import Artifact, Strict, check_artifact_name
from hetrl_cli.artifacts.hosts import check_device_id, check_host_label

LinkSource = Literal["measured", "assumed", "catalog", "override", "inferred"]
LinkKind = Literal["nvlink", "pcie", "loopback", "lan", "wan"]

# Bounds of the figures, far outside any hardware, so that a hand-edited 1e308 or 1e-300 is refused here
# instead of overflowing the cost model into inf and NaN (tests/test_bad_inputs_fuzz.py found both).
MAX_BYTES = 2**60
MAX_TFLOPS = 1e6
MIN_GBPS, MAX_GBPS = 1e-3, 1e6
MIN_RATE, MAX_RATE = 1e-6, 1e12
MIN_BPS, MAX_BPS = 1.0, 1e15
MAX_LATENCY_S = 3600.0
MIN_TFLOPS = 1e-6


def _zero_or_some(tflops: float) -> float:
    """0 (no such arithmetic) or at least MIN_TFLOPS: 1e-300 TFLOP/s predicted a 1e302 s iteration."""
    if 0 < tflops < MIN_TFLOPS:
        raise ValueError(f"TFLOP/s must be 0 or at least {MIN_TFLOPS:g}")
    return tflops


class Device(Strict):
    """One accelerator (or a host's CPU when it has none)."""

    id: Annotated[str, AfterValidator(check_device_id)]
    """`host/index`, unique in the profile."""
    host: Annotated[str, AfterValidator(check_host_label)]
    """Name of the host this device sits in (matches Host.name)."""
    index: int = Field(ge=0, le=999_999)
    """Device index on its host (CUDA ordinal; 0 for a CPU device)."""
    kind: Literal["cuda", "cpu"]
    name: str
    """Model name as reported (e.g. 'NVIDIA A100-SXM4-80GB') or the CPU model."""
    memory_bytes: int = Field(gt=0, le=MAX_BYTES)
    """Device memory (host RAM share for a CPU device)."""
    peak_tflops: dict[str, Annotated[float, Field(ge=0, le=MAX_TFLOPS), AfterValidator(_zero_or_some)]] = Field(
        default_factory=dict
    )
    """Datasheet dense peak by dtype ('bf16', 'fp16', 'fp32'); empty when unknown."""
    measured_tflops: dict[str, Annotated[float, Field(ge=0, le=MAX_TFLOPS), AfterValidator(_zero_or_some)]] = Field(
        default_factory=dict
    )
    """Microbenchmark result by dtype; empty for catalog profiles."""
    memory_gbps: float = Field(ge=MIN_GBPS, le=MAX_GBPS)
    """Memory bandwidth in GB/s: measured when available, else the datasheet value."""
    peak_memory_gbps: float | None = Field(default=None, ge=MIN_GBPS, le=MAX_GBPS)
    """Datasheet memory bandwidth in GB/s, when known."""
    compute_capability: str | None = None
    cores: float | None = Field(default=None, gt=0, le=1e5)
    """CPU cores usable by this host's processes (fractional under a cgroup quota); None for GPUs."""
    decode_steps_per_s: float | None = Field(default=None, ge=MIN_RATE, le=MAX_RATE)
    """A CPU device's rate on the profiler's toy decode loop (probe.decode_steps_per_s): how fast generation's
    per-step host work runs there; None where not measured (GPUs, catalog profiles, older profiles)."""
    forward_tokens_per_s: float | None = Field(default=None, ge=MIN_RATE, le=MAX_RATE)
    """A CPU device's rate on the profiler's toy full-sequence forward pass (probe.forward_tokens_per_s): how
    fast small-model passes run there relative to other CPU devices; None where not measured."""
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    """US dollars per hour of this device (what renting it costs; `hetrl plan --objective cost`); None where
    unknown. Not a hardware fact: left out of the fingerprint, so a new price does not make plans stale."""
    price_source: Annotated[str, Field(max_length=500)] | None = None
    """Where the price comes from (the catalog's list price with its URL and date, or cluster.yaml)."""

    def tflops(self, dtype: str) -> float:
        """Achievable TFLOP/s for `dtype`: measured if we have it, else peak, else fp32 figures."""
        for table in (self.measured_tflops, self.peak_tflops):
            if dtype in table:
                return table[dtype]
        for table in (self.measured_tflops, self.peak_tflops):
            if "fp32" in table:
                return table["fp32"]
        raise KeyError(f"device {self.id} has no FLOP/s figure")


class IntraLink(Strict):
    """Bandwidth between two devices of the same host."""

    kind: LinkKind
    bandwidth_Bps: float = Field(ge=MIN_BPS, le=MAX_BPS)
    latency_s: float = Field(ge=0, le=MAX_LATENCY_S)
    source: LinkSource


class Host(Strict):
    """One machine: where it is, how it was reached and what software it has."""

    name: Annotated[str, AfterValidator(check_host_label)]
    """Label from hosts.txt (`host` or `host:port`), unique in the profile."""
    address: Annotated[str, AfterValidator(check_host_label)]
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = None
    region: str = "default"
    hostname: str | None = None
    """The host's own idea of its name (as reported by the probe)."""
    python: str = "python3"
    software: dict[str, str | None] = Field(default_factory=dict)
    """Versions: python, hetrl, torch, cuda, nccl, vllm, accelerate, transformers (None = absent)."""
    free_disk_bytes: int | None = Field(default=None, ge=0)
    cpu_count: float | None = Field(default=None, ge=0, le=1e5)
    memory_bytes: int | None = Field(default=None, ge=0)
    status: Literal["ok", "missing"] = "ok"
    """`missing`: the host could not be profiled (only in --allow-partial profiles)."""
    error: str | None = None
    """Why a missing host is missing."""
    intra_link: IntraLink | None = None
    """Link between devices inside this host (NVLink/PCIe); None for a single-device host."""


class Link(Strict):
    """A host-to-host link (symmetric)."""

    a: str
    b: str
    bandwidth_Bps: float = Field(ge=MIN_BPS, le=MAX_BPS)
    latency_s: float = Field(ge=0, le=MAX_LATENCY_S)
    kind: LinkKind = "lan"
    source: LinkSource = "measured"


OPTIONAL_FIGURES = ("cores", "decode_steps_per_s", "forward_tokens_per_s", "price_per_gpu_hour")


def check_alike_devices(devices: list[Device]) -> None:
    """Devices of one host with the same kind and name were measured (or priced) alike: each gives all of
    OPTIONAL_FIGURES that another gives. A hand-edited profile where one of eight GPUs gains a CPU-only rate
    would otherwise make the planner compare a figure with a missing one. ValueError naming both."""
    first: dict[tuple[str, str, str], Device] = {}
    for device in devices:
        other = first.setdefault((device.host, device.kind, device.name), device)
        for figure in OPTIONAL_FIGURES:
            if (getattr(device, figure) is None) != (getattr(other, figure) is None):
                raise ValueError(
                    f"device {device.id} and {other.id} are alike but only one gives {figure}: give it for both "
                    "or neither"
                )


class ClusterProfile(Artifact):
    """What a cluster is made of; the planner's only view of the hardware."""

    KIND: ClassVar[str] = "cluster-profile"
    SCHEMA_VERSION: ClassVar[int] = 1

    kind: Literal["cluster-profile"] = "cluster-profile"
    name: Annotated[str, AfterValidator(check_artifact_name)]
    created_at: str
    """ISO 8601 UTC time the profile was made."""
    method: Literal["ssh-probe", "catalog"]
    """How the facts were obtained."""
    notes: list[str] = Field(default_factory=list)
    """How and what was measured (durations, sampling), for the reader."""
    hosts: list[Host]
    devices: list[Device]
    links: list[Link]
    fingerprint: str = ""
    """Hash of the hardware facts (not timings, not timestamps); plans record it to detect staleness."""

    @model_validator(mode="after")
    def _check_references(self) -> ClusterProfile:
        host_names = [h.name for h in self.hosts]
        if len(set(host_names)) != len(host_names):
            raise ValueError("host names must be unique")
        known = set(host_names)
        ids = [d.id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ValueError("device ids must be unique")
        for device in self.devices:
            if device.host not in known:
                raise ValueError(f"device {device.id} names unknown host {device.host!r}")
        for link in self.links:
            if link.a not in known or link.b not in known:
                raise ValueError(f"link {link.a}<->{link.b} names an unknown host")
        check_alike_devices(self.devices)
        if self.fingerprint:  # never trusted as written: a forged one would make `show` report changed hardware
            self.fingerprint = self.compute_fingerprint()
        return self

    def compute_fingerprint(self) -> str:
        """sha256 over hosts, devices and link endpoints: same hardware, same fingerprint."""
        facts = {
            "hosts": sorted((h.name, h.region, h.status) for h in self.hosts),
            "devices": sorted((d.id, d.kind, d.name, d.memory_bytes) for d in self.devices),
            "links": sorted(tuple(sorted((lk.a, lk.b))) for lk in self.links),
        }
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()
        return f"sha256:{digest[:16]}"

    def with_fingerprint(self) -> ClusterProfile:
        """A copy whose fingerprint field is filled in."""
        return self.model_copy(update={"fingerprint": self.compute_fingerprint()})

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def link_map(self) -> dict[frozenset[str], Link]:
        """Host-pair links keyed by the unordered pair."""
        return {frozenset((lk.a, lk.b)): lk for lk in self.links}
