"""A lower bound on the best plan's iteration that needs no pool enumerated (issue 24: the exact solver scales).

The ILP's tables cost tens of cost-model calls per (group, pool), and a cluster of 10 kinds of host with 1-2
hosts each has 10^3-10^4 whole-host pools. This bound reads no table: it relaxes each group's devices to a
*count of devices per device class* (integers, any split of a class between groups) and each task's time to
floors that are sums over those devices, then minimises the iteration over the counts per grouping.

Why each floor is ≤ the cost model's time of the task, on any device set of the planner's space (layouts of
`space.layouts`: TP inside a host, generation unpipelined; any batch shares; any group mates):
- A task's time is its slowest replica's time plus non-negative terms (DP all-reduce, optimizer step,
  offload, calibrated overhead): `costmodel/tasks.py`. Mates only take memory (never make a task faster).
- **Additive floors** (`Ratio`): in a replica every device d does its share of the work. Forward passes
  (`costmodel/forward.py`): time ≥ m·t_p ≥ x_d/f_d + y_d/m_d for each device d of stage p, where x_d and y_d
  are its matmul FLOPs (at the task's matmul efficiency) and non-matmul HBM bytes (at the elementwise
  efficiency), and f_d, m_d its FLOP/s and bytes/s (a TP group runs at its slowest member, so at most
  these). The x_d add up to the task's FLOPs, the y_d to at least the tp=1 traffic. For weights u, v ≥ 0:
  u·x_d + v·y_d ≤ max(u·f_d, v·m_d)·(x_d/f_d + y_d/m_d) ≤ max(u·f_d, v·m_d)·T; summed over the devices,
  T ≥ (u·X + v·Y) / Σ_d max(u·f_d, v·m_d) — the denominator is linear in the device counts. Generation
  (`costmodel/generation.py`): each decode step takes ≥ the step's FLOPs / FLOP/s and ≥ its HBM bytes /
  bytes/s (weights once per step, at most MAX_NUM_SEQS sequences per step, each reading its KV cache and
  attending at its own context: n·(prompt·E[L] + E[L²]/2) KV tokens over the decode, `_own_context`), and
  the prefill's FLOPs add to it; the same argument gives T ≥ X/ΣF and T ≥ Y/ΣM. A training micro-batch also
  adds its gradient into every weight's (GRAD_ACCUMULATION_PASSES): ≥ N / micro_batch micro-batches over the
  replicas, each over the matmul weights, join Y.
- **Summed floors** (`TaskFloor.sums`): a replica r with batch share s_r takes ≥ s_r·a_r + s_r·b_r + τ where
  a_r, b_r are its seconds per sequence of two terms the cost model adds (generation: decode's weight and KV
  reads at its sequence cap, the prefill's FLOPs) and τ seconds every replica pays (generation: its steps are
  ≥ s_r·Rm/batch + Rt − Rm, each reading the weights: τ = (Rt − Rm)·W / the largest tp_max·bandwidth). By
  Cauchy–Schwarz, 1/(x + y) ≤ θ²/x + (1 − θ)²/y for every θ in [0, 1], so Σ_r s_r = N gives
  T − τ ≥ N/(θ²·Σ1/a_r + (1 − θ)²·Σ1/b_r), whose best θ is T ≥ N/Σ1/a_r + N/Σ1/b_r + τ: the two ratios add.
- **Per-class floors** (`TaskFloor.per_class`): a generation replica runs ≥ resp_tail decode steps
  (`steps = max(Rt, …)`), each reading its weights (W/tp per device, tp ≤ the host's GPU count) at its
  slowest member's bandwidth, so a group with a device of class k takes ≥ Rt·W/(tp_max·m_k) whatever its
  share (the balancer cannot give a replica fewer steps). A forward replica on launching accelerators
  waits ≥ its host's eager dispatch for every layer of every pass (time ≥ Σ_p t_p ≥ passes·L·dispatch).
- **Optimizer** (`TaskFloor.added`): the step's traffic over every device's parameters is ≥ the model's
  parameters × bytes, and the slowest device's share of it sets the term: ≥ that over Σ_d opt_d.
- **Memory** (`memory_need`): every device a task uses holds its shard of the weights (+ gradients when
  training) within its usable memory, and the shards add up to at least the model's; while a task runs, its
  group's devices also hold what its mates keep resident (a trainer's weights: `costmodel/memory.py`) and
  every trainer's optimizer state (ZeRO shards add up to one copy) unless that trainer offloads it, and an
  offloading trainer's copies take ≥ 2 × its optimizer bytes / HOST_DEVICE_Bps over its devices (the most a
  device copies is ≥ the average). A binary per trainer picks (LP: relaxed); the cheap bound ignores memory.
- **A trainer over two regions** (`TaskFloor.spread_layout`): with DP 1 a pipeline hop crosses regions (its
  hops, a floor on the replica alone); with DP ≥ 2 the gradient all-reduce's ring spans every host the task
  uses, so it crosses a link between regions (at most the fastest), and it *adds* to the slowest replica's
  time (`costmodel/training.py`): ≥ frac · G / β + α an epoch, where frac (the most positions one host holds /
  tp·pp) ≥ 1/pp ≥ max(1/depth, 2/n) and ≥ c/n for a host with c devices (they hold ≥ c/dp of the n/dp
  positions; c ≥ the odd part of its class's GPUs per sub-host). DP 1 needs n = tp·pp ≤ TP · depth for a TP
  every class present allows; where it cannot, the all-reduce adds. In the MILP: binaries for DP 1 and
  presence per class, the c/n terms as convex ratios switched on by them (big-M at their value at n = 1).
- **Weight syncs** (`sync_floors`): each sync's per-tensor host work at the least host slowdown, plus its
  bytes: between groups (disjoint devices) a broadcast at the fastest link, at the fastest link between
  regions where the inference group holds a region the training group does not; in one group the less of
  that and a local reshard + the colocated refit. Transfers and the rule-based reward's floor are ≥ 0.

Each floor A/L(n) is convex in the counts, so per grouping the minimum of the composed iteration over
integer counts is bounded from below by a MILP of tangent cuts (Kelley): every tangent lies under its
function, so each MILP's proven bound is a lower bound of that grouping's best plan, and cuts at the MILP's
solution tighten it while time lasts. The space's bound is the least over groupings, capped by the incumbent
(a feasible plan): it is ≤ the optimum of the ILP at any granularity and of the hybrid's space. Tested:
≤ every task's fastest layout on random pools of the uneven suite, ≤ the full ILP's proven optimum.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from hetrl_cli.artifacts.rl import HEAD, PHASES, TRAIN_TASKS, TaskName
from hetrl_cli.costmodel.compose import BOUNDARIES, SPANS, WEIGHT_SYNC, iteration_s, lanes, overlaps, scales, span
from hetrl_cli.planner.search import Subset

CUT_ROUNDS = 25
"""Kelley rounds per grouping at most (each adds the tangents its solution violates)."""
MIP_GAP = 0.01
"""HiGHS's relative gap for a grouping's MILP: its proven (dual) bound is what counts, so a 1 % gap costs the
bound at most 1 % of that grouping and frees time for the others."""
CUTOFF_SLACK = 1e-4
"""A grouping whose MILP has no node below the cutoff counts at the cutoff less this share (HiGHS's tolerances)."""
CUT_TOLERANCE = 1e-4
"""A floor under-estimated by less than this share at the MILP's solution gets no new cut."""


@dataclass(frozen=True)
class Ratio:
    """work / Σ_k n_k·rate[k] (n_k = devices of class k in the group)."""

    work: float
    rate: tuple[float, ...]

    def value(self, counts) -> float:
        den = sum(n * r for n, r in zip(counts, self.rate, strict=True))
        return math.inf if den <= 0 else self.work / den


@dataclass(frozen=True)
class TaskFloor:
    """T_task ≥ const + max(max_{k present} per_class[k]·tp_of[k]/τ, max_j ratios[j]) + Σ added, τ the least
    tp_of[k] over the classes present (module docstring)."""

    const: float
    per_class: tuple[float, ...]
    ratios: tuple[Ratio, ...]
    added: tuple[Ratio, ...]
    memory: float = 0.0
    """Bytes the task's devices hold at least (its weights; + gradients when training): a group's devices
    (at their usable memory) hold every task's (module docstring)."""
    tp_of: tuple[int, ...] | None = None
    """Per class, the largest TP a device set holding it allows (per_class[k] is the floor at that TP; one TP
    serves the whole task, so a class that allows less scales every other class's floor up)."""
    spread: float = 0.0
    """The floor on a device set over two regions or more (training: a pipeline hop or the DP all-reduce
    crosses regions; module docstring)."""
    regions: tuple[str, ...] = ()
    """Each class's region (read with `spread`)."""
    resident: float = 0.0
    """Bytes the task keeps on its group's devices while a mate runs (a trainer's weights; an inference task's
    may be offloaded, so 0)."""
    optimizer: float = 0.0
    """A trainer's optimizer-state bytes: held with `memory` and `resident` unless offloaded (module docstring)."""
    offload: Ratio | None = None
    """A trainer's offload copies where its optimizer state is offloaded: ≥ 2 × `optimizer` / host-device
    bandwidth over its devices."""
    sums: tuple[tuple[tuple[Ratio, ...], float], ...] = ()
    """Floors that add: T ≥ Σ ratios + seconds (generation's decode reads, prefill and tail; module docstring)."""
    wan_grad: float = 0.0
    """A trainer over two regions or more with DP ≥ 2: its gradient all-reduce crosses regions and *adds* to its
    slowest replica's time, ≥ `wan_grad` · frac + `wan_latency` (`allreduce_s`; module docstring); 0 where it
    may not (ZeRO-3's gathers, one region)."""
    wan_latency: float = 0.0
    chunk: tuple[int, ...] = ()
    """Per class, the fewest devices a device set holding it has on one of its hosts (the odd part of its GPUs
    per sub-host: the least of the halving parts)."""
    hops: float = 0.0
    """The same trainer with DP 1: its pipeline hops across regions (a floor on the replica's time alone)."""
    layout_tp: tuple[int, ...] = ()
    """Per class, the largest TP a trainer's device set holding it allows (DP 1 needs n ≤ TP · `depth`)."""
    depth: int = 0
    """The most pipeline stages a trainer's layout has."""

    def tail(self, counts) -> float:
        """max over the classes present of per_class, at the least TP they allow together (and the spread
        floor where they lie in two regions or more)."""
        held = [k for k, n in enumerate(counts) if n > 0]
        if not held:
            return 0.0
        spread = self.spread if self.spread and len({self.regions[k] for k in held}) > 1 else 0.0
        if self.tp_of is None:
            return max(spread, *(self.per_class[k] for k in held))
        tp = min(self.tp_of[k] for k in held)
        return max(spread, *(self.per_class[k] * self.tp_of[k] / tp for k in held))

    def value(self, counts) -> float:
        summed = (sum(r.value(counts) for r in parts) + extra for parts, extra in self.sums)
        best = max([self.tail(counts), *(r.value(counts) for r in self.ratios), *summed])
        return self.const + self.spread_layout(counts, best) + sum(r.value(counts) for r in self.added)

    def spread_layout(self, counts, best: float) -> float:
        """`best` (the slowest replica's floor) with the cross-region all-reduce added where the device set
        lies in two regions or more: DP ≥ 2 where n > TP · depth for every TP it allows, else the less of that
        and the DP-1 floor (its hops)."""
        held = [k for k, n in enumerate(counts) if n > 0]
        if not self.wan_grad or not held or len({self.regions[k] for k in held}) < 2:
            return best
        allreduce = self.allreduce_s(counts)
        tp = min(self.layout_tp[k] for k in held)
        if sum(counts) > tp * self.depth:
            return best + allreduce
        return min(best + allreduce, max(best, self.hops))

    def allreduce_s(self, counts) -> float:
        """The cross-region all-reduce's floor on a device set with DP ≥ 2: the bytes one host's shards move,
        frac · G with frac ≥ 1/pp, pp ≤ depth and ≤ n/2 (dp ≥ 2), and frac ≥ c/n for every host's c devices
        (they hold ≥ c/dp of the tp·pp = n/dp positions)."""
        n = sum(counts)
        most = max([2.0, *(self.chunk[k] for k, c in enumerate(counts) if c > 0)])
        frac = min(1.0, max(1.0 / self.depth, most / n))
        return self.wan_grad * frac + self.wan_latency


def class_rates(tables) -> tuple[list[float], list[float], list[float], list[bool], list[int]]:
    """Per planner device class: FLOP/s, HBM bytes/s, optimizer bytes/s (cost model's figures, per device),
    whether it launches (an accelerator), and the GPU count of its hosts where they hold other kinds too
    (else 0: a TP group of this class's hosts is inside the sub-host)."""
    cl = tables.cm.cluster
    per_host: dict[str, int] = {}
    for d in tables.profile.devices:
        per_host[d.host] = per_host.get(d.host, 0) + 1
    f, m, o, launches, host_gpus = [], [], [], [], []
    for c in tables.classes:
        dc = cl.classes[cl.device_class[c.devices[0][0]]]
        f.append(dc.compute_Fps)
        m.append(dc.mem_Bps)
        o.append(dc.opt_Bps)
        launches.append(dc.launches)
        mixed = any(per_host[h] > c.per_host for h in c.hosts)
        host_gpus.append(max(per_host[h] for h in c.hosts) if mixed else 0)
    return f, m, o, launches, host_gpus


def _max_tp(shape, gpus: int, divides: bool) -> int:
    """The largest TP (a power of two the model's heads allow) at most `gpus`, dividing it where `divides`."""
    tp, best = 1, 1
    while tp <= gpus:
        if shape.tp_ok(tp) and (not divides or gpus % tp == 0):
            best = tp
        tp *= 2
    return best


def _class_tp(tables, task: TaskName, host_gpus: list[int]) -> list[int]:
    """Per class, the largest TP of `task` a device set holding it allows: TP divides every host's chunk (whole
    sub-hosts or halving parts: at most the sub-host's power of two); on hosts with other kinds too, at most
    the host's GPUs."""
    shape = tables.shapes[task]
    return [
        _max_tp(shape, g, False) if g else _max_tp(shape, c.per_host, True)
        for g, c in zip(host_gpus, tables.classes, strict=True)
    ]


def _odd(gpus: int) -> int:
    """The odd part of `gpus`: the least of its halving parts (`DeviceClass.parts`)."""
    while gpus % 2 == 0 and gpus > 1:
        gpus //= 2
    return gpus


def _spread_floor(tables, consts, arch, grads: float) -> tuple[float, float, float]:
    """A training task on devices in two regions or more: with one replica (DP 1), a pipeline hop crosses
    regions and carries every micro-batch's activations (forward and gradient: passes · sends · N · seq · h ·
    bytes over the hop at most the fastest link between regions, + one latency per micro-batch and send);
    with DP ≥ 2, the gradient all-reduce's ring
    spans every host the task uses and so crosses regions (its bottleneck: at most the fastest link between
    regions), moving ≥ frac · G bytes, frac ≥ 1/pp (a host holds a whole TP group: tp of the tp·pp shards),
    pp ≤ min(16, layers) (and `TaskFloor.allreduce_s`): ≥ frac · G / β + α an epoch. (hops, epochs · G / β,
    epochs · α); zeros on one region."""
    links, hosts = tables.cm.cluster.links, [h for c in tables.classes for h in c.hosts]
    crossing = [links.between(a, b) for a in hosts for b in hosts if links.region(a) != links.region(b)]
    if not crossing:
        return 0.0, 0.0, 0.0
    fastest = max(link.bandwidth_Bps for link in crossing)
    latency = min(link.latency_s for link in crossing)
    step, w = tables.cm.step, tables.workload
    sends = consts.passes[2] * consts.sends_per_stage
    micro_batches = step.n_samples / w.micro_batch  # m ≥ N / micro_batch on the one replica
    activations = step.n_samples * step.seq_mean * arch.hidden_size * step.act_bytes
    hops = sends * (activations / fastest + micro_batches * latency)
    return hops, w.ppo_epochs * grads / fastest, w.ppo_epochs * latency


def _own_context(resp_mean: float, resp_tail: float) -> float:
    """Generated tokens of context a decode's KV reads cover per generated token, over all its steps: a sequence
    of length L reads prompt + 0 .. L − 1, so n·(prompt·E[L] + E[L²]/2) KV tokens in all, E[L²]/(2·E[L]) past
    the prompt (`costmodel/generation.py` drain_contexts: the full batch's context, and its drain segments add
    up to the same), ≥ E[L]/2 by Jensen. Where the tail is below the mean (no such length profile), E[L]/2."""
    from hetrl_cli.costmodel.generation import drain_contexts

    if resp_mean <= 0 or resp_tail < resp_mean:
        return resp_mean / 2
    return max(resp_mean / 2, drain_contexts(resp_mean, resp_tail)[0])


def _generation_floor(tables, const: float) -> TaskFloor:
    """Generation's floor (module docstring): FLOPs, decode reads at each class's sequence cap, the tail of
    weight reads per class, and their sum with the prefill and the steps past the mean response."""
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.costmodel.memory import weight_bytes_per_param

    cm, step, w = tables.cm, tables.cm.step, tables.workload
    f, m, _o, _launches, host_gpus = class_rates(tables)
    memory = [c.memory_bytes for c in tables.classes]
    footprint = step.prompt_tokens + step.resp_mean  # the KV cache a sequence reserves (generation.py)
    n = step.n_samples
    arch = step.arch["generation"]
    # each token's attention and KV reads at its own context (the cost model's segments: `_own_context`)
    kv_ctx = step.prompt_tokens + _own_context(step.resp_mean, step.resp_tail)
    decode = n * step.resp_mean * arch.forward_flops_per_token(kv_ctx, "lm") / C.DECODE_MFU
    prefill = n * step.prompt_tokens * arch.forward_flops_per_token(step.prompt_tokens / 2, "lm")
    weights = step.stage_params(arch, "lm", (arch.num_layers,), 0) * weight_bytes_per_param(w)
    kv = arch.kv_bytes_per_token(w.precision)
    tp_max = _class_tp(tables, "generation", host_gpus)
    rates = []
    for k, (b, mem) in enumerate(zip(m, memory, strict=True)):
        # the KV cache holds at most this many sequences on a TP group of class k (no mates, no work space)
        cap = min(C.MAX_NUM_SEQS, (tp_max[k] * mem * C.GEN_MEMORY_UTILIZATION - weights) / (kv * footprint))
        rates.append(0.0 if cap < 1 else b * C.HBM_EFFICIENCY / (step.resp_mean * (weights / cap + kv_ctx * kv)))
    ratios = (Ratio(decode + prefill / C.PREFILL_MFU, tuple(f)), Ratio(n, tuple(rates)))
    tails = tuple(step.resp_tail * weights / (t * b * C.HBM_EFFICIENCY) for t, b in zip(tp_max, m, strict=True))
    const += step.resp_tail * C.DECODE_STEP_OVERHEAD_S * cm.overhead_factor.get("generation", 1.0)
    sums: tuple = ()
    if step.resp_tail >= step.resp_mean:  # steps ≥ share·Rm/batch + (Rt − Rm), each reading the weights
        late = (step.resp_tail - step.resp_mean) * min(tails) / step.resp_tail
        sums = (((Ratio(n, tuple(rates)), Ratio(prefill / C.PREFILL_MFU, tuple(f))), late),)
    return TaskFloor(const, tails, ratios, (), weights, tuple(tp_max), sums=sums)


def task_floors(tables) -> dict[TaskName, TaskFloor]:
    """Each device task's floor (module docstring), from the workload's step and the classes' rates."""
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.costmodel.memory import (
        grad_bytes_per_param,
        optimizer_bytes_per_param,
        optimizer_step_traffic_bytes_per_param,
        weight_bytes_per_param,
    )
    from hetrl_cli.planner.space import max_pp_of

    cm, step, w = tables.cm, tables.cm.step, tables.workload
    f, m, o, launches, host_gpus = class_rates(tables)
    n = step.n_samples
    out: dict[TaskName, TaskFloor] = {}
    for task in tables.tasks:
        arch = step.arch[task]
        const = cm.task_overhead_s.get(task, 0.0)
        if task == "generation":
            out[task] = _generation_floor(tables, const)
            continue
        consts = cm.forward.consts(task)
        head = HEAD[task]
        passes = n * step.seq_mean * consts.mult * consts.passes[0]
        flops = passes * arch.forward_flops_per_token(consts.context, head) / consts.matmul_efficiency
        traffic = arch.num_layers * arch.layer_traffic_bytes_per_token(step.act_bytes, 1)
        if head == "lm":
            share = step.resp_mean / step.seq_mean
            traffic += arch.vocab_size * (step.act_bytes + share * C.LOGITS_TRAFFIC_BYTES_PER_RESPONSE_ENTRY)
        nbytes = passes * traffic / C.ELEMENTWISE_HBM_EFFICIENCY
        if consts.accumulate_bytes_per_param:  # each micro-batch adds its gradient into every stage's: ≥ N / micro
            # batch micro-batches over the replicas, each over all the weights a matmul holds
            params = arch.num_layers * arch.layer_params + arch.head_matmul_params(head)
            accumulated = consts.passes[0] * n / w.micro_batch * params * consts.accumulate_bytes_per_param
            nbytes += accumulated / C.ELEMENTWISE_HBM_EFFICIENCY
        ratios = [Ratio(flops, tuple(f)), Ratio(nbytes, tuple(m))]
        for fk, mk in sorted({(a, b) for a, b in zip(f, m, strict=True) if a > 0 and b > 0}):
            v = fk / mk  # u = 1: the weights where class k's two resources balance
            ratios.append(Ratio(flops + v * nbytes, tuple(max(a, v * b) for a, b in zip(f, m, strict=True))))
        dispatch = consts.passes[0] * arch.num_layers * consts.dispatch_s_per_layer
        per_class = tuple(dispatch if all(launches) else 0.0 for _ in f)
        if all(launches):  # m ≥ share / micro_batch passes, each waiting for every layer's dispatch
            ratios.append(Ratio(n * dispatch / w.micro_batch, tuple(1.0 for _ in f)))
        added: tuple[Ratio, ...] = ()
        held = arch.param_count(head) * weight_bytes_per_param(w)
        spread, hops, wan_grad, wan_latency, layout_tp = 0.0, 0.0, 0.0, 0.0, ()
        depth = min(max_pp_of(task), arch.num_layers)
        resident, state, offload = 0.0, 0.0, None
        if task in TRAIN_TASKS:
            opt = w.ppo_epochs * arch.param_count(head) * optimizer_step_traffic_bytes_per_param(w)
            added = (Ratio(opt, tuple(o)),)
            resident = held
            held += arch.param_count(head) * grad_bytes_per_param(w)
            grads = arch.param_count(head) * grad_bytes_per_param(w)
            hops, wan_grad, wan_latency = _spread_floor(tables, consts, arch, grads)
            spread = min(hops, wan_grad / depth + wan_latency)
            if w.sharding == "zero3":  # its gathers replace the all-reduce (training.py): not added here
                wan_grad = 0.0
            layout_tp = tuple(_class_tp(tables, task, host_gpus))
            state = arch.param_count(head) * optimizer_bytes_per_param(w)
            offload = Ratio(2 * state / C.HOST_DEVICE_Bps, tuple(1.0 for _ in f))
        regions = tuple(c.region for c in tables.classes)
        out[task] = TaskFloor(
            const, per_class, tuple(ratios), added, held, None, spread, regions, resident, state, offload,
            wan_grad=wan_grad, wan_latency=wan_latency, chunk=tuple(_odd(c.per_host) for c in tables.classes),
            hops=hops, layout_tp=layout_tp, depth=depth,
        )  # fmt: skip
    return out


def _cheap(floor: TaskFloor, all_counts) -> float:
    """The floor minimised over device sets with capacity ignored: each part at its own best (the fewest
    per-class floor: one class; the ratios: every device)."""
    least = min((g for g in floor.per_class), default=0.0)  # one class alone: its own TP
    summed = (sum(r.value(all_counts) for r in parts) + extra for parts, extra in floor.sums)
    best = max([least, *(r.value(all_counts) for r in floor.ratios), *summed])
    return floor.const + best + sum(r.value(all_counts) for r in floor.added)


def memory_need(floors: dict[TaskName, TaskFloor], group: Subset, task: TaskName, offloaded) -> float:
    """Bytes the devices of `group` hold at least while `task` runs (`offloaded`: the trainers whose optimizer
    state is in host memory): its own (none for critic_inference on critic_train's weights:
    costmodel/memory.py), its mates' resident ones, and every trainer's optimizer state not offloaded."""
    own = 0.0 if task == "critic_inference" and "critic_train" in group else floors[task].memory
    mates = sum(floors[t].resident for t in group if t != task)
    return own + mates + sum(floors[t].optimizer for t in group if t not in offloaded)


@dataclass(frozen=True)
class SyncFloor:
    """One weight sync's floor: `least` seconds on any devices; where its two tasks are in groups apart
    (`train`, `infer`: their group indices), at least `wan` seconds where the inference group holds a
    device in a region the training group holds none of (the copy crosses a link between regions)."""

    least: float
    wan: float = 0.0
    train: int = -1
    infer: int = -1


def sync_floors(tables, grouping: tuple[Subset, ...]) -> list[SyncFloor]:
    """The grouping's weight syncs (`costmodel/weightsync.py`; evaluate() sums them) at their least. Per sync:
    its host part ≥ (tensors × WEIGHT_SYNC_PER_TENSOR_S × the calibrated factor + the calibrated overhead) ×
    the least host slowdown of any class; its bytes: the inference copy's devices not among the trainer's get
    a pipelined broadcast tree (≥ bytes / the fastest link between any two devices; groups hold disjoint
    devices, so a sync between groups is all broadcast, and a region of the inference group's the trainer's
    hosts are not in is reached over a link between regions: ≥ bytes / the fastest of those), those among
    them a local reshard (≥ LOCAL_RESHARD_PASSES × bytes / the fastest HBM) and, for the actor, the colocated
    refit's host work; in one group either may happen, so the less of the two."""
    from hetrl_cli.artifacts.rl import SYNCED, sync_roles
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.costmodel.memory import weight_bytes_per_param
    from hetrl_cli.costmodel.weightsync import WeightSync

    cm, cluster = tables.cm, tables.cm.cluster
    group_of = {t: j for j, g in enumerate(grouping) for t in g}
    hosts = sorted({cluster.host_of(d) for c in tables.classes for host in c.devices for d in host})
    links = cluster.links
    pairs = list(itertools.combinations(hosts, 2))
    fastest = max([links.intra(h).bandwidth_Bps for h in hosts] + [links.between(a, b).bandwidth_Bps for a, b in pairs])
    crossing = [links.between(a, b) for a, b in pairs if links.region(a) != links.region(b)]
    fastest_wan = max((link.bandwidth_Bps for link in crossing), default=0.0)
    wan_latency = min((link.latency_s for link in crossing), default=0.0)
    fastest_hbm = max(c.mem_Bps for c in cluster.classes)
    least_scale = min(cluster.slowest([k]) for k in range(len(cluster.classes)))
    factor = cm.overhead_factor.get("weight_sync", 1.0)
    fixed = cm.task_overhead_s.get("weight_sync", 0.0)
    out = []
    for role, apart in sync_roles(group_of):
        train_task, infer_task = SYNCED[role]
        arch = cm.step.arch.get(train_task) or cm.step.arch.get(infer_task)
        if arch is None:
            continue
        head = HEAD[train_task]
        nbytes = arch.param_count(head) * weight_bytes_per_param(cm.step.workload)
        tensors = arch.tensor_count(head)
        base = (tensors * C.WEIGHT_SYNC_PER_TENSOR_S * factor + fixed) * least_scale
        remote = nbytes / fastest
        if apart:
            wan = base + wan_latency + nbytes / fastest_wan if fastest_wan > 0 else 0.0
            out.append(SyncFloor(base + remote, wan, group_of[train_task], group_of[infer_task]))
            continue
        refit = WeightSync.colocated_refit_s(tensors) * factor * least_scale if role == "actor" else 0.0
        out.append(SyncFloor(base + min(remote, C.LOCAL_RESHARD_PASSES * nbytes / fastest_hbm + refit)))
    return out


def sync_floor(tables, grouping: tuple[Subset, ...]) -> float:
    """The least seconds of the grouping's weight syncs on any devices (`sync_floors`, regions aside)."""
    return sum(f.least for f in sync_floors(tables, grouping))


def compose_floor(
    tables, grouping: tuple[Subset, ...], task_s: list[dict[TaskName, float]], weight_sync: float = 0.0
) -> float:
    """The iteration from per-group task floors: phase spans (with the planner's floors), the weight syncs'
    floor `weight_sync` (`sync_floor`), no transfers (≥ 0)."""
    from hetrl_cli.planner.tables import PHASE_OF

    spans = []
    for i, floor in enumerate(tables.floor):
        held = [sum(s for t, s in ts.items() if PHASE_OF[t] == i) for g, ts in zip(grouping, task_s, strict=True)
                if any(PHASE_OF[t] == i for t in g)]  # fmt: skip
        spans.append(span(held, floor))
    return iteration_s(spans, (0.0, 0.0), weight_sync, overlaps(tables.workload.mode, grouping))


def cheap_bound(tables, floors: dict[TaskName, TaskFloor], grouping: tuple[Subset, ...]) -> float:
    """A grouping's bound with every group free to take every device (capacity ignored)."""
    all_counts = [c.size for c in tables.classes]
    task_s = [{t: _cheap(floors[t], all_counts) for t in g} for g in grouping]
    return compose_floor(tables, grouping, task_s, sync_floor(tables, grouping))


class _CutModel:
    """One grouping's relaxation as an LP for HiGHS: device counts per (group, class) (continuous: a relaxation
    of the integer counts, which bounded 0-0.4 % higher on the uneven suite at 100x the time), each floor's
    convex ratios under tangent cuts (module docstring), the phase spans and the composition's lanes."""

    def __init__(
        self, tables, floors: dict[TaskName, TaskFloor], grouping: tuple[Subset, ...], integer: bool = False
    ) -> None:
        from hetrl_cli.costmodel import constants as C
        from hetrl_cli.planner.ilp import _Lp
        from hetrl_cli.planner.tables import PHASE_OF

        self.lp = lp = _Lp()
        self.integer_presence = integer
        self.caps = caps = [c.size for c in tables.classes]
        self.n = [[lp.var(0.0, float(cap)) for cap in caps] for _ in grouping]
        self.cuts: list[tuple[int, Ratio, list[int]]] = []  # (epigraph column, ratio, count columns)
        self.pending: list[tuple[dict[int, float], float, float]] = []
        z = [lp.var() for _ in PHASES]
        self.T = lp.var()
        for k, cap in enumerate(caps):
            lp.row({self.n[j][k]: 1.0 for j in range(len(grouping))}, upper=cap)
        usable = [c.memory_bytes * max(C.GEN_MEMORY_UTILIZATION, C.USABLE_MEMORY_FRACTION) for c in tables.classes]
        for j, group in enumerate(grouping):
            lp.row({col: 1.0 for col in self.n[j]}, lower=1.0)
            per_phase: dict[int, dict[int, float]] = {}
            self._memory(floors, group, j, usable, caps, per_phase)
            present = None
            const: dict[int, float] = {}
            for task in group:
                fl = floors[task]
                w = lp.var()
                if any(fl.per_class) or fl.spread:
                    if present is None:  # present[k] ≥ n[j][k] / cap: 1 where the group holds all of class k
                        # (binary where a TP coupling reads it: the least TP of the classes held)
                        coupled = integer and any(floors[t].tp_of is not None or floors[t].spread for t in group)
                        present = [lp.var(0.0, 1.0, integer=coupled) for _ in caps]
                        for k, cap in enumerate(caps):
                            lp.row({self.n[j][k]: 1.0, present[k]: -float(cap)}, upper=0.0)
                    self._tails(w, fl, present)
                    if fl.wan_grad and len(set(fl.regions)) > 1:
                        per_phase.setdefault(PHASE_OF[task], {})[self._spread_layout(j, w, fl, present)] = 1.0
                for ratio in fl.ratios:
                    lp.row({w: 1.0, self._epigraph(ratio, j, caps): -1.0}, lower=0.0)
                for parts, extra in fl.sums:
                    lp.row({w: 1.0, **{self._epigraph(r, j, caps): -1.0 for r in parts}}, lower=extra)
                i = PHASE_OF[task]
                terms = per_phase.setdefault(i, {})
                terms[w] = 1.0
                for ratio in fl.added:
                    terms[self._epigraph(ratio, j, caps)] = 1.0
                const[i] = const.get(i, 0.0) + fl.const
            for i, terms in per_phase.items():
                lp.row({z[i]: 1.0, **{c: -v for c, v in terms.items()}}, lower=const[i])
        for i, floor in enumerate(tables.floor):
            if floor > 0:
                lp.row({z[i]: 1.0}, lower=floor)
        name = dict(zip(SPANS, z, strict=True))
        overlap = overlaps(tables.workload.mode, grouping)
        for lane, scale in zip(lanes(overlap), scales(overlap), strict=True):
            cols = [name[t] for part in lane for t in part if t not in (*BOUNDARIES, WEIGHT_SYNC)]
            lp.row({self.T: 1.0, **{c: -scale for c in cols}}, lower=0.0)
        self._sync_lanes(tables, grouping, name)
        lp.rows.extend(self.pending)
        self.pending = []
        self.h = self._highs()

    def _memory(self, floors, group: Subset, j: int, usable: list[float], caps: list[int], per_phase) -> None:
        """While each task of group j runs, its devices hold its bytes and its mates' resident ones; a trainer's
        optimizer state counts unless offloaded (off_t = 1, binary in the MILP), and an offloaded trainer pays
        its copies: a_t ≥ offload(n_j) − M·(1 − off_t), M its value on one device."""
        from hetrl_cli.planner.tables import PHASE_OF

        lp = self.lp
        trainers = [t for t in group if floors[t].offload is not None]
        off = {t: lp.var(0.0, 1.0, integer=self.integer_presence) for t in trainers}
        for task in group:
            need = memory_need(floors, group, task, ())
            if need > 0:
                held = {col: u for col, u in zip(self.n[j], usable, strict=True)}
                lp.row({**held, **{off[t]: floors[t].optimizer for t in trainers}}, lower=need)
        for t in trainers:
            ratio = floors[t].offload
            assert ratio is not None
            most = ratio.work / min(r for r in ratio.rate)
            a = lp.var()
            lp.row({a: 1.0, self._epigraph(ratio, j, caps): -1.0, off[t]: -most}, lower=-most)
            per_phase.setdefault(PHASE_OF[t], {})[a] = 1.0

    def _sync_lanes(self, tables, grouping: tuple[Subset, ...], name: dict[str, int]) -> None:
        """Each lane with a weight sync once more, the syncs at their floor (`sync_floors`): T ≥ its factor ×
        (its spans + the syncs). A sync between groups pays its `wan` floor where the inference group holds a
        region the training group does not: reach[j][r] ≥ n[j][k] / cap_k (binary in the MILP) for the
        inference group, held[j][r] ≤ Σ_{k in r} n[j][k] for the training group (0 where it holds no device
        there: counts are integers), s ≥ wan · (reach − held)."""
        floors = sync_floors(tables, grouping)
        if not any(f.least > 0 or f.wan > 0 for f in floors):
            return
        lp = self.lp
        caps = [c.size for c in tables.classes]
        regions = sorted({c.region for c in tables.classes})
        ws = lp.var()
        terms = {ws: 1.0}
        for f in floors:
            s = lp.var(lower=f.least)
            terms[s] = -1.0
            if f.wan <= f.least or len(regions) < 2:
                continue
            for r in regions:
                members = [k for k, c in enumerate(tables.classes) if c.region == r]
                reach = lp.var(0.0, 1.0, integer=self.integer_presence)
                held = lp.var(0.0, 1.0)
                for k in members:
                    lp.row({reach: 1.0, self.n[f.infer][k]: -1.0 / caps[k]}, lower=0.0)
                lp.row({held: 1.0, **{self.n[f.train][k]: -1.0 for k in members}}, upper=0.0)
                lp.row({s: 1.0, reach: -f.wan, held: f.wan}, lower=0.0)
        lp.row(terms, lower=0.0)  # ws ≥ Σ syncs
        asynchronous = overlaps(tables.workload.mode, grouping)
        for lane, scale in zip(lanes(asynchronous), scales(asynchronous), strict=True):
            syncs = sum(t == WEIGHT_SYNC for part in lane for t in part)
            if syncs:
                cols = [name[t] for part in lane for t in part if t in SPANS]
                lp.row({self.T: 1.0, ws: -scale * syncs, **{c: -scale for c in cols}}, lower=0.0)

    def _spread_layout(self, j: int, w: int, fl: TaskFloor, present: list[int]) -> int:
        """A trainer of group j over two regions or more (`TaskFloor.spread_layout`): a column a ≥ all-reduce ·
        (spread − one) that adds to its time, and w ≥ hops · (spread + one − 1), where spread ≥ held[r] +
        held[r'] − 1 (held[r] ≥ present[k] for k in region r) and one = 1 (DP 1, binary in the MILP) only where
        n ≤ TP · depth for the TP of every class present: Σ n ≤ layout_tp[i]·depth + N·(2 − one − present[i])."""
        lp = self.lp
        held = {r: lp.var(0.0, 1.0, integer=self.integer_presence) for r in sorted(set(fl.regions))}
        for k, r in enumerate(fl.regions):
            lp.row({held[r]: 1.0, present[k]: -1.0}, lower=0.0)
        spread = lp.var(0.0, 1.0, integer=self.integer_presence)
        for a, b in itertools.combinations(held.values(), 2):
            lp.row({spread: 1.0, a: -1.0, b: -1.0}, lower=-1.0)
        one = lp.var(0.0, 1.0, integer=self.integer_presence)
        total = float(sum(self.caps))
        for i, tp in enumerate(fl.layout_tp):
            if tp * fl.depth < total:
                row = {col: 1.0 for col in self.n[j]}
                lp.row({**row, one: total, present[i]: total}, upper=tp * fl.depth + 2 * total)
        added = lp.var()
        least = fl.wan_grad / fl.depth + fl.wan_latency
        lp.row({added: 1.0, spread: -least, one: least}, lower=0.0)
        ones = tuple(1.0 for _ in self.caps)
        for c in sorted({2, *fl.chunk}):  # added ≥ wan_grad·c/n + latency where c/n binds (`allreduce_s`)
            if c < 2 or (c > 2 and c not in fl.chunk):
                continue
            e = self._epigraph(Ratio(fl.wan_grad * c, ones), j, self.caps)
            most = fl.wan_grad * c + fl.wan_latency  # the term at n = 1: the row is idle where switched off
            switches = [[]] if c == 2 else [[present[k]] for k, ck in enumerate(fl.chunk) if ck == c]
            for extra in switches:
                off = {spread: -most, one: most, **{col: -most for col in extra}}
                lp.row({added: 1.0, e: -1.0, **off}, lower=fl.wan_latency - most * (1 + len(extra)))
        lp.row({w: 1.0, spread: -fl.hops, one: -fl.hops}, lower=-fl.hops)
        return added

    def _tails(self, w: int, fl: TaskFloor, present: list[int]) -> None:
        """w ≥ per_class[k] where class k is present; with a TP coupling, w ≥ per_class[k]·tp_of[k]/tp_of[i]
        where classes k and i are both present (tp_of[i] < tp_of[k]); w ≥ spread where two classes of
        different regions are."""
        lp = self.lp
        if fl.spread:
            for k, i in itertools.combinations(range(len(present)), 2):
                if fl.regions[k] != fl.regions[i]:
                    lp.row({w: 1.0, present[k]: -fl.spread, present[i]: -fl.spread}, lower=-fl.spread)
        for k, g in enumerate(fl.per_class):
            if g <= 0:
                continue
            lp.row({w: 1.0, present[k]: -g}, lower=0.0)
            if fl.tp_of is None:
                continue
            for i, tp in enumerate(fl.tp_of):
                if tp < fl.tp_of[k]:
                    scaled = g * fl.tp_of[k] / tp
                    lp.row({w: 1.0, present[k]: -scaled, present[i]: -scaled}, lower=-scaled)

    def _highs(self):
        import highspy
        import numpy as np

        from hetrl_cli.planner.ilp import _inf, _quiet_highs

        lp, inf = self.lp, highspy.kHighsInf
        h = _quiet_highs(highspy)
        h.setOptionValue("threads", 1)
        h.setOptionValue("mip_rel_gap", MIP_GAP)
        n = len(lp.lower)
        h.addVars(n, np.array([_inf(v, inf) for v in lp.lower]), np.array([_inf(v, inf) for v in lp.upper]))
        h.changeColCost(self.T, 1.0)
        ints = np.array([i for i in range(n) if lp.integer[i]], dtype=np.int32)
        if len(ints):
            h.changeColsIntegrality(len(ints), ints, np.array([highspy.HighsVarType.kInteger] * len(ints)))
        self.integer = bool(len(ints))
        self._add_rows(h, lp.rows)
        return h

    @staticmethod
    def _add_rows(h, rows) -> None:
        import highspy
        import numpy as np

        from hetrl_cli.planner.ilp import _inf

        inf = highspy.kHighsInf
        starts, index, value = [], [], []
        for expr, _, _ in rows:
            starts.append(len(index))
            for col, coef in expr.items():
                if coef != 0.0:
                    index.append(col)
                    value.append(coef)
        h.addRows(
            len(rows),
            np.array([_inf(r[1], inf) for r in rows]),
            np.array([_inf(r[2], inf) for r in rows]),
            len(index),
            np.array(starts, dtype=np.int32),
            np.array(index, dtype=np.int32),
            np.array(value),
        )

    def _epigraph(self, ratio: Ratio, j: int, caps: list[int]) -> int:
        """A column e ≥ ratio.work / L(n_j), with tangents at the whole cluster and halvings of it."""
        e = self.lp.var()
        cols = self.n[j]
        self.cuts.append((e, ratio, cols))
        point = sum(c * r for c, r in zip(caps, ratio.rate, strict=True))
        least = min((r for r in ratio.rate if r > 0), default=0.0)
        while point >= least > 0:
            self._tangent(e, ratio, cols, point)
            point /= 2
        return e

    def _tangent(self, e: int, ratio: Ratio, cols: list[int], at: float) -> None:
        """e ≥ 2A/L0 − A·L/L0² (the tangent of A/L at L0; A/L is convex for L > 0)."""
        slope = ratio.work / (at * at)
        expr = {e: 1.0, **{c: slope * r for c, r in zip(cols, ratio.rate, strict=True) if r}}
        self.pending.append((expr, 2 * ratio.work / at, math.inf))

    def solve(self, seconds: float, cutoff: float = math.inf) -> tuple[float | None, list[float] | None]:
        """(this LP's optimum, a lower bound; its column values) within `seconds`; (None, None) without. A MILP
        with a finite `cutoff` prunes every node whose bound reaches it: none left below it (HiGHS: infeasible)
        proves the optimum ≥ the cutoff, so (cutoff, None) — what a grouping needs to be passed over, fast."""
        import highspy

        h = self.h
        h.setOptionValue("time_limit", max(0.05, seconds))
        if self.integer and math.isfinite(cutoff):
            h.setOptionValue("objective_bound", cutoff)
        h.run()
        info = h.getInfo()
        if self.integer and math.isfinite(cutoff) and h.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return cutoff * (1 - CUTOFF_SLACK), None
        if info.primal_solution_status != 2:  # no solution: no cut point (a time limit)
            return None, None
        if self.integer:  # the MIP's proven bound (≤ its optimum under HiGHS's gap)
            bound = min(float(info.mip_dual_bound), cutoff)
        elif h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            bound = float(info.objective_function_value)
        else:
            return None, None
        return bound, list(h.getSolution().col_value)

    def refine(self, values: list[float]) -> int:
        """Tangents at the solution where a ratio is under-estimated; how many were added."""
        for e, ratio, cols in self.cuts:
            at = sum(values[c] * r for c, r in zip(cols, ratio.rate, strict=True))
            if at > 0 and ratio.work / at > values[e] * (1 + CUT_TOLERANCE) + 1e-12:
                self._tangent(e, ratio, cols, at)
        added, self.pending = self.pending, []
        if added:
            self._add_rows(self.h, added)
        return len(added)


def grouping_bound(
    tables,
    floors,
    grouping: tuple[Subset, ...],
    deadline: float,
    stop_at: float = math.inf,
    integer: bool = False,
    start: list[list[float]] | None = None,
) -> tuple[float, list[list[float]] | None]:
    """A lower bound on every plan of `grouping` and the relaxation's device counts per (group, class) (None
    where no LP was solved): Kelley rounds of `_CutModel` until no cut is violated or none gains, its bound
    reaches `stop_at`, CUT_ROUNDS, or the `deadline` (time.monotonic()); at least the cheap bound. `start`:
    device counts (the LP's) whose tangents the model gets first (fewer MILP rounds)."""
    best = cheap_bound(tables, floors, grouping)
    if best >= stop_at:
        return best, None
    model = _CutModel(tables, floors, grouping, integer)
    if start is not None:  # every epigraph's tangent at these counts (an epigraph at 0 violates each)
        values = [0.0] * len(model.lp.lower)
        for cols, row in zip(model.n, start, strict=True):
            for col, v in zip(cols, row, strict=True):
                values[col] = v
        model.refine(values)
    counts, previous = start, -math.inf
    for _ in range(CUT_ROUNDS):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        bound, values = model.solve(left, stop_at)
        if bound is not None:
            best = max(best, bound)
        if bound is None or values is None:
            break
        counts = [[values[c] for c in cols] for cols in model.n]
        gained, previous = bound > previous * (1 + 1e-3), bound
        if best >= stop_at or model.refine(values) == 0 or not gained:
            break
    return best, counts


@dataclass
class SpaceBound:
    """The bound over every grouping (least of the groupings' bounds, at most the incumbent)."""

    bound: float
    per_grouping: dict[tuple[Subset, ...], float]
    refined: int
    """Groupings whose LP was solved (the rest: their cheap bound)."""
    complete: bool
    """Every grouping whose cheap bound was below the answer had its LP solved."""
    counts: dict[tuple[Subset, ...], list[list[float]]]
    """The relaxation's devices per (group, class) of each refined grouping (where the lazy ILP looks)."""


def space_bound(tables, deadline: float, incumbent: float | None = None) -> SpaceBound:
    """The least grouping bound. Groupings in increasing cheap bound get their LP (continuous presence) until
    the `deadline`; then, in increasing LP bound, the MILP with binary presence (the TP coupling binds
    there) while time is left; each MILP prunes at the least bound so far (`_CutModel.solve`'s cutoff), so a
    grouping that cannot go below it is passed over fast. A grouping whose bound so far is at least the least
    refined one (or the incumbent) cannot lower it, so each pass stops there. Valid at any point: a grouping
    counts with the best bound it got (cheap, LP or MILP)."""
    from hetrl_cli.planner.space import groupings

    floors = task_floors(tables)
    best = {g: cheap_bound(tables, floors, g) for g in groupings(tables.tasks)}
    cap = math.inf if incumbent is None else incumbent
    counts: dict[tuple[Subset, ...], list[list[float]]] = {}
    refined: set[tuple[Subset, ...]] = set()
    complete = True
    for integer in (False, True):
        order = sorted(best, key=best.__getitem__)
        low = cap  # the least bound this pass refined: groupings from a larger one on cannot go below it
        for g in order:
            if best[g] >= low:
                break
            if time.monotonic() >= deadline:
                complete = complete and integer
                break
            start = counts.get(g) if integer else None
            value, solution = grouping_bound(tables, floors, g, deadline, low, integer, start)
            best[g] = max(best[g], value)
            refined.add(g)
            if solution is not None:
                counts[g] = solution
            low = min(low, best[g])
    bound = min(cap, min(best.values(), default=math.inf)) * (1 - 1e-9)  # float slack: a floor may equal a time
    return SpaceBound(bound, {g: best[g] for g in refined}, len(refined), complete, counts)
