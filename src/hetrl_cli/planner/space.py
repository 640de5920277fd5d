"""The planner's search space (PAPER.md §3, levels L1–L5) and the interchangeability it rests on.

Glossary:
- *sub-host*: the devices of one spec (name, memory, FLOP/s, HBM) on one host. A sub-host's devices are
  interchangeable: a host has one intra-host link, so which index runs a tasklet cannot change a cost.
- *device class*: sub-hosts that are interchangeable as a whole: same spec and count, same region and
  intra-host link, and swapping their hosts preserves every link to every other host (a link
  automorphism). Swapping two sub-hosts of a class therefore never changes a cost-model number.
- *pool*: what a group takes from each class, `(whole, part)` per class: `whole` entire sub-hosts plus
  `part` devices of one more sub-host (`part` from the halving chain D/2, D/4, ..., so two parts always fit
  one sub-host). Pools are what the ILP enumerates (L2 + L3).
- *layout*: TP degree, PP depth and stage order of one task on its group's devices (L4 + L5): TP groups
  never straddle a sub-host; replicas are consecutive ("blocked") or interleaved ("strided") TP groups.

Level L1 (task grouping) is `groupings()`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from hetrl_cli.artifacts.profile import ClusterProfile, Device
from hetrl_cli.artifacts.rl import TaskName
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.devices import compute_tflops
from hetrl_cli.costmodel.types import TaskPlacement

Granularity = Literal["host", "half", "fine"]
GRANULARITIES: tuple[Granularity, ...] = ("host", "half", "fine")
Pool = tuple[tuple[int, int], ...]
"""`pool[k] = (whole, part)` for device class k."""


# --- L1: task groupings ---------------------------------------------------------------------------


def device_tasks(workload: Workload) -> tuple[TaskName, ...]:
    """Tasks that need devices: a rule-based reward (no reward model) runs on the CPU beside the trainer."""
    return tuple(t for t in workload.tasks if not (t == "reward" and workload.reward is None))


def _partitions(items: list[TaskName]) -> Iterator[list[list[TaskName]]]:
    """Every set partition of `items`: `items[0]` alone or added to each group of a partition of the rest. A module
    function, not a closure in `groupings` (a recursive closure refers to itself through its cell: a reference
    cycle the cyclic collector had to free after every call)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1 :]]


def groupings(tasks: Sequence[TaskName]) -> list[tuple[tuple[TaskName, ...], ...]]:
    """Every set partition of `tasks` (Bell(n) of them), groups in task order, deterministic order.

    >>> len(groupings(("generation", "reference", "actor_train")))
    5
    """
    order = {t: i for i, t in enumerate(tasks)}
    result = []
    for part in _partitions(list(tasks)):
        groups = sorted((tuple(sorted(g, key=order.__getitem__)) for g in part), key=lambda g: order[g[0]])
        result.append(tuple(groups))
    return sorted(result, key=lambda gs: (len(gs), [[order[t] for t in g] for g in gs]))


# --- device classes -------------------------------------------------------------------------------


def _spec(device: Device) -> tuple:
    return (
        device.kind,
        device.name,
        device.memory_bytes,
        tuple(sorted(device.peak_tflops.items())),
        tuple(sorted(device.measured_tflops.items())),
        device.memory_gbps,
        device.cores,
        device.decode_steps_per_s,
        device.forward_tokens_per_s,
        device.price_per_gpu_hour,  # devices priced differently are not interchangeable under a cost objective
    )


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable sub-hosts (see the module glossary)."""

    index: int
    name: str
    memory_bytes: int
    per_host: int
    hosts: tuple[str, ...]
    devices: tuple[tuple[str, ...], ...]
    """Device ids of each sub-host, by index."""
    region: str
    speed_tflops: float

    @property
    def n_hosts(self) -> int:
        return len(self.hosts)

    @property
    def size(self) -> int:
        return self.per_host * len(self.hosts)

    def parts(self, granularity: Granularity) -> tuple[int, ...]:
        """Partial sub-host sizes a pool may take: the halving chain of per_host, cut by granularity."""
        chain: list[int] = []
        size = self.per_host
        while size % 2 == 0 and size > 1:
            size //= 2
            chain.append(size)
        if granularity == "host":
            return ()
        return tuple(chain[:1]) if granularity == "half" else tuple(chain)


def device_classes(profile: ClusterProfile, dtype: str = "bf16") -> list[DeviceClass]:
    """Group sub-hosts into classes of interchangeable ones, fastest class first (deterministic)."""
    hosts = {h.name: h for h in profile.hosts if h.status == "ok"}
    links = profile.link_map()
    subhosts: dict[tuple[str, tuple], list[Device]] = {}
    for device in sorted(profile.devices, key=lambda d: (d.host, d.index)):
        if device.host in hosts:
            subhosts.setdefault((device.host, _spec(device)), []).append(device)
    composition = {h: tuple(sorted((spec, len(ds)) for (hh, spec), ds in subhosts.items() if hh == h)) for h in hosts}

    def local(key: tuple[str, tuple]) -> tuple:
        host = hosts[key[0]]
        intra = host.intra_link
        return (
            key[1],
            len(subhosts[key]),
            host.region,
            composition[key[0]],
            intra and (intra.kind, intra.bandwidth_Bps),
        )

    def link(a: str, b: str) -> tuple | None:
        lk = links.get(frozenset((a, b)))
        return None if lk is None else (lk.bandwidth_Bps, lk.latency_s, lk.kind)

    def swappable(a: str, b: str) -> bool:
        if a == b:
            return True
        return all(link(a, x) == link(b, x) for x in hosts if x not in (a, b))

    classes: list[list[tuple[str, tuple]]] = []
    for key in subhosts:
        for members in classes:
            if local(members[0]) == local(key) and swappable(members[0][0], key[0]):
                members.append(key)
                break
        else:
            classes.append([key])
    tflops = compute_tflops(profile.devices, dtype)
    result = []
    for members in classes:
        first = subhosts[members[0]][0]
        speed = tflops[first.id]
        result.append(
            (
                -speed,
                hosts[members[0][0]].region,
                members[0][0],
                DeviceClass(
                    index=0,
                    name=first.name,
                    memory_bytes=first.memory_bytes,
                    per_host=len(subhosts[members[0]]),
                    hosts=tuple(m[0] for m in members),
                    devices=tuple(tuple(d.id for d in subhosts[m]) for m in members),
                    region=hosts[members[0][0]].region,
                    speed_tflops=speed,
                ),
            )
        )
    result.sort(key=lambda item: item[:3])
    return [
        DeviceClass(**{**c.__dict__, "index": i})  # type: ignore[arg-type]
        for i, (_, _, _, c) in enumerate(result)
    ]


# --- L2 + L3: pools --------------------------------------------------------------------------------


def enumerate_pools(classes: Sequence[DeviceClass], granularity: Granularity) -> list[Pool]:
    """Every non-empty pool of the granularity, in a deterministic order."""
    options = []
    for c in classes:
        opts = []
        for whole in range(c.n_hosts + 1):
            opts.append((whole, 0))
            if whole < c.n_hosts:
                opts.extend((whole, part) for part in c.parts(granularity))
        options.append(opts)
    return [pool for pool in itertools.product(*options) if any(w or p for w, p in pool)]


def count_pools(classes: Sequence[DeviceClass], granularity: Granularity) -> int:
    total = 1
    for c in classes:
        total *= c.n_hosts + 1 + c.n_hosts * len(c.parts(granularity))
    return total - 1


def in_pools(classes: Sequence[DeviceClass], granularity: Granularity, device_sets: Sequence[Sequence[str]]) -> bool:
    """Whether every device set is a pool of the granularity: per class whole sub-hosts plus at most one part
    of the halving chain (`DeviceClass.parts`). The exact solver proves nothing about a plan outside them
    (e.g. 4 GPUs of a 5-GPU host, the share a baseline may take), so it must not call such a plan optimal."""
    host_of = {d: (k, h) for k, c in enumerate(classes) for h, devs in enumerate(c.devices) for d in devs}
    for devices in device_sets:
        if any(d not in host_of for d in devices):
            return False
        on_host = Counter(host_of[d] for d in devices)
        partial = Counter(k for (k, _), n in on_host.items() if n != classes[k].per_host)
        if any(n > 1 for n in partial.values()):
            return False
        if any(n != classes[k].per_host and n not in classes[k].parts(granularity) for (k, _), n in on_host.items()):
            return False
    return True


def allocate(classes: Sequence[DeviceClass], pools: Sequence[Pool]) -> list[tuple[str, ...]]:
    """Concrete device ids for pools of several groups (in order): whole sub-hosts first, then parts packed
    into the next sub-hosts. Each group's list is ordered fastest class first, then host, then index."""
    out: list[list[str]] = [[] for _ in pools]
    for k, c in enumerate(classes):
        cursor = 0
        for g, pool in enumerate(pools):
            whole = pool[k][0]
            for h in range(cursor, cursor + whole):
                out[g].extend(c.devices[h])
            cursor += whole
        offset = 0
        for g, pool in enumerate(pools):
            part = pool[k][1]
            if not part:
                continue
            if offset + part > c.per_host:
                cursor, offset = cursor + 1, 0
            if cursor >= c.n_hosts:
                raise ValueError(f"pools overfill class {c.name}@{c.region}")
            out[g].extend(c.devices[cursor][offset : offset + part])
            offset += part
        if cursor > c.n_hosts or (cursor == c.n_hosts and offset):
            raise ValueError(f"pools overfill class {c.name}@{c.region}")
    return [tuple(devs) for devs in out]


# --- L4 + L5: layouts ------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Layout:
    """How one task runs on its group's devices: TP degree, PP depth, stage order, offload."""

    tp: int
    pp: int
    strided: bool = False
    """False: replica r = TP groups r·pp … r·pp+pp-1 (stages on neighbouring devices); True: replica r =
    TP groups r, r+dp, r+2·dp, … (every replica spans the device order, stage 0 on the fastest devices)."""
    offload: bool = False

    def label(self) -> str:
        extra = (" strided" if self.strided else "") + (" offload" if self.offload else "")
        return f"tp{self.tp} pp{self.pp}{extra}"


@dataclass(frozen=True)
class ModelShape:
    """What TP/PP degrees must divide (Megatron / vLLM rules)."""

    heads: int
    kv_heads: int
    layers: int
    vocab: int | None = None
    """Vocabulary rows: each TP rank holds some (runtime/parallel.py), so tp <= vocab (None: not checked)."""

    def tp_ok(self, tp: int) -> bool:
        """TP divides the attention heads; KV heads are split (kv % tp == 0) or replicated (tp % kv == 0); every
        TP rank gets vocabulary rows."""
        heads_ok = self.heads % tp == 0 and (self.kv_heads % tp == 0 or tp % self.kv_heads == 0)
        return heads_ok and (self.vocab is None or tp <= self.vocab)


def host_chunks(devices: Sequence[str], host_of: dict[str, str]) -> list[list[str]]:
    """Consecutive runs of `devices` on one host: the units TP groups must stay inside."""
    chunks: list[list[str]] = []
    for d in devices:
        if chunks and host_of[chunks[-1][-1]] == host_of[d]:
            chunks[-1].append(d)
        else:
            chunks.append([d])
    return chunks


UNPIPELINED_TASKS = frozenset({"generation"})
"""Tasks the runtime does not pipeline (`hetrl run` refuses generation with pp > 1; see docs/run.md)."""


def max_pp_of(task: str) -> int:
    """The deepest pipeline the planner may give `task`: 1 for what the runtime cannot pipeline.

    >>> max_pp_of("generation"), max_pp_of("actor_train")
    (1, 16)
    """
    return 1 if task in UNPIPELINED_TASKS else 16


def layouts(chunk_sizes: Sequence[int], shape: ModelShape, mixed: bool = True, max_pp: int = 16) -> list[Layout]:
    """Every layout whose TP groups fit inside the chunks and whose degrees divide the model sensibly;
    strided replicas only on `mixed` device sets (on one device type they only spread replicas wider)."""
    n = sum(chunk_sizes)
    out = []
    tp = 1
    while tp <= min(chunk_sizes):
        if all(s % tp == 0 for s in chunk_sizes) and shape.tp_ok(tp):
            groups = n // tp
            for pp in range(1, min(groups, shape.layers, max_pp) + 1):
                if groups % pp:
                    continue
                out.append(Layout(tp, pp))
                if mixed and pp > 1 and groups // pp > 1:
                    out.append(Layout(tp, pp, strided=True))
        tp *= 2
    return out


def place(task: TaskName, chunks: Sequence[Sequence[str]], layout: Layout) -> TaskPlacement:
    """The TaskPlacement of `task` with `layout` on the devices in `chunks` (order = stage order)."""
    tp_groups = [tuple(chunk[i : i + layout.tp]) for chunk in chunks for i in range(0, len(chunk), layout.tp)]
    dp = len(tp_groups) // layout.pp
    if layout.strided:
        replicas = tuple(tuple(tp_groups[r + s * dp] for s in range(layout.pp)) for r in range(dp))
    else:
        replicas = tuple(tuple(tp_groups[r * layout.pp + s] for s in range(layout.pp)) for r in range(dp))
    return TaskPlacement(task=task, replicas=replicas, offload=layout.offload)
