"""What `show` says about a plan, as plain data: every format (table, markdown, json) renders this digest.

Deriving once keeps the three formats in agreement and keeps the rich code free of arithmetic. Everything
here is linear in the number of devices (dicts, no list scans per device), so a 1024-device plan digests fast.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePath

from hetrl_cli.artifacts.plan import Plan, TaskPlan
from hetrl_cli.artifacts.profile import ClusterProfile, Device
from hetrl_cli.artifacts.rl import ALL_TASKS
from hetrl_cli.artifacts.workload import ModelSpec, Workload

IDLE = "·"
"""Marks a device no task of the plan runs on."""
MISSING = "?"
"""Marks a device the plan uses but the given profile does not have (stale plan)."""
MANY_DEVICES = 16
"""Above this many devices, memory is summarised per host rather than listed per device."""
MANY_HOSTS = 24
"""Above this many hosts, consecutive hosts that look the same share one device-map row."""
MEMORY_ROWS = 12
"""Rows of the memory section before the rest is summarised in one line."""
BREAKDOWN_TERMS = ("compute", "memory", "comm", "bubble", "other")
_VENDOR_WORDS = ("NVIDIA", "GeForce", "Tesla", "Quadro", "AMD", "Instinct")


@dataclass(frozen=True)
class DeviceFacts:
    """What we know about one device: always its host and index; type, region, capacity only from a profile."""

    id: str
    host: str
    index: int
    type: str = ""
    """Short model name (`A100`, `L4`, `CPU`); empty without a profile."""
    region: str = ""
    capacity_bytes: int | None = None


@dataclass(frozen=True)
class HostRow:
    """One row of the device map: a host (or a run of look-alike hosts) and a mark per device."""

    hosts: list[str]
    region: str
    types: str
    """Device types on the host, e.g. `8×A100`; empty without a profile."""
    marks: list[str]
    """Group letter per device (by index), IDLE or MISSING."""

    @property
    def label(self) -> str:
        return self.hosts[0] if len(self.hosts) == 1 else f"{hostlist(self.hosts)} ({len(self.hosts)} hosts)"


@dataclass(frozen=True)
class MemoryRow:
    """Peak memory of one device, or of the fullest device of a host when summarised."""

    name: str
    """Device id, or host name when summarised."""
    devices: int
    peak_bytes: int
    capacity_bytes: int | None

    @property
    def fraction(self) -> float | None:
        return self.peak_bytes / self.capacity_bytes if self.capacity_bytes else None


@dataclass(frozen=True)
class MemoryView:
    per_host: bool
    rows: list[MemoryRow]
    """Fullest first, at most MEMORY_ROWS."""
    hidden: int = 0
    """How many rows were left out."""
    emptiest: MemoryRow | None = None
    """The emptiest row overall, named when rows were left out."""


@dataclass(frozen=True)
class Staleness:
    """Why a plan does not match the profile it is shown with."""

    plan_fingerprint: str
    profile_fingerprint: str
    missing_devices: list[str]
    """Devices the plan uses that the profile does not have."""
    unused_devices: list[str]
    """Profile devices the plan does not use (new, or idle when planned: plans only list what they use)."""

    def sentence(self) -> str:
        """One line naming what differs, with the fix."""
        parts = []
        if self.missing_devices:
            parts.append(
                f"{len(self.missing_devices)} device(s) the plan uses are gone: {id_list(self.missing_devices)}"
            )
        if self.unused_devices:
            parts.append(
                f"{len(self.unused_devices)} profile device(s) unused by the plan: {id_list(self.unused_devices)}"
            )
        if not parts:
            parts.append("same device ids, but hosts, regions, device memory or links differ")
        return (
            f"plan made for profile {self.plan_fingerprint}, this profile is {self.profile_fingerprint}; "
            + "; ".join(parts)
            + "; re-plan with: hetrl plan PROFILE"
        )


@dataclass
class PlanDigest:
    """Everything `show` prints about one plan."""

    plan: Plan
    letters: dict[str, str]
    """Group name -> letter (A, B, ...), the key of the device map and the timeline."""
    facts: dict[str, DeviceFacts]
    device_group: dict[str, str]
    used: set[str]
    hosts: list[HostRow]
    memory: MemoryView
    bottleneck: str
    stale: Staleness | None
    has_profile: bool
    group_devices: dict[str, str] = field(default_factory=dict)
    """Group name -> `8×A100 (a100-0), 4×L4 (l4-1)`."""


def digest_plan(plan: Plan, profile: ClusterProfile | None = None, match: PlanDigest | None = None) -> PlanDigest:
    """Derive every section's data from a plan (and the profile, when given, for types, regions, capacity).
    `match`: the other plan of a comparison, whose letters this one's groups of the same tasks take."""
    letters = group_letters(plan, match.plan if match else None)
    facts = device_facts(plan, profile)
    device_group = {d: g.name for g in reversed(plan.groups) for d in g.devices}
    used = {d for t in plan.tasks for d in t.devices}
    return PlanDigest(
        plan=plan,
        letters=letters,
        facts=facts,
        device_group=device_group,
        used=used,
        hosts=host_rows(profile, facts, letters, device_group, used),
        memory=memory_view(plan, facts),
        bottleneck=bottleneck_sentence(plan),
        stale=staleness(plan, profile),
        has_profile=profile is not None,
        group_devices={g.name: device_summary(g.devices, facts) for g in plan.groups},
    )


# 1) Names and small formatting helpers shared by every format.


def _letter(i: int) -> str:
    return string.ascii_uppercase[i % 26] + (str(i // 26) if i >= 26 else "")


def group_letters(plan: Plan, match: Plan | None = None) -> dict[str, str]:
    """A, B, C ... in plan order (then A1, B1 ... past 26 groups), so a letter fits in one map cell. Against
    `match` (a comparison), a group running exactly the tasks of one of its groups gets that group's letter
    (the same group reads the same on both sides, whatever the order); the others take, in plan order, the
    letters those matches leave free."""
    if match is None:
        return {g.name: _letter(i) for i, g in enumerate(plan.groups)}
    theirs = {frozenset(g.tasks): letter for g, letter in zip(match.groups, group_letters(match).values(), strict=True)}
    same = {g.name: theirs.pop(frozenset(g.tasks)) for g in plan.groups if frozenset(g.tasks) in theirs}
    spare = (_letter(i) for i in range(2 * len(plan.groups)) if _letter(i) not in same.values())
    return {g.name: same[g.name] if g.name in same else next(spare) for g in plan.groups}


def split_device_id(device_id: str) -> tuple[str, int]:
    """`host/index` -> (host, index); an id without a numeric index gets -1 (sorted first)."""
    host, _, index = device_id.rpartition("/")
    if not host:
        return device_id, -1
    return host, int(index) if index.isdigit() else -1


def natural_key(text: str) -> list[int | str]:
    """Sort `a100-2` before `a100-10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def short_type(device: Device) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100', 'NVIDIA GeForce RTX 4090' -> 'RTX 4090', any CPU -> 'CPU'."""
    if device.kind == "cpu":
        return "CPU"
    words = [w for w in device.name.split() if w not in _VENDOR_WORDS]
    if not words:
        return device.name
    if words[0] in ("RTX", "GTX") and len(words) > 1:
        return f"{words[0]} {words[1].split('-')[0]}"
    return words[0].split("-")[0]


def id_list(ids: list[str], limit: int = 6) -> str:
    """A few ids, then how many more: keeps one-line messages one line on big clusters."""
    shown = ", ".join(ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def model_label(spec: ModelSpec) -> str:
    """A built-in model by its name (`qwen3-8b`); a model read from a directory or config.json by that
    directory's name (`hf:Qwen3-8B`), which says more than `hf`."""
    if spec.arch != "hf":
        return spec.arch
    where = spec.path or (str(PurePath(spec.config_path).parent) if spec.config_path else None)
    return f"hf:{PurePath(where).name}" if where else "hf"


def workload_line(workload: Workload) -> str:
    """`PPO sync · actor qwen3-8b, critic qwen3-1.7b · 128×8 = 1024 samples · ≤1024+1024 tokens · bf16`."""
    models = [f"actor {model_label(workload.actor)}"]
    if workload.critic is not None:
        models.append(f"critic {model_label(workload.critic)}")
    if workload.reference is not None and model_label(workload.reference) != model_label(workload.actor):
        models.append(f"reference {model_label(workload.reference)}")
    reward = model_label(workload.reward) if workload.reward else f"rule:{workload.reward_rule}"
    models.append(f"reward {reward}")
    batch = f"{workload.prompts_per_step}×{workload.responses_per_prompt} = {workload.samples_per_step} samples"
    tokens = f"≤{workload.max_prompt_tokens}+{workload.max_response_tokens} tokens"
    return " · ".join(
        [f"{workload.algorithm.upper()} {workload.mode}", ", ".join(models), batch, tokens, workload.precision]
    )


def compact_shares(task: TaskPlan, limit: int = 8) -> str:
    """`0.31/0.31/0.19/0.19`; even shares: `8×0.125`; many uneven replicas: the range, `0.012–0.019 (64)`."""
    shares = [r.batch_share for r in task.replicas]
    if len(shares) > 1 and max(shares) - min(shares) < 1e-9:
        return f"{len(shares)}×{shares[0]:.3g}"
    if len(shares) <= limit:
        return "/".join(f"{s:.3g}" for s in shares)
    return f"{min(shares):.2g}–{max(shares):.2g} ({len(shares)})"


def compact_layers(task: TaskPlan) -> str:
    """`20/16` when every replica splits alike, else the distinct splits joined by ` | `."""
    splits = list(dict.fromkeys("/".join(str(n) for n in r.layer_split) for r in task.replicas))
    return " | ".join(splits[:3]) + (f" (+{len(splits) - 3})" if len(splits) > 3 else "")


def device_summary(devices: list[str], facts: dict[str, DeviceFacts]) -> str:
    """`8×A100 (a100-0), 4×L4 (l4-1)`; over 3 hosts, per type: `24×L40S (l40s-[0-2]), 16×L4 (l4-[0-1])`."""
    counts: Counter[tuple[str, str]] = Counter((facts[d].host, facts[d].type) for d in devices)
    if len({host for host, _ in counts}) <= 3:
        return ", ".join(f"{n}×{kind} ({host})" if kind else f"{n} on {host}" for (host, kind), n in counts.items())
    by_type: dict[str, list[str]] = {}
    for host, kind in counts:
        by_type.setdefault(kind, []).append(host)
    return ", ".join(
        f"{sum(counts[h, kind] for h in hosts)}{'×' + kind if kind else ' devices'} ({hostlist(hosts)})"
        for kind, hosts in by_type.items()
    )


def hostlist(names: list[str]) -> str:
    """Slurm-style compact host names: `a100-0, a100-1, a100-2, a100-5` -> `a100-[0-2,5]`."""
    numbered: dict[str, list[int]] = {}
    plain = []
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        if match:
            numbered.setdefault(match.group(1), []).append(int(match.group(2)))
        else:
            plain.append(name)
    parts = [_ranges(prefix, sorted(set(nums))) for prefix, nums in numbered.items()]
    return ", ".join(parts + plain)


def _ranges(prefix: str, nums: list[int]) -> str:
    if len(nums) == 1:
        return f"{prefix}{nums[0]}"
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    body = ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"{prefix}[{body}]"


# 2) Devices and hosts.


def device_facts(plan: Plan, profile: ClusterProfile | None) -> dict[str, DeviceFacts]:
    """Facts for every device the plan or the profile names; plan-only devices know just host and index."""
    facts: dict[str, DeviceFacts] = {}
    if profile is not None:
        regions = {h.name: h.region for h in profile.hosts}
        for d in profile.devices:
            facts[d.id] = DeviceFacts(d.id, d.host, d.index, short_type(d), regions.get(d.host, ""), d.memory_bytes)
    listed = plan.cluster_devices if profile is None else []  # the profile, when given, is the inventory
    for device_id in [*listed, *(d for group in plan.groups for d in group.devices)]:
        if device_id not in facts:
            host, index = split_device_id(device_id)
            facts[device_id] = DeviceFacts(device_id, host, index)
    return facts


def host_rows(
    profile: ClusterProfile | None,
    facts: dict[str, DeviceFacts],
    letters: dict[str, str],
    device_group: dict[str, str],
    used: set[str],
) -> list[HostRow]:
    """One row per host (profile order, then the plan's other hosts), look-alike runs merged on big clusters."""
    by_host: dict[str, list[DeviceFacts]] = {}
    order = [h.name for h in profile.hosts] if profile else []
    for f in sorted(facts.values(), key=lambda f: (natural_key(f.host), f.index)):
        by_host.setdefault(f.host, []).append(f)
    listed = set(order)
    order += sorted((h for h in by_host if h not in listed), key=natural_key)
    known = {d.id for d in profile.devices} if profile else set(facts)
    rows = []
    for host in order:
        devices = by_host.get(host, [])
        marks = [_mark(f.id, letters, device_group, used, known) for f in devices]
        types = Counter(f.type for f in devices if f.type)
        rows.append(HostRow([host], devices[0].region if devices else "", _types_text(types), marks))
    return merge_lookalike_hosts(rows) if len(rows) > MANY_HOSTS else rows


def _mark(
    device_id: str, letters: dict[str, str], device_group: dict[str, str], used: set[str], known: set[str]
) -> str:
    if device_id not in known:
        return MISSING
    if device_id not in used:
        return IDLE
    return letters[device_group[device_id]]


def _types_text(types: Counter[str]) -> str:
    return ", ".join(f"{n}×{kind}" for kind, n in types.items())


def merge_lookalike_hosts(rows: list[HostRow]) -> list[HostRow]:
    """Consecutive hosts with the same region, types and marks become one row (1024 GPUs fit a screen)."""
    merged: list[HostRow] = []
    for row in rows:
        last = merged[-1] if merged else None
        if last and (last.region, last.types, last.marks) == (row.region, row.types, row.marks):
            merged[-1] = HostRow([*last.hosts, *row.hosts], last.region, last.types, last.marks)
        else:
            merged.append(row)
    return merged


# 3) Memory, staleness, bottleneck.


def memory_view(plan: Plan, facts: dict[str, DeviceFacts]) -> MemoryView:
    """Fullest first (by fraction of capacity when known, else by bytes); per host when devices are many."""
    peak = plan.peak_memory()
    rows = [MemoryRow(d, 1, b, facts[d].capacity_bytes if d in facts else None) for d, b in peak.items()]
    per_host = len(rows) > MANY_DEVICES
    if per_host:
        rows = _per_host(rows, facts)
    rows.sort(key=lambda r: (-(r.fraction if r.fraction is not None else 0.0), -r.peak_bytes, natural_key(r.name)))
    if len(rows) <= MEMORY_ROWS:
        return MemoryView(per_host, rows)
    return MemoryView(per_host, rows[:MEMORY_ROWS], hidden=len(rows) - MEMORY_ROWS, emptiest=rows[-1])


def _per_host(rows: list[MemoryRow], facts: dict[str, DeviceFacts]) -> list[MemoryRow]:
    """Each host's fullest device stands for the host: the one that would run out first."""
    fullest: dict[str, MemoryRow] = {}
    count: Counter[str] = Counter()
    for row in rows:
        host = facts[row.name].host if row.name in facts else split_device_id(row.name)[0]
        count[host] += 1
        best = fullest.get(host)
        key = (row.fraction or 0.0, row.peak_bytes)
        if best is None or key > (best.fraction or 0.0, best.peak_bytes):
            fullest[host] = row
    return [MemoryRow(h, count[h], r.peak_bytes, r.capacity_bytes) for h, r in fullest.items()]


def staleness(plan: Plan, profile: ClusterProfile | None) -> Staleness | None:
    """None when no profile is given or the fingerprints match; else what differs in the device sets."""
    if profile is None:
        return None
    current = profile.fingerprint or profile.compute_fingerprint()
    if plan.profile_fingerprint == current:
        return None
    in_profile = {d.id for d in profile.devices}
    in_plan = {d for g in plan.groups for d in g.devices}
    missing = sorted(in_plan - in_profile, key=natural_key)
    unused = sorted(in_profile - in_plan, key=natural_key)
    return Staleness(plan.profile_fingerprint, current, missing, unused)


def bottleneck_sentence(plan: Plan) -> str:
    """The plan's own sentence, else: the longest timeline entry (or task), its share and dominant term."""
    if plan.cost.bottleneck:
        return plan.cost.bottleneck
    iteration = plan.cost.iteration_s
    entries = [(e.end_s - e.start_s, e.name, e.group) for e in plan.cost.timeline]
    entries += [(t.predicted.total_s, t.task, t.group) for t in plan.tasks if not plan.cost.timeline]
    if not entries:
        return f"no timeline or task times in this plan; the iteration takes {seconds(iteration)}"
    duration, name, group = max(entries)
    letter = group_letters(plan).get(group)
    where = f"group {letter}, {group}" if letter else group
    sentence = f"{name} ({where}) takes {seconds(duration)} of the {seconds(iteration)} iteration"
    sentence += f" ({duration / iteration:.0%})"
    task = next((t for t in plan.tasks if t.task == name), None)
    if task is not None and task.predicted.total_s > 0:
        term, value = max(((k, getattr(task.predicted, f"{k}_s")) for k in BREAKDOWN_TERMS), key=lambda kv: kv[1])
        sentence += f", mostly {term} ({seconds(value)})"
    return sentence


def task_order(names: list[str]) -> list[str]:
    """Tasks in dataflow order (generation first), unknown names last."""
    rank = {t: i for i, t in enumerate(ALL_TASKS)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


# 4) Number formatting (one place, so every format prints the same figures).


def seconds(value: float) -> str:
    """3 significant figures with a unit that keeps them readable: `15.8 s`, `312 ms`, `436 µs`, `0 s`."""
    if value == 0:
        return "0 s"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if abs(value) < 1000 else f"{value:,.0f} s"


def gib(value: int | float) -> str:
    return f"{value / 2**30:.1f} GiB"


def si(value: float) -> str:
    """`43.7k`, `1.2M`, `85.3`: throughputs span many orders of magnitude."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"
