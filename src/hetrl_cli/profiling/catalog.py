"""Datasheet catalog → ClusterProfile: plan for a cluster you do not have (yet) or cannot reach.

A cluster.yaml names node groups (GPU type × GPUs per node × nodes, in a region) and the network between
them; the GPU figures come from the datasheet catalog `hetrl_cli/data/gpus.yaml`. docs/catalog.md is the
reference for both files. Example (see profiles/paper-*.yaml for full ones):

    name: two-sites
    node_groups:
      - {gpu: A100 80GB, gpus_per_node: 8, nodes: 2, region: us-east-1}
      - {gpu: L4, gpus_per_node: 8, nodes: 1, region: edge, name_prefix: edge-l4}
    network:
      intra_region: {bandwidth: 100Gbps, latency: 0.1ms}
      inter_region:
        default: {bandwidth: 5Gbps, latency: 10ms}
      overrides:
        - {between: [edge-l4, "*"], scope: inter-region, bandwidth: 1Gbps, label: edge}

Hosts are named `{prefix}-{i}` (prefix from the GPU type unless given; `i` counts on across groups that
share a prefix), devices `{host}/{index}`, and there is exactly one Link per host pair: `lan` inside a
region, `wan` across regions. Latencies are one-way (the α of an α-β model); bandwidths per direction.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from hetrl_cli.artifacts.base import Strict
from hetrl_cli.artifacts.io import format_validation_error, read_text
from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link, LinkKind
from hetrl_cli.artifacts.yamltext import load_yaml_text
from hetrl_cli.errors import BadInput, one_line
from hetrl_cli.profiling.links import parse_bandwidth, parse_latency

GIB = 2**30
GB = 1e9
MICROSECONDS_PER_S = 1e6
CATALOG_RESOURCE = "gpus.yaml"
_PREFIX_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_REGION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


# ---------------------------------------------------------------------------------------------------------
# The GPU datasheet catalog (package data)


class Interconnect(Strict):
    """The GPU-to-GPU path inside a node, as the datasheet gives it."""

    kind: Literal["nvlink", "pcie"]
    bandwidth_GBps: float = Field(gt=0)
    """Per direction, per GPU (half the datasheet's bidirectional figure)."""
    latency_us: float = Field(ge=0)
    """Assumed small-message latency; datasheets give none."""
    source: str


class GpuPrice(Strict):
    """A published on-demand list price of an instance with this GPU, as read (docs/catalog.md "Prices")."""

    provider: str
    instance: str
    gpus_per_instance: int = Field(gt=0)
    instance_usd_per_hour: float = Field(gt=0)
    region: str
    url: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    """When the price was read (list prices change; re-read before trusting a cost)."""
    note: str = ""

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.instance_usd_per_hour / self.gpus_per_instance

    def label(self) -> str:
        """'AWS p5.48xlarge us-east-1 on-demand, 55.04 $/h / 8 GPUs (2026-11-09)': the profile's price_source."""
        return (
            f"{self.provider} {self.instance} {self.region} on-demand, {self.instance_usd_per_hour} $/h / "
            f"{self.gpus_per_instance} GPU{'s' if self.gpus_per_instance > 1 else ''} ({self.date}, {self.url})"
        )


class GpuSpec(Strict):
    """One GPU type's datasheet figures."""

    name: str
    """Canonical catalog name, e.g. 'A100 80GB'."""
    device_name: str
    """What the CUDA driver reports (`nvidia-smi --query-gpu=name`), e.g. 'NVIDIA A100-SXM4-80GB'."""
    aliases: list[str] = Field(default_factory=list)
    prefix: str = Field(pattern=_PREFIX_PATTERN)
    """Default host-name prefix in a cluster.yaml (`a100` → hosts a100-0, a100-1, ...)."""
    memory_gib: float = Field(gt=0)
    memory_type: str
    memory_gbps: float = Field(gt=0)
    peak_tflops: dict[str, float]
    """Dense (no sparsity) peak by dtype; no 'bf16' key on GPUs without bf16 hardware."""
    bf16: bool
    """Whether the GPU has bf16 arithmetic (V100, T4: no)."""
    compute_capability: str
    interconnect: str
    """Key into the catalog's `interconnects`."""
    source: str
    """The datasheet the figures come from."""
    price: GpuPrice | None = None
    """Published on-demand price; None where none was found (then cluster.yaml must give one for cost plans)."""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @model_validator(mode="after")
    def _bf16_figure_matches_flag(self) -> GpuSpec:
        if self.bf16 != ("bf16" in self.peak_tflops):
            raise ValueError(f"{self.name}: 'bf16: {self.bf16}' disagrees with its peak_tflops keys")
        return self


class GpuCatalog(Strict):
    """The whole datasheet file, with a case-insensitive index over names, aliases and driver names."""

    interconnects: dict[str, Interconnect]
    gpus: list[GpuSpec]

    @model_validator(mode="after")
    def _check_names(self) -> GpuCatalog:
        seen: dict[str, str] = {}
        for gpu in self.gpus:
            if gpu.interconnect not in self.interconnects:
                raise ValueError(f"{gpu.name}: unknown interconnect {gpu.interconnect!r}")
            for key in {normalize_gpu_name(n) for n in (gpu.name, gpu.device_name, *gpu.aliases)}:
                if key in seen and seen[key] != gpu.name:
                    raise ValueError(f"name {key!r} is used by both {seen[key]} and {gpu.name}")
                seen[key] = gpu.name
        return self

    def index(self) -> dict[str, GpuSpec]:
        return {normalize_gpu_name(n): gpu for gpu in self.gpus for n in (gpu.name, gpu.device_name, *gpu.aliases)}

    def names(self) -> list[str]:
        return [gpu.name for gpu in self.gpus]


def normalize_gpu_name(text: str) -> str:
    """Lower-case, spaces/underscores as dashes, no vendor word: 'NVIDIA A100 80GB' → 'a100-80gb'."""
    key = re.sub(r"[\s_-]+", "-", text.strip().lower())
    for vendor in ("nvidia-", "tesla-", "geforce-"):
        key = key.removeprefix(vendor)
    return key


def parse_catalog(text: str, where: str) -> GpuCatalog:
    """Parse a catalog file's text (the packaged one, or a test's)."""
    try:
        return GpuCatalog.model_validate(_load_yaml(text, where))
    except ValidationError as exc:
        raise BadInput(format_validation_error(where, exc)) from None


@lru_cache(maxsize=1)
def load_catalog() -> GpuCatalog:
    """The packaged datasheet catalog (read once per process)."""
    text = resources.files("hetrl_cli").joinpath("data").joinpath(CATALOG_RESOURCE).read_text(encoding="utf-8")
    return parse_catalog(text, f"hetrl_cli/data/{CATALOG_RESOURCE}")


def gpu_spec(name: str) -> GpuSpec:
    """Look a GPU type up by name, alias or driver name, case-insensitively.

    >>> gpu_spec("a100-80gb").name, gpu_spec("NVIDIA A100-SXM4-80GB").name
    ('A100 80GB', 'A100 80GB')
    """
    catalog = load_catalog()
    found = catalog.index().get(normalize_gpu_name(name))
    if found is None:
        raise BadInput(f"unknown GPU type {one_line(repr(name), 60)}; known types: {', '.join(catalog.names())}")
    return found


def catalog_price(device_name: str) -> tuple[float, str] | None:
    """(the catalog's $/GPU-hour, its source 'catalog: …') for a probed device name ('NVIDIA H100 80GB HBM3')
    that names a catalog GPU with a list price; None otherwise (unknown GPU, no price found, a CPU)."""
    found = load_catalog().index().get(normalize_gpu_name(device_name))
    if found is None or found.price is None:
        return None
    return found.price.usd_per_gpu_hour, f"catalog: {found.price.label()}"


# ---------------------------------------------------------------------------------------------------------
# cluster.yaml


def _require_text(value: Any, what: str, example: str) -> Any:
    """Numbers without units are ambiguous in a hand-written file (100 what?), so insist on text."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"write the {what} as text with its unit, e.g. {example!r}")
    return value


class _LinkFiguresAsText(Strict):
    """Both link specs below take their figures as text with units (see _require_text)."""

    @field_validator("bandwidth", mode="before", check_fields=False)
    @classmethod
    def _bandwidth_text(cls, value: Any) -> Any:
        return _require_text(value, "bandwidth", "5Gbps")

    @field_validator("latency", mode="before", check_fields=False)
    @classmethod
    def _latency_text(cls, value: Any) -> Any:
        return _require_text(value, "latency", "10ms")


class LinkSpec(_LinkFiguresAsText):
    """Bandwidth and latency of a class of links, as text with units."""

    bandwidth: str
    """Per direction, e.g. '5Gbps', '25GB/s'."""
    latency: str
    """One-way, e.g. '10ms', '50us'."""


class PartialLinkSpec(_LinkFiguresAsText):
    """A change to some links: either figure, or both."""

    bandwidth: str | None = None
    latency: str | None = None

    @model_validator(mode="after")
    def _something_given(self) -> PartialLinkSpec:
        if self.bandwidth is None and self.latency is None:
            raise ValueError("give a bandwidth, a latency or both")
        return self


class NodeGroup(Strict):
    """`nodes` identical machines with `gpus_per_node` GPUs of one type, in one region."""

    gpu: str
    """GPU type: a catalog name or alias (case-insensitive), e.g. 'A100 80GB', 'l40s'."""
    gpus_per_node: int = Field(gt=0, le=64)
    nodes: int = Field(default=1, gt=0, le=1000)  # links grow as hosts²: a million hosts would never finish
    region: str = Field(default="default", pattern=_REGION_PATTERN)
    name_prefix: str | None = Field(default=None, pattern=_PREFIX_PATTERN)
    """Host names are `{name_prefix}-{i}`; default: the GPU type's catalog prefix (a100, l40s, ...)."""
    intra_link: PartialLinkSpec | None = None
    """Override the GPU-to-GPU link inside these nodes (default: the catalog's NVLink/PCIe figures)."""
    price_per_gpu_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """US dollars per GPU-hour for these nodes (your contract, spot, another region); default: the catalog's
    on-demand list price, where it has one."""


class RegionPair(LinkSpec):
    """The link class between two regions."""

    regions: tuple[str, str]


class InterRegion(Strict):
    """Links between hosts of different regions."""

    default: LinkSpec | None = None
    """For region pairs not listed in `pairs`."""
    pairs: list[RegionPair] = Field(default_factory=list)


class LinkOverride(PartialLinkSpec):
    """Change the links between two sets of hosts, applied after the region rules, in file order."""

    between: tuple[str, str]
    """Two selectors: a host name, a name prefix (all its hosts) or '*' (any host)."""
    scope: Literal["any", "intra-region", "inter-region"] = "any"
    """Which of the matching pairs to change."""
    label: str | None = None
    """What these links are (e.g. 'edge'), recorded in the profile notes."""


class NetworkSpec(Strict):
    """How hosts talk to each other (inside a host, the GPU catalog decides)."""

    intra_region: LinkSpec | None = None
    """Between hosts of one region; needed when a region has more than one host."""
    inter_region: InterRegion = Field(default_factory=InterRegion)
    overrides: list[LinkOverride] = Field(default_factory=list)


class ClusterSpec(Strict):
    """A cluster.yaml: the machines and the network, by kind rather than by address."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    """Profile name; default: the file name without extension."""
    notes: list[str] = Field(default_factory=list)
    """Copied into the profile (why the numbers are what they are)."""
    node_groups: list[NodeGroup] = Field(min_length=1)
    network: NetworkSpec = Field(default_factory=NetworkSpec)

    @field_validator("node_groups")
    @classmethod
    def _at_most_1000_hosts(cls, groups: list[NodeGroup]) -> list[NodeGroup]:
        if sum(g.nodes for g in groups) > 1000:
            raise ValueError("at most 1000 nodes in all: a profile's links grow as the square of its hosts")
        return groups


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a hand-edited cluster file deserves an error."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; the safe constructor reports it below
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {one_line(repr(key), 60)}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _load_yaml(text: str, where: str) -> Any:
    """YAML text → Python data; errors as `where:line: what`."""
    try:
        return load_yaml_text(text, where, _UniqueKeyLoader)  # a SafeLoader subclass; YAML bombs refused
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{where}{line}: not valid YAML: {one_line(str(exc.problem or exc.context))}") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"{where}: not valid YAML: {one_line(str(exc))}") from None


def parse_cluster_spec(data: Any, where: str) -> ClusterSpec:
    """Validate cluster.yaml data (already parsed YAML) into a ClusterSpec; errors name `where` and the field."""
    if data is None:
        raise BadInput(f"{where}: empty cluster file: add 'node_groups:' with at least one group (docs/catalog.md)")
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a mapping with 'node_groups' and 'network', got {type(data).__name__}")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise BadInput(format_validation_error(where, exc, every=True)) from None


# ---------------------------------------------------------------------------------------------------------
# Building the profile


@dataclass(frozen=True)
class _HostPlan:
    """A host to be, before the pydantic objects are made: its name, prefix, region and node group."""

    name: str
    prefix: str
    region: str
    group: int


def _field(where: str, loc: str) -> str:
    return f"{where}: field '{loc}'"


def _resolve_gpus(spec: ClusterSpec, where: str) -> list[GpuSpec]:
    """Catalog entry per node group; an unknown type names the field and lists the known ones."""
    found, unknown = [], []
    for i, group in enumerate(spec.node_groups):
        try:
            found.append(gpu_spec(group.gpu))
        except BadInput:
            unknown.append(f"field 'node_groups.{i}.gpu': unknown GPU type {one_line(repr(group.gpu), 60)}")
    if unknown:  # every unknown type at once, then the known ones
        known = ", ".join(load_catalog().names())
        raise BadInput(f"{where}: {'; '.join(unknown)}; known types: {known}")
    return found


def _plan_hosts(spec: ClusterSpec, gpus: list[GpuSpec]) -> list[_HostPlan]:
    """Host names in file order: `{prefix}-{i}`, `i` counting on across groups that share a prefix."""
    counters: dict[str, int] = {}
    hosts = []
    for g, (group, gpu) in enumerate(zip(spec.node_groups, gpus, strict=True)):
        prefix = group.name_prefix or gpu.prefix
        for _ in range(group.nodes):
            index = counters.get(prefix, 0)
            counters[prefix] = index + 1
            hosts.append(_HostPlan(name=f"{prefix}-{index}", prefix=prefix, region=group.region, group=g))
    return hosts


def _intra_link(group: NodeGroup, gpu: GpuSpec, where: str, loc: str) -> IntraLink | None:
    """The catalog's NVLink/PCIe figures, unless the group overrides them; None for one-GPU nodes."""
    if group.gpus_per_node == 1:
        return None
    link = load_catalog().interconnects[gpu.interconnect]
    bandwidth = link.bandwidth_GBps * GB
    latency = link.latency_us / MICROSECONDS_PER_S  # division keeps 5 us at 5e-06 exactly
    override = group.intra_link
    if override is not None and override.bandwidth is not None:
        bandwidth = parse_bandwidth(override.bandwidth, _field(where, f"{loc}.intra_link.bandwidth"))
    if override is not None and override.latency is not None:
        latency = parse_latency(override.latency, _field(where, f"{loc}.intra_link.latency"))
    return IntraLink(kind=link.kind, bandwidth_Bps=bandwidth, latency_s=latency, source="catalog")


def _figures(link: LinkSpec | PartialLinkSpec, where: str, loc: str) -> tuple[float | None, float | None]:
    """(bytes/s, seconds) of a link spec; None where a partial spec leaves a figure alone."""
    bandwidth = None if link.bandwidth is None else parse_bandwidth(link.bandwidth, _field(where, f"{loc}.bandwidth"))
    latency = None if link.latency is None else parse_latency(link.latency, _field(where, f"{loc}.latency"))
    return bandwidth, latency


def _both(link: LinkSpec, where: str, loc: str) -> tuple[float, float]:
    bandwidth, latency = _figures(link, where, loc)
    assert bandwidth is not None and latency is not None  # a LinkSpec has both
    return bandwidth, latency


@dataclass(frozen=True)
class _Network:
    """The network rules with every figure parsed once (so a bad figure is an error even where unused)."""

    intra: tuple[float, float] | None
    default: tuple[float, float] | None
    pairs: dict[frozenset[str], tuple[float, float]]
    overrides: list[tuple[LinkOverride, float | None, float | None]]


def _parse_network(spec: ClusterSpec, regions: set[str], where: str) -> _Network:
    network = spec.network
    intra = None if network.intra_region is None else _both(network.intra_region, where, "network.intra_region")
    default = network.inter_region.default
    return _Network(
        intra=intra,
        default=None if default is None else _both(default, where, "network.inter_region.default"),
        pairs=_region_table(spec, regions, where),
        overrides=[(o, *_figures(o, where, f"network.overrides.{i}")) for i, o in enumerate(network.overrides)],
    )


def _region_table(spec: ClusterSpec, regions: set[str], where: str) -> dict[frozenset[str], tuple[float, float]]:
    """Figures per listed region pair; a pair listed twice, of one region, or of an unused region is an error."""
    table: dict[frozenset[str], tuple[float, float]] = {}
    for i, pair in enumerate(spec.network.inter_region.pairs):
        loc = f"network.inter_region.pairs.{i}"
        a, b = pair.regions
        if a == b:
            raise BadInput(
                f"{_field(where, loc + '.regions')}: both ends are {one_line(repr(a), 60)}; use network.intra_region"
            )
        for region in (a, b):
            if region not in regions:
                raise BadInput(
                    f"{_field(where, loc + '.regions')}: no node group is in region {one_line(repr(region), 60)}; "
                    f"regions in use: {', '.join(sorted(regions))}"
                )
        key = frozenset((a, b))
        if key in table:
            raise BadInput(f"{_field(where, loc + '.regions')}: region pair {a}<->{b} is listed twice")
        table[key] = _both(pair, where, loc)
    return table


def _base_link(a: _HostPlan, b: _HostPlan, network: _Network, where: str) -> tuple[float, float, LinkKind]:
    """Figures from the region rules alone: intra_region, the listed pair, or inter_region.default."""
    if a.region == b.region:
        if network.intra is None:
            raise BadInput(
                f"{_field(where, 'network.intra_region')}: hosts {a.name} and {b.name} share region {a.region!r}: "
                "give network.intra_region, e.g. {bandwidth: 100Gbps, latency: 0.1ms}"
            )
        return (*network.intra, "lan")
    figures = network.pairs.get(frozenset((a.region, b.region)), network.default)
    if figures is None:
        raise BadInput(
            f"{_field(where, 'network.inter_region')}: no link between regions {a.region!r} and {b.region!r}: "
            "add network.inter_region.default or a pair for them"
        )
    return (*figures, "wan")


def _selects(selector: str, host: _HostPlan) -> bool:
    return selector in ("*", host.name, host.prefix)


def _check_selectors(spec: ClusterSpec, hosts: list[_HostPlan], where: str) -> None:
    """A selector that names no host is a typo, not a no-op."""
    names = {h.name for h in hosts} | {h.prefix for h in hosts}
    for i, override in enumerate(spec.network.overrides):
        for selector in override.between:
            if selector != "*" and selector not in names:
                raise BadInput(
                    f"{_field(where, f'network.overrides.{i}.between')}: {one_line(repr(selector), 60)} is no host "
                    "name or prefix; "
                    f"prefixes: {', '.join(sorted({h.prefix for h in hosts}))}"
                )


def _apply_overrides(
    a: _HostPlan, b: _HostPlan, figures: tuple[float, float], network: _Network, used: set[int]
) -> tuple[float, float]:
    """Later overrides win; each one changes only the figures it gives."""
    bandwidth, latency = figures
    for i, (override, new_bandwidth, new_latency) in enumerate(network.overrides):
        first, second = override.between
        matches = (_selects(first, a) and _selects(second, b)) or (_selects(first, b) and _selects(second, a))
        same_region = a.region == b.region
        in_scope = override.scope == "any" or (override.scope == "intra-region") == same_region
        if not (matches and in_scope):
            continue
        used.add(i)
        bandwidth = bandwidth if new_bandwidth is None else new_bandwidth
        latency = latency if new_latency is None else new_latency
    return bandwidth, latency


def _links(spec: ClusterSpec, hosts: list[_HostPlan], where: str) -> list[Link]:
    """Exactly one link per host pair, in host order; every override must change at least one."""
    _check_selectors(spec, hosts, where)
    network = _parse_network(spec, {h.region for h in hosts}, where)
    used: set[int] = set()
    links = []
    for a, b in combinations(hosts, 2):
        bandwidth, latency, kind = _base_link(a, b, network, where)
        bandwidth, latency = _apply_overrides(a, b, (bandwidth, latency), network, used)
        links.append(Link(a=a.name, b=b.name, bandwidth_Bps=bandwidth, latency_s=latency, kind=kind, source="catalog"))
    for i, override in enumerate(spec.network.overrides):
        if i not in used:
            raise BadInput(
                f"{_field(where, f'network.overrides.{i}')}: matches no host pair "
                f"(between {one_line(repr(override.between[0]), 60)} and {one_line(repr(override.between[1]), 60)}, "
                f"scope {override.scope})"
            )
    return links


def _price(group: NodeGroup, gpu: GpuSpec, index: int) -> tuple[float | None, str | None]:
    """($/GPU-hour, where it comes from) of a node group: its own price, else the catalog's, else unknown."""
    if group.price_per_gpu_hour is not None:
        return group.price_per_gpu_hour, f"cluster.yaml node_groups.{index}.price_per_gpu_hour"
    if gpu.price is not None:
        return gpu.price.usd_per_gpu_hour, f"catalog: {gpu.price.label()}"
    return None, None


def _devices(host: _HostPlan, group: NodeGroup, gpu: GpuSpec) -> list[Device]:
    price, price_source = _price(group, gpu, host.group)
    return [
        Device(
            id=f"{host.name}/{index}",
            host=host.name,
            index=index,
            kind="cuda",
            name=gpu.device_name,
            memory_bytes=gpu.memory_bytes,
            peak_tflops=dict(gpu.peak_tflops),
            memory_gbps=gpu.memory_gbps,
            peak_memory_gbps=gpu.memory_gbps,
            compute_capability=gpu.compute_capability,
            price_per_gpu_hour=price,
            price_source=price_source,
        )
        for index in range(group.gpus_per_node)
    ]


def _notes(spec: ClusterSpec, gpus: list[GpuSpec], source_label: str, overrides_used: list[str]) -> list[str]:
    notes = [
        f"built from {source_label} and the GPU datasheet catalog; nothing was measured",
        "peak_tflops are dense datasheet figures; link latencies are one-way, bandwidths per direction",
    ]
    for gpu in {gpu.name: gpu for gpu in gpus}.values():  # first-seen order, no repeats
        notes.append(f"{gpu.name} ({gpu.device_name}): {gpu.source}")
        if not gpu.bf16:
            notes.append(f"{gpu.name} has no bf16 hardware: no bf16 figure (plan it with fp16)")
    notes.extend(overrides_used)
    notes.extend(spec.notes)
    return notes


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _build(spec: ClusterSpec, name: str, where: str, source_label: str, created_at: str | None) -> ClusterProfile:
    """_build_profile, a figure outside a profile's bounds (1e300Gbps) as one line naming the file."""
    try:
        return _build_profile(spec, name, where, source_label, created_at)
    except ValidationError as exc:
        raise BadInput(format_validation_error(f"{where}: out of a profile's range", exc)) from None


def _build_profile(
    spec: ClusterSpec, name: str, where: str, source_label: str, created_at: str | None
) -> ClusterProfile:
    """The profile of `spec`: 1) catalog entries, 2) host names, 3) devices and intra links, 4) host links."""
    gpus = _resolve_gpus(spec, where)
    plans = _plan_hosts(spec, gpus)
    hosts: list[Host] = []
    devices: list[Device] = []
    for plan in plans:
        group, gpu = spec.node_groups[plan.group], gpus[plan.group]
        intra = _intra_link(group, gpu, where, f"node_groups.{plan.group}")
        hosts.append(Host(name=plan.name, address=plan.name, region=plan.region, intra_link=intra))
        devices.extend(_devices(plan, group, gpu))
    links = _links(spec, plans, where)
    labelled = [
        f"{o.label} links: between {o.between[0]} and {o.between[1]} ({o.scope})"
        for o in spec.network.overrides
        if o.label
    ]
    profile = ClusterProfile(
        name=name,
        created_at=created_at or _now_iso(),
        method="catalog",
        notes=_notes(spec, gpus, source_label, labelled),
        hosts=hosts,
        devices=devices,
        links=links,
    )
    return profile.with_fingerprint()


def profile_from_cluster(
    spec: dict[str, Any] | ClusterSpec, name: str | None = None, *, created_at: str | None = None
) -> ClusterProfile:
    """A catalog profile from a cluster spec given in code (a dict as in cluster.yaml, or a ClusterSpec)."""
    where = "cluster spec"
    cluster = spec if isinstance(spec, ClusterSpec) else parse_cluster_spec(spec, where)
    final_name = name or cluster.name
    if not final_name:
        raise BadInput(f"{where}: no name: pass name= or set 'name' in the spec")
    return _build(cluster, final_name, where, "a cluster spec", created_at)


def profile_from_cluster_file(path: Path, name: str | None = None) -> ClusterProfile:
    """`hetrl profile --catalog cluster.yaml`: read, validate, build. Name: `name`, else the file's, else its stem."""
    where = str(path)
    spec = parse_cluster_spec(_load_yaml(read_text(path), where), where)
    final_name = name or spec.name or Path(path).stem
    return _build(spec, final_name, where, Path(path).name, None)


# ---------------------------------------------------------------------------------------------------------
# Synthetic clusters for scale benchmarks

# The paper's evaluation mix, 24 A100 : 24 L40S : 16 L4 (PAPER.md section 6), as a repeating node pattern.
SYNTHETIC_NODE_PATTERN = ("A100 80GB", "L40S", "L4", "A100 80GB", "L40S", "L4", "A100 80GB", "L40S")
# The paper built its scenarios from measurements across ten AWS regions; we draw regions from ten such names.
SYNTHETIC_REGIONS = (
    "us-east-1",
    "us-east-2",
    "us-west-2",
    "ca-central-1",
    "eu-west-1",
    "eu-central-1",
    "eu-north-1",
    "ap-northeast-1",
    "ap-southeast-1",
    "sa-east-1",
)
# Node sizes, largest first: 8-GPU servers, smaller ones where that leaves fewer than three nodes, so that
# even an 8-device cluster holds all three GPU types of the mix (8 devices = 4 nodes x 2 GPUs).
SYNTHETIC_NODE_SIZES = (8, 4, 2, 1)
SYNTHETIC_MIN_NODES = 3
# Inter-region figures are drawn from the paper's widest scenario, Multi-Continent: 5–60 ms, 0.9–5 Gbps.
SYNTHETIC_WAN_LATENCY_MS = (5.0, 60.0)
SYNTHETIC_WAN_GBPS = (0.9, 5.0)
# Inside a region, the same 100 Gbps-class figures as the shipped paper profiles (docs/catalog.md).
SYNTHETIC_LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}


def synthetic_cluster(n_devices: int, seed: int) -> ClusterProfile:
    """A mixed A100/L40S/L4 cluster of `n_devices` GPUs over several regions; same seed, same profile.

    Node types follow the paper's 3:3:2 mix; the seed picks the regions, which node sits where, and each
    region pair's WAN figures. About √nodes regions (at least 2, at most the ten region names).

    >>> [len(synthetic_cluster(n, 0).devices) for n in (8, 64)]
    [8, 64]
    """
    if n_devices <= 0:
        raise BadInput(f"synthetic cluster: n_devices must be positive, got {n_devices}")
    fitting = [s for s in SYNTHETIC_NODE_SIZES if n_devices % s == 0 and n_devices // s >= SYNTHETIC_MIN_NODES]
    per_node = fitting[0] if fitting else 1
    rng = random.Random(seed)
    n_nodes = n_devices // per_node
    n_regions = min(n_nodes, len(SYNTHETIC_REGIONS), max(2, round(math.sqrt(n_nodes))))
    regions = rng.sample(SYNTHETIC_REGIONS, n_regions)
    slots = [regions[i % n_regions] for i in range(n_nodes)]  # every region gets at least one node
    rng.shuffle(slots)
    groups = [
        {"gpu": SYNTHETIC_NODE_PATTERN[i % len(SYNTHETIC_NODE_PATTERN)], "gpus_per_node": per_node, "region": slot}
        for i, slot in enumerate(slots)
    ]
    groups.sort(key=lambda g: (SYNTHETIC_NODE_PATTERN.index(g["gpu"]), SYNTHETIC_REGIONS.index(g["region"])))
    pairs = [
        {
            "regions": [a, b],
            "latency": f"{rng.uniform(*SYNTHETIC_WAN_LATENCY_MS):.1f}ms",
            "bandwidth": f"{rng.uniform(*SYNTHETIC_WAN_GBPS):.2f}Gbps",
        }
        for a, b in combinations(sorted(regions), 2)
    ]
    spec = {
        "name": f"synthetic-{n_devices}-seed{seed}",
        "notes": [f"synthetic_cluster({n_devices}, seed={seed}): {n_nodes} nodes in {n_regions} regions"],
        "node_groups": groups,
        "network": {"intra_region": SYNTHETIC_LAN, "inter_region": {"pairs": pairs}},
    }
    return profile_from_cluster(spec)
