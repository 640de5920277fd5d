"""The profile's devices as the cost model sees them: classes of interchangeable devices, their slowdowns,
the TP stages built from them and the links between stages.

Devices of one name and core share on one host are interchangeable (a *class*): every estimate is computed on
classes and cached by the placement's shape in classes, so a search that tries many device sets of the same
shape pays once (docs/costmodel.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.comm import LOCAL, LinkInfo, Links
from hetrl_cli.costmodel.memo import Memo

Replicas = tuple[tuple[tuple[str, ...], ...], ...]
"""Device ids per replica, stage and TP rank (TaskPlacement.replicas)."""
ClassLayout = tuple[tuple[tuple[int, ...], ...], ...]
"""The same shape in device classes: what class-level estimates are keyed by."""


@dataclass(frozen=True)
class DevClass:
    """Devices of one name and core share on one host: interchangeable for the cost model."""

    idx: int
    host: str
    name: str
    region: str
    compute_Fps: float
    """FLOP/s at the workload precision (profile figure × calibration; the tasks' efficiency constants apply on top)."""
    mem_Bps: float
    memory_bytes: int
    host_slowdown: float = 1.0
    """How much slower than one full core this device's host runs the per-step Python and launch work:
    1 / min(1, cores) for a CPU device under a cgroup quota, 1 where the profile records no core count."""
    decode_slowdown: float = 1.0
    """The same for generation's per-step work (decode_slowdowns(): measured where the profile has
    decode_steps_per_s, else host_slowdown)."""
    opt_Bps: float = 0.0
    """The memory traffic rate of the optimizer step (mem_Bps × the calibrated `optimizer` factor): an
    elementwise update, bandwidth-bound when fused on a GPU, bound by unfused element work on a CPU."""
    launches: bool = False
    """An accelerator fed by asynchronous kernel launches: its eager passes cannot run faster than the host
    dispatches them (constants.EAGER_DISPATCH_S_PER_LAYER_*). False for a CPU device."""


@dataclass(frozen=True)
class Stage:
    """One TP group: it runs at its slowest member's speed and on its bottleneck link."""

    tp: int
    compute_Fps: float
    """Summed over the TP group at the slowest member's rate."""
    mem_Bps: float
    """Per device (slowest member)."""
    memory_bytes: int
    hosts: tuple[str, ...]
    link: LinkInfo
    missing_flops: bool
    opt_Bps: float = 0.0
    """The optimizer step's traffic rate per device (slowest member)."""
    launches: bool = False
    """Every member is an accelerator fed by asynchronous launches (DevClass.launches)."""


def host_slowdown(device) -> float:
    """DevClass.host_slowdown of a profiled device: per-step host work (Python, launches) runs at the core
    share the host's processes get, so a CPU device capped to 0.25 of a core does it 4× slower."""
    if device.kind == "cpu" and device.cores:
        return 1.0 / min(1.0, device.cores)
    return 1.0


def decode_slowdowns(devices) -> dict[str, float]:
    """DevClass.decode_slowdown per device id. Where the profile measured decode_steps_per_s on CPU devices,
    their rates set the ratios: the fastest-measured device keeps its host_slowdown and every other measured
    one is slower by its rate's ratio to it (a decode loop under a cgroup quota pays more than the share:
    docs/costmodel.md); every other device keeps its host_slowdown."""
    measured = [d for d in devices if d.kind == "cpu" and d.decode_steps_per_s]
    anchor = max(measured, key=lambda d: d.decode_steps_per_s, default=None)
    out = {d.id: host_slowdown(d) for d in devices}
    for d in measured:
        out[d.id] = host_slowdown(anchor) * anchor.decode_steps_per_s / d.decode_steps_per_s
    return out


def gpu_generation(compute_capability: str | None) -> str:
    """The key of constants.DATASHEET_MATMUL_FRACTION: "hopper" from compute capability 9.0 on (its datasheet
    peak needs wgmma kernels), "ada" at 8.9 (GDDR6/6X parts, fitted on RTX 4090 figures), "ampere" for every
    other earlier or unknown one (Turing and Volta too: no figure fits a fraction of their own)."""
    try:
        major, _, minor = str(compute_capability).partition(".")
        major_n = int(major)
    except ValueError:
        return "ampere"
    if major_n >= 9:
        return "hopper"
    return "ada" if major_n == 8 and minor == "9" else "ampere"


def datasheet_matmul_fraction(device) -> float:
    """What of a datasheet matmul peak a GEMM reaches on this device's generation (compute_tflops applies it
    to datasheet figures only)."""
    return C.DATASHEET_MATMUL_FRACTION[gpu_generation(device.compute_capability)]


def memory_Bps(device) -> float:
    """Achievable memory bandwidth in bytes/s: the profile's figure, × its generation's DATASHEET_HBM_FRACTION
    where that figure is the datasheet's (a catalog profile: `peak_memory_gbps` equal to it), not a probe's."""
    datasheet = device.kind != "cpu" and device.peak_memory_gbps == device.memory_gbps
    fraction = C.DATASHEET_HBM_FRACTION[gpu_generation(device.compute_capability)] if datasheet else 1.0
    return device.memory_gbps * 1e9 * fraction


def compute_tflops(devices, dtype: str) -> dict[str, float]:
    """Each device's achievable TFLOP/s at `dtype` (0 where the profile has no figure): a measured figure as it
    is, a datasheet peak × its generation's DATASHEET_MATMUL_FRACTION. Where the profile measured
    forward_tokens_per_s on CPU devices, their rates set the ratios: the fastest-measured device keeps its
    matmul figure and every other measured one is slower by its rate's ratio to it (a small model's passes
    under a cgroup quota on a shared machine can scale unlike the large matmul probe: docs/costmodel.md),
    like decode_slowdowns does for generation's host work."""

    def own(device) -> float:
        try:
            rate = device.tflops(dtype)
        except KeyError:
            return 0.0
        measured = dtype in device.measured_tflops or (
            dtype not in device.peak_tflops and "fp32" in device.measured_tflops
        )  # the table Device.tflops read
        return rate if measured or device.kind == "cpu" else rate * datasheet_matmul_fraction(device)

    out = {d.id: own(d) for d in devices}
    measured = [d for d in devices if d.kind == "cpu" and d.forward_tokens_per_s and out[d.id]]
    anchor = max(measured, key=lambda d: d.forward_tokens_per_s, default=None)
    for d in measured:
        out[d.id] = out[anchor.id] * d.forward_tokens_per_s / anchor.forward_tokens_per_s
    return out


class Cluster:
    """Device classes, usable memory, links, TP stages and pipeline hops of one profile (calibrated)."""

    def __init__(self, profile: ClusterProfile, precision: str, calibration: dict) -> None:
        self.links = Links(profile, calibration.get("link_class"))
        self.devices = {d.id: d for d in profile.devices}
        self.classes: list[DevClass] = []
        self.device_class: dict[str, int] = {}
        """Each device id's index in `classes`."""
        self._classify(profile, precision, calibration.get("device_class", {}))
        self.usable = {d.id: d.memory_bytes * C.USABLE_MEMORY_FRACTION for d in profile.devices}
        """What training/inference may allocate per device."""
        self.usable_gen = {
            d.id: d.memory_bytes * max(C.GEN_MEMORY_UTILIZATION, C.USABLE_MEMORY_FRACTION) for d in profile.devices
        }
        """Generation: the engine sizes its KV pool to GEN_MEMORY_UTILIZATION itself."""
        self._stages: Memo[Stage] = Memo(self._make_stage)
        self._hops: Memo[LinkInfo] = Memo(self._make_stage_link)
        self._least: Memo[tuple[str, float]] = Memo(self._make_least_usable)
        self.class_layout: Memo[ClassLayout | None] = Memo(self._make_class_layout)
        """class_layout(replicas) → device classes per replica and stage (None if a device is unknown)."""
        self.checked_layout: Memo[tuple[ClassLayout | None, str | None]] = Memo(self._make_checked_layout)
        """checked_layout(replicas) → (class layout, None), or (None, why the ids cannot be used: it follows
        the task name)."""

    def _classify(self, profile: ClusterProfile, precision: str, dev_cal: dict) -> None:
        regions = {h.name: h.region for h in profile.hosts}
        index: dict[tuple[str, str, float, float], int] = {}
        decode = decode_slowdowns(profile.devices)
        tflops = compute_tflops(profile.devices, precision)
        for d in profile.devices:
            key = (d.host, d.name, host_slowdown(d), decode[d.id])
            if key not in index:
                cal = dev_cal.get(d.name, {})
                flops = tflops[d.id] * 1e12 * cal.get("compute", 1.0)
                mem_Bps = memory_Bps(d) * cal.get("memory", 1.0)
                opt_Bps = mem_Bps * cal.get("optimizer", 1.0)
                index[key] = len(self.classes)
                self.classes.append(
                    DevClass(
                        len(self.classes),
                        d.host,
                        d.name,
                        regions.get(d.host, "default"),
                        flops,
                        mem_Bps,
                        d.memory_bytes,
                        host_slowdown(d),
                        decode[d.id],
                        opt_Bps,
                        d.kind != "cpu",
                    )
                )
            else:
                cls = self.classes[index[key]]
                if d.memory_bytes < cls.memory_bytes:  # same name, smaller memory share: keep the smaller
                    self.classes[index[key]] = dataclasses.replace(cls, memory_bytes=d.memory_bytes)
            self.device_class[d.id] = index[key]

    # ---- layouts ----------------------------------------------------------------------------------------
    def _make_class_layout(self, replicas: Replicas) -> ClassLayout | None:
        dc = self.device_class
        try:
            return tuple(tuple(tuple(dc[d] for d in st) for st in rep) for rep in replicas)
        except KeyError:
            return None

    def _make_checked_layout(self, replicas: Replicas) -> tuple[ClassLayout | None, str | None]:
        rep_key = self.class_layout(replicas)
        devs = tuple(d for replica in replicas for stage in replica for d in stage)
        if rep_key is None:
            missing = next(d for d in devs if d not in self.device_class)
            return None, f" uses device {missing} that the profile does not have; check the profile"
        if len(set(devs)) != len(devs):
            dup = next(d for d in devs if devs.count(d) > 1)
            return None, f" uses device {dup} twice; each tasklet needs its own device"
        return rep_key, None

    # ---- stages and hops --------------------------------------------------------------------------------
    def stage(self, classes: tuple[int, ...]) -> Stage:
        """The Stage of a TP group of these device classes."""
        hit = self._stages.get(classes)
        return self._stages.keyed(classes, classes) if hit is None else hit

    def _make_stage(self, classes: tuple[int, ...]) -> Stage:
        cls = [self.classes[c] for c in classes]
        hosts = tuple(c.host for c in cls)
        counts: dict[str, int] = {}
        for h in hosts:
            counts[h] = counts.get(h, 0) + 1
        multi = frozenset(h for h, n in counts.items() if n > 1)
        link = self.links.ring(frozenset(hosts), multi) if len(cls) > 1 else LOCAL
        return Stage(
            tp=len(cls),
            compute_Fps=len(cls) * min(c.compute_Fps for c in cls),
            mem_Bps=min(c.mem_Bps for c in cls),
            memory_bytes=min(c.memory_bytes for c in cls),
            hosts=hosts,
            link=link,
            missing_flops=any(c.compute_Fps <= 0 for c in cls),
            opt_Bps=min(c.opt_Bps for c in cls),
            launches=all(c.launches for c in cls),
        )

    def stage_link(self, a: Stage, b: Stage) -> LinkInfo:
        """Pipeline hop: TP rank t of one stage sends to rank t of the next; the slowest pair bounds it."""
        key = (a.hosts, b.hosts)
        hit = self._hops.get(key)
        return self._hops.keyed(key, a, b) if hit is None else hit

    def _make_stage_link(self, a: Stage, b: Stage) -> LinkInfo:
        link: LinkInfo | None = None
        for ha, hb in zip(a.hosts, b.hosts, strict=True):
            hop = self.links.between(ha, hb)
            link = hop if link is None else link.worst(hop)
        return link or LOCAL

    # ---- memory and host speed --------------------------------------------------------------------------
    def least_usable(self, stage: tuple[str, ...], gen: bool) -> tuple[str, float]:
        """The first device of a TP group with the least usable memory, and that memory."""
        key = (stage, gen)
        hit = self._least.get(key)
        return self._least.keyed(key, stage, gen) if hit is None else hit

    def _make_least_usable(self, stage: tuple[str, ...], gen: bool) -> tuple[str, float]:
        usable = self.usable_gen if gen else self.usable
        d = min(stage, key=usable.__getitem__)
        return d, usable[d]

    def slowest(self, class_ids: Iterable[int], task: str | None = None) -> float:
        """The largest host_slowdown (decode_slowdown for generation) among device classes (1 for none)."""
        if task == "generation":
            return max((self.classes[c].decode_slowdown for c in class_ids), default=1.0)
        return max((self.classes[c].host_slowdown for c in class_ids), default=1.0)

    def layout_slowdown(self, classes: tuple[tuple[int, ...], ...], task: str | None = None) -> float:
        """The slowest slowdown among a replica's device classes (per stage)."""
        return self.slowest((c for stage in classes for c in stage), task)

    def overhead_scale(self, devices: Sequence[str], task: str | None = None) -> float:
        """The factor on per-step fixed overheads of `task`'s work on `devices`: its slowest host's
        `host_slowdown` (`decode_slowdown` for generation; the overhead is per replica and does not shrink with
        a smaller batch share, so the slowest sets it)."""
        return self.slowest((self.device_class[d] for d in devices if d in self.device_class), task)

    def host_of(self, device: str) -> str:
        """The host of a known device id."""
        return self.classes[self.device_class[device]].host
