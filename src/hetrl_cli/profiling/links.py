"""Link facts given by hand: bandwidth/latency unit parsing and the `--links links.yaml` override file.

Bandwidths are bytes per second internally. Bit rates (`bps`) divide by 8; `B/s` is bytes. SI prefixes
(k, M, G, T = 1e3 .. 1e12), as network and datasheet figures use them.

>>> parse_bandwidth("5Gbps", "x")
625000000.0
>>> parse_bandwidth("600GB/s", "x")
600000000000.0
>>> parse_latency("10ms", "x")
0.01
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hetrl_cli.artifacts.profile import MAX_BPS, MAX_LATENCY_S, MIN_BPS, Link
from hetrl_cli.errors import BadInput, one_line

if TYPE_CHECKING:
    from hetrl_cli.artifacts.hosts import HostEntry

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6, "g": 1e9, "G": 1e9, "t": 1e12, "T": 1e12}
_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_BANDWIDTH = re.compile(rf"^{_NUMBER}\s*(?:(?P<prefix>[kKmMgGtT]?)(?P<unit>bps|bit/s|b/s|Bps|B/s|B))?$")
_LATENCY = re.compile(rf"^{_NUMBER}\s*(?P<unit>ns|us|µs|ms|s)?$")
_LATENCY_DIVISOR = {None: 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}
BANDWIDTH_EXAMPLES = '"5Gbps", "100Mbps", "25 GB/s" or a number of bytes/s'
LATENCY_EXAMPLES = '"10ms", "50us", "0.01s" or a number of seconds'


def _plain_number(value: float, where: str, what: str, examples: str) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise BadInput(f"{where}: bad {what} {one_line(repr(value), 60)}: expected {examples}")
    return float(value)


def parse_bandwidth(text: str | float, where: str) -> float:
    """Bandwidth text or number → bytes/s; `where` names the source (file:line, field) in the error."""
    if isinstance(text, (int, float)):
        value = _plain_number(text, where, "bandwidth", BANDWIDTH_EXAMPLES)
    else:
        match = _BANDWIDTH.match(str(text).strip())
        if not match:
            raise BadInput(f"{where}: bad bandwidth {one_line(repr(text), 60)}: expected {BANDWIDTH_EXAMPLES}")
        unit = match["unit"]
        scale = _PREFIX[match["prefix"] or ""]
        if unit in ("bps", "bit/s", "b/s"):
            scale /= 8.0
        elif unit is None and match["prefix"]:
            raise BadInput(f"{where}: bad bandwidth {one_line(repr(text), 60)}: expected {BANDWIDTH_EXAMPLES}")
        value = float(match["num"]) * scale
    if value <= 0:
        raise BadInput(f"{where}: bandwidth must be positive, got {one_line(repr(text), 60)}")
    return value


def parse_latency(text: str | float, where: str) -> float:
    """Latency text or number → seconds; `where` names the source in the error."""
    if isinstance(text, (int, float)):
        return _plain_number(text, where, "latency", LATENCY_EXAMPLES)
    match = _LATENCY.match(str(text).strip())
    if not match:
        raise BadInput(f"{where}: bad latency {one_line(repr(text), 60)}: expected {LATENCY_EXAMPLES}")
    return float(match["num"]) / _LATENCY_DIVISOR[match["unit"]]


# ---- the links file ---------------------------------------------------------------------------------------

REGION_PREFIX = "region:"
_ENTRY_KEYS = {"a", "b", "bandwidth", "latency", "kind"}
_KINDS = ("nvlink", "pcie", "loopback", "lan", "wan")


@dataclass(frozen=True)
class LinkOverride:
    """One entry of a links file: ends are host names or `region:NAME` (every host of that region)."""

    a: str
    b: str
    bandwidth_Bps: float | None
    latency_s: float | None
    kind: str | None
    where: str
    """`file:line` of the entry, for messages."""

    def specificity(self, a: HostEntry, b: HostEntry) -> int | None:
        """How many ends name a host (2 beats 1 beats 0), or None when the entry does not cover a↔b."""
        for x, y in ((a, b), (b, a)):
            if _end_matches(self.a, x) and _end_matches(self.b, y):
                return sum(not end.startswith(REGION_PREFIX) for end in (self.a, self.b))
        return None


def _end_matches(end: str, entry: HostEntry) -> bool:
    if end.startswith(REGION_PREFIX):
        return entry.region == end[len(REGION_PREFIX) :]
    return entry.name == end


def merged_override(overrides: list[LinkOverride], a: HostEntry, b: HostEntry) -> dict[str, Any]:
    """Fields given for a↔b: region entries first, then host entries; later entries win on ties."""
    matching = [(o.specificity(a, b), pos, o) for pos, o in enumerate(overrides)]
    merged: dict[str, Any] = {}
    for _, _, o in sorted((m for m in matching if m[0] is not None), key=lambda m: (m[0], m[1])):
        given = {"bandwidth_Bps": o.bandwidth_Bps, "latency_s": o.latency_s, "kind": o.kind}
        merged.update({k: v for k, v in given.items() if v is not None})
    return merged


def fully_given(overrides: list[LinkOverride], a: HostEntry, b: HostEntry) -> bool:
    """Whether the file gives both bandwidth and latency for a↔b (then the pair is not measured)."""
    merged = merged_override(overrides, a, b)
    return "bandwidth_Bps" in merged and "latency_s" in merged


class _LineLoader(yaml.SafeLoader):
    """Safe YAML loader that records each mapping's line, so errors can name file:line."""


def _mapping_with_line(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


def load_link_overrides(path: Path | str, entries: list[HostEntry]) -> list[LinkOverride]:
    """Parse a links file: `links:` followed by a list of {a, b, bandwidth?, latency?, kind?} entries."""
    from hetrl_cli.artifacts.io import read_text
    from hetrl_cli.artifacts.yamltext import load_yaml_text

    name = str(path)
    try:  # bounded: no alias bomb, no nesting past the stack, no inf/NaN or 10,000-digit numbers
        data = load_yaml_text(read_text(path), name, loader=_LineLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"{name}{f':{mark.line + 1}' if mark else ''}: not valid YAML") from None
    items = data.get("links") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise BadInput(f"{name}: expected 'links:' followed by a list of entries with a, b, bandwidth, latency")
    hosts = {e.name for e in entries}
    regions = {e.region for e in entries}
    return [_parse_entry(item, name, hosts, regions) for item in items]


def _parse_entry(item: Any, name: str, hosts: set[str], regions: set[str]) -> LinkOverride:
    if not isinstance(item, dict):
        shown = one_line(repr(item), 80)
        raise BadInput(f"{name}: each link entry must be a mapping with a, b, bandwidth, latency; got {shown}")
    where = f"{name}:{item.get('__line__', '?')}"
    item = {k: v for k, v in item.items() if k != "__line__"}  # a copy: an alias shares the mapping
    unknown = [k for k in item if k not in _ENTRY_KEYS]
    if unknown:
        shown = one_line(repr(unknown[0]), 60)
        raise BadInput(f"{where}: unknown key {shown}; known keys: a, b, bandwidth, latency, kind")
    for end in ("a", "b"):
        if end not in item:
            raise BadInput(f"{where}: missing '{end}' (a host name from hosts.txt or region:NAME)")
        if not isinstance(item[end], str):
            raise BadInput(f"{where}: '{end}' must be a host name from hosts.txt or region:NAME, not a list or number")
        _check_end(item[end], where, hosts, regions)
    if item["a"] == item["b"] and not item["a"].startswith(REGION_PREFIX):
        raise BadInput(f"{where}: a and b are the same host {one_line(repr(item['a']), 80)}")
    if "bandwidth" not in item and "latency" not in item:
        raise BadInput(f"{where}: give bandwidth, latency or both")
    kind = item.get("kind")
    if kind is not None and (not isinstance(kind, str) or kind not in _KINDS):
        raise BadInput(f"{where}: kind {one_line(repr(kind), 60)} is not one of {', '.join(_KINDS)}")
    return LinkOverride(
        a=item["a"],
        b=item["b"],
        bandwidth_Bps=_bandwidth_in_range(item["bandwidth"], f"{where}: bandwidth") if "bandwidth" in item else None,
        latency_s=_latency_in_range(item["latency"], f"{where}: latency") if "latency" in item else None,
        kind=kind,
        where=where,
    )


def _bandwidth_in_range(text: Any, where: str) -> float:
    return _in_range(parse_bandwidth(text, where), MIN_BPS, MAX_BPS, where)


def _latency_in_range(text: Any, where: str) -> float:
    return _in_range(parse_latency(text, where), 0.0, MAX_LATENCY_S, where)


def _in_range(value: float, low: float, high: float, where: str) -> float:
    """A link figure within what a profile may hold (artifacts/profile.Link), so the profile written loads again."""
    if not low <= value <= high:
        raise BadInput(f"{where}: {value:g} is outside what a link can be ({low:g} to {high:g}); check the unit")
    return value


def _check_end(end: str, where: str, hosts: set[str], regions: set[str]) -> None:
    if end.startswith(REGION_PREFIX):
        if end[len(REGION_PREFIX) :] not in regions:
            shown, known = one_line(repr(end), 80), one_line(", ".join(sorted(r or "" for r in regions)), 400)
            raise BadInput(f"{where}: unknown region {shown}; regions in hosts.txt: {known}")
    elif end not in hosts:
        shown = one_line(repr(end), 80)
        raise BadInput(f"{where}: unknown host {shown}; hosts.txt names: {one_line(', '.join(sorted(hosts)), 400)}")


def apply_overrides(
    links: list[Link], overrides: list[LinkOverride], entries: list[HostEntry], kind_of: Callable
) -> tuple[list[Link], list[str]]:
    """Overwrite (or add) links with the file's facts, marked `source="override"`; notes say what happened."""
    if not overrides:
        return links, []
    by_pair = {frozenset((lk.a, lk.b)): lk for lk in links}
    notes: list[str] = []
    changed = 0
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            given = merged_override(overrides, a, b)
            if not given:
                continue
            key = frozenset((a.name, b.name))
            old = by_pair.get(key)
            if old is not None:
                by_pair[key] = old.model_copy(update={**given, "source": "override"})
            elif "bandwidth_Bps" in given and "latency_s" in given:
                by_pair[key] = Link(a=a.name, b=b.name, **{"kind": kind_of(a, b), **given}, source="override")
            else:
                notes.append(f"links file: {a.name} <-> {b.name} has no measurement and the file gives only part")
                continue
            changed += 1
    notes.insert(0, f"links file: {changed} link(s) set from overrides")
    return list(by_pair.values()), notes
