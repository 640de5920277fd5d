"""Moving weights and data between a plan's groups: the weight syncs (trained weights to their inference
copy, once per step) and the hand-overs of rollouts and experience between groups (docs/costmodel.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from hetrl_cli.artifacts.rl import HEAD, PHASES, SYNCED, TaskName, sync_roles
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.comm import LinkInfo, allgather_s, p2p_s
from hetrl_cli.costmodel.devices import Cluster
from hetrl_cli.costmodel.memo import Memo
from hetrl_cli.costmodel.memory import weight_bytes_per_param
from hetrl_cli.costmodel.step import Step
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

T = TypeVar("T", bound=Hashable)
Transfer = tuple[str, str, str, float]
"""(name, src group, dst group, bytes or seconds)."""

# ---- the colocated refit (generation shares devices with actor_train) -------------------------------------------
SLEEP_WAKE_S = 0.3
"""One sleep and one wake of a colocated engine per step, per call pair: after its rollout the engine unmaps its
weight and KV-cache memory (level 2: nothing is copied, the trainer's weights replace them) and maps it again
before the next. vLLM's sleep-mode write-up measures a wake at ~0.1-0.4 s ("Zero-Reload Model Switching with vLLM
Sleep Mode", blog.vllm.ai, 2025-10-03: A4000, Qwen3-0.6B and Phi-3-vision, level 1); the runtime pays one of each
per step (runtime/engines/duty.py)."""
COLOCATED_LOAD_PER_TENSOR_S = 1.7e-3
"""Per parameter tensor of a colocated refit: the trainer's shard gathered to a full tensor and handed to the
engine's own `load_weights` (vLLM's per-parameter weight loader, qkv/gate-up fusion, post-processing). verl PR #116
(github.com/volcengine/verl/pull/116, 2025-01-18) measured the in-process FSDP -> vLLM sync on 8x L20, TP 4:
Llama-3-8B 0.57 s (291 tensors), Qwen2.5-7B 0.55 s (339); the bytes alone (two passes at the L20's 864 GB/s) are
0.04 s, the rest is 1.5-1.8 ms a tensor. A remote sync's buckets pay WEIGHT_SYNC_PER_TENSOR_S instead (its loader
runs while later buckets are on the wire)."""


def host_feeds(leaders: Sequence[T], receivers: Sequence[T], host_of: Callable[[T], str]) -> dict[T, list[T]]:
    """Which training replica's leader sends an in-group weight sync to each receiver: `leaders` in replica order
    (replica 0's first). A receiver on a host where another replica's leader is (the first such) gets the weights
    from that leader, which gathered its own replica's identical copy, so no full copy crosses a host boundary;
    every other receiver (replica 0's leader's host, hosts with no replica leader) from replica 0's leader, over
    the relay chain as before. Shared by the runtime (runtime/weightsync.feed_specs) and the cost model (parts())."""
    main = leaders[0]
    feeder_of_host: dict[str, T] = {}
    for lead in leaders[1:]:
        feeder_of_host.setdefault(host_of(lead), lead)
    feeder_of_host[host_of(main)] = main
    out: dict[T, list[T]] = {main: []}
    for r in receivers:
        out.setdefault(feeder_of_host.get(host_of(r), main), []).append(r)
    return out


class WeightSync:
    """Weight syncs and data transfers between device sets of one cluster and workload."""

    def __init__(
        self,
        step: Step,
        cluster: Cluster,
        task_overhead_s: dict[str, float],
        overhead_factor: dict[str, float],
        leader_loads: bool = True,
    ) -> None:
        self.step = step
        self.cluster = cluster
        self.task_overhead_s = task_overhead_s
        self.overhead_factor = overhead_factor
        self.sync: Memo[tuple[float, str, float]] = Memo(self._make_sync)
        """sync(train devices, inference devices, role[, in-place receivers]) → (seconds, the bottleneck's label,
        the per-tensor host part of the seconds)."""
        self.leader_loads = leader_loads
        self.gathers: Memo[float] = Memo(self._make_gather)
        """gathers(role, one training replica) → seconds of its gather onto its leader (gather_s)."""
        """Whether a generation replica's first device alone takes the weights (vLLM-like engine: the cost model's
        default); False for the hf engine, whose every TP rank receives them (runtime/weightsync.engine_followers)."""

    # ---- weight syncs -----------------------------------------------------------------------------------
    def _make_sync(
        self,
        train: tuple[str, ...],
        gen: tuple[str, ...],
        role: str,
        in_place: tuple[str, ...] | None = None,
        feeders: tuple[str, ...] = (),
        gathers: tuple[tuple[str, float], ...] = (),
    ) -> tuple[float, str, float]:
        """The slower of the local reshard and the remote copies, plus the host part (parts())."""
        parts = self.parts(train, gen, role, in_place, feeders, gathers)
        if parts is None:
            return 0.0, "", 0.0
        local_s, remote_s, label, tensors_s, host_s = parts
        return max(local_s, remote_s) + host_s, label, tensors_s

    def parts(
        self,
        train: Sequence[str],
        gen: Sequence[str],
        role: str,
        in_place: Sequence[str] | None = None,
        feeders: Sequence[str] = (),
        gathers: Sequence[tuple[str, float]] = (),
    ) -> tuple[float, float, str, float, float] | None:
        """(local reshard seconds, remote copy seconds, the remote bottleneck's label or "local reshard",
        the per-tensor host seconds, all host seconds) of one weight sync; None when it moves nothing.

        Colocated devices: a local reshard (LOCAL_RESHARD_PASSES over HBM).
        Other devices: a pipelined broadcast tree over regions (broadcast_tree_s).
        The critic's sync inside critic_train's group (its receivers are trainer devices: syncs()) has no engine
        to reshard into: the trainer's leader relays the full weights to each other receiver over the profile's
        links (a broadcast tree from the leader's host alone: intra-host links, then hosts), and only the leader's
        own copy is a local one (runtime/weightsync.sync_group over Layout.sync_chain); `feeders` (the other
        training replicas' leaders: `feeders()`) each feed the receivers on their own host instead, in parallel
        (host_feeds: no full copy crosses that host's boundary), loading their own copy in place. The actor's
        sync inside actor_train's group where the runtime relays too (`in_place` given: actor_relay()) is priced
        the same way, `in_place` (the leader's own copy, one-rank replicas beside one-rank generation) loading in place.
        Under ZeRO-3 an all-gather of the chunks comes first, once (in the local part if there is one, else in the
        remote part; in both where the leader relays inside the group: its relay starts after the gather): the
        runtime gathers the full weights for either. `gathers` (source device → seconds: gather_s per replica)
        delays each feeder's relay by its own replica's gather (the local copies by the slowest): group_gathers_s.
        Plus the host part: WEIGHT_SYNC_PER_TENSOR_S per tensor, for the actor's engine on colocated devices its
        refit (colocated_refit_s: one sleep + wake and its loader per tensor), both scaled by the calibrated
        overhead_factor, and the calibrated fixed overhead, all host work at the slowest involved host's speed
        (so calibration fits the refit as the host overhead it is, not as memory bandwidth)."""
        cluster = self.cluster
        train_task, infer_task = SYNCED[role]
        head = HEAD[train_task]
        arch = self.step.arch.get(train_task) or self.step.arch.get(infer_task)
        known_t = [d for d in train if d in cluster.device_class]
        known_g = [d for d in gen if d in cluster.device_class]
        if arch is None or not known_t or not known_g:
            return None
        nbytes = arch.param_count(head) * weight_bytes_per_param(self.step.workload)
        tset = set(known_t)
        local = [d for d in known_g if d in tset]
        remote = [d for d in known_g if d not in tset]
        source = known_t
        trees: dict[str, list[str]] = {}  # the relays inside the group: feeder -> the receivers it sends a copy
        if in_place is not None or (role == "critic" and local):  # relayed inside the trainer's group
            source = known_t[:1]  # the trainer's leader relays the weights over links (runtime Layout.sync_chain)
            kept = {source[0], *(in_place or ())}  # the leader's own copy (and self-synced ranks') load in place
            feeds = host_feeds([source[0], *feeders], [d for d in known_g if d not in kept], cluster.host_of)
            kept |= {f for f, fed in feeds.items() if f in fed}  # a feeding leader's own copy: in place too
            trees = {f: [d for d in fed if d not in kept] for f, fed in feeds.items()}
            local = [d for d in known_g if d in kept]
            remote = [d for d in known_g if d not in kept]
        local_s = 0.0
        label = "local reshard"
        gather_s = 0.0  # zero3: the full weights are gathered from the chunks first (Zero3Shard.full_weights)
        if self.step.workload.sharding == "zero3" and len(known_t) > 1:
            hosts = [cluster.host_of(d) for d in known_t]
            multi = frozenset(h for h in hosts if hosts.count(h) > 1)
            gather_s = allgather_s(nbytes, len(known_t), cluster.links.ring(frozenset(hosts), multi))
        waits = dict(gathers)
        if local:
            hbm = min(cluster.classes[cluster.device_class[d]].mem_Bps for d in local)
            local_s = C.LOCAL_RESHARD_PASSES * nbytes / hbm + gather_s + max(waits.values(), default=0.0)
        remote_s = 0.0
        if remote:
            for feeder, fed in (trees or {"": remote}).items():  # the feeders' relays run side by side
                seconds, link = self.broadcast_tree_s([feeder] if feeder else source, fed, nbytes) if fed else (0, "")
                seconds += waits.get(feeder or source[0], 0.0) if fed else 0.0
                if seconds > remote_s:
                    remote_s, label = seconds, link
            if not local or len(source) < len(known_t):  # the relay starts after the leader's gather, too
                remote_s += gather_s
        scale = cluster.overhead_scale((*known_t, *known_g))
        tensors = arch.tensor_count(head)
        per_step = tensors * C.WEIGHT_SYNC_PER_TENSOR_S + (
            self.colocated_refit_s(tensors) if (local or in_place is not None) and role == "actor" else 0.0
        )
        tensors_s = per_step * self.overhead_factor.get("weight_sync", 1.0)
        host_s = (tensors_s + self.task_overhead_s.get("weight_sync", 0.0)) * scale
        return local_s, remote_s, label, tensors_s * scale, host_s

    def gather_s(self, role: str, train: TaskPlacement) -> float:
        """Seconds a sync waits for its source's full weights: replica 0's leader receives its replica's TP shards
        and PP stages from the other members (runtime Shard.full_weights; every sync, colocated or not, starts
        with it; inside a group each feeding replica's own gather delays its own relay: in_group_gather_s). 0
        under ZeRO-3 (parts() prices its all-gather of the chunks)."""
        return self.gathers(role, train.replicas[0]) if train.replicas else 0.0

    def group_gathers_s(
        self,
        group: Sequence[TaskPlacement],
        tasks: Sequence[str],
        critic_receivers: Callable[[TaskPlacement, TaskPlacement], tuple[str, ...]] | None = None,
        actor_beside: bool = True,
    ) -> float:
        """The layout terms of the syncs in this group of placements, `tasks` the plan's: the gathers (gather_s)
        of its trainers (the actor's always; the critic's when critic_inference is apart, or beside it with
        receivers that hold a copy of their own: `critic_receivers`, syncs()) and generation's host hand-off
        (handoff_s). What a plan's weight sync adds to its syncs' seconds (evaluate), and what the planner's group
        option adds (planner/tables.py), so both read one price; there the actor's terms where generation is in
        actor_train's group are in the group's own sync instead (`actor_beside` False:
        Tables.same_group_weight_sync)."""
        by_task = {p.task: p for p in group}
        gen, out = by_task.get("generation"), 0.0
        if gen is not None and "actor_train" not in by_task:
            out += self.handoff_s(gen)
        for role, (train_task, infer_task) in SYNCED.items():
            train = by_task.get(train_task)
            if train is None or infer_task not in tasks:
                continue
            infer = by_task.get(infer_task)
            if infer is None:  # apart: replica 0's gather, then the relay from the training hosts
                out += self.gather_s(role, train)
                continue
            if role == "actor" and not actor_beside:
                continue
            if role == "actor":
                out += self.handoff_s(infer)
                relay = self.actor_relay(train, infer)
                args = (relay[0], *relay[1:]) if relay is not None else (infer.devices,)
            else:
                receivers = critic_receivers(infer, train) if critic_receivers is not None else ()
                if not receivers:  # every critic_inference device runs on the trained critic: no sync at all
                    continue
                feeders = self.feeders(train)
                args = (receivers, *((None, feeders) if feeders else ()))
            out += self.in_group_gather_s(role, train, *args)
        return out

    def in_group_gather_s(
        self,
        role: str,
        train: TaskPlacement,
        gen: Sequence[str],
        in_place: Sequence[str] | None = None,
        feeders: Sequence[str] = (),
    ) -> float:
        """What the gathers add to a sync inside the trainer's group (syncs()' arguments): each feeder's relay
        starts after its own replica's gather (parts()' `gathers`), so the sync is the slowest gather + relay,
        not the slowest gather plus the slowest relay (a replica spread over a slow link may feed a host whose
        relay is short)."""
        by_leader = {rep[0][0]: rep for rep in train.replicas}
        sources = [train.replicas[0][0][0], *(f for f in feeders if f in by_leader)]
        waits = tuple((d, self.gathers(role, by_leader[d])) for d in sources)
        key = (tuple(train.devices), tuple(gen), role, tuple(in_place) if in_place is not None else None)
        return self.sync(*key, tuple(feeders), waits)[0] - self.sync(*key, tuple(feeders))[0]

    def handoff_s(self, gen: TaskPlacement) -> float:
        """Each generation replica's engine takes the actor's weights on the host when a vLLM-like engine runs
        TP > 1 (`leader_loads`; runtime/engines/handoff.py): the leader copies every received byte from its
        device into a shared host buffer, and each of vLLM's TP workers copies its slice from there to its own
        device (in parallel): bytes / HOST_DEVICE_Bps × (1 + 1/TP), bucket by bucket after each arrives (the
        next bucket moves when every member asks for it: comm.WeightChannel.stream), so it adds to the sync. The
        replicas do it side by side: the smallest TP > 1 sets it. At TP 1 the engine maps the bucket on its own
        device (CUDA IPC: no host copy), and the hf engine's every TP rank receives its own copy: 0."""
        tps = [len(rep[0]) for rep in gen.replicas if len(rep) == 1 and len(rep[0]) > 1]
        arch = self.step.arch.get("generation") or self.step.arch.get("actor_train")
        if not self.leader_loads or not tps or arch is None:
            return 0.0
        nbytes = arch.param_count(HEAD["actor_train"]) * weight_bytes_per_param(self.step.workload)
        return nbytes / C.HOST_DEVICE_Bps * (1.0 + 1.0 / min(tps))

    def _make_gather(self, role: str, replica: tuple[tuple[str, ...], ...]) -> float:
        cluster = self.cluster
        if self.step.workload.sharding == "zero3" or any(d not in cluster.device_class for st in replica for d in st):
            return 0.0
        return self.replica_gather_s(role, replica)

    def replica_gather_s(self, role: str, replica: Sequence[Sequence[str]]) -> float:
        """One replica's gather onto its leader (stage 0's first device): the members' bytes
        (replica_gather_bytes), member after member (runtime/gather.Exchange: one point-to-point receive at a
        time), each over its link to the leader."""
        links, host_of = self.cluster.links, self.cluster.host_of
        leader = host_of(replica[0][0])
        seconds = 0.0
        for device, nbytes in self.replica_gather_bytes(role, replica):
            link = links.between(host_of(device), leader)
            seconds += link.latency_s + nbytes / link.bandwidth_Bps
        return seconds

    def replica_gather_bytes(self, role: str, replica: Sequence[Sequence[str]]) -> list[tuple[str, float]]:
        """(member, bytes it sends its leader) of one replica's gather: every member but the leader sends the
        weights it owns, its stage's parameters / TP (a tied embedding once, on the first stage, as the runtime
        holds it: Shard.owned), the layers split evenly over the stages (the gather moves every byte once,
        whatever the split; only the leader's own share depends on it)."""
        arch = self.step.arch.get(SYNCED[role][0]) or self.step.arch.get(SYNCED[role][1])
        if arch is None:
            return []
        head, pp = HEAD[SYNCED[role][0]], len(replica)
        split = [arch.num_layers // pp + (1 if p < arch.num_layers % pp else 0) for p in range(pp)]
        wbytes = weight_bytes_per_param(self.step.workload)
        out = []
        for p, stage in enumerate(replica):
            params = self.step.stage_params(arch, head, split, p)
            if p == pp - 1 and pp > 1 and head == "lm" and arch.tie_embeddings:
                params -= arch.embedding_params  # the runtime's tied head is the first stage's embedding
            out += [(device, params / len(stage) * wbytes) for i, device in enumerate(stage) if p or i]
        return out

    @staticmethod
    def colocated_refit_s(tensors: int) -> float:
        """What a colocated engine pays per step besides the bytes: one sleep + wake (SLEEP_WAKE_S) and the
        engine's loader per tensor (COLOCATED_LOAD_PER_TENSOR_S); parts() adds it to the host part (scaled by the
        calibrated `overhead_factor["weight_sync"]` like the per-tensor broadcast cost, both GPU-engine figures
        a runtime may beat, and by the slowest involved host's speed).
        An 8B model (399 tensors) on H100s: ~1.0 s (published colocated refits: 0.55-0.57 s for the load alone,
        verl PR #116; 3-8 s with a framework's pauses, barriers and trainer offload around it, docs/costmodel.md)."""
        return SLEEP_WAKE_S + tensors * COLOCATED_LOAD_PER_TENSOR_S

    def broadcast_tree_s(self, train: Sequence[str], gen: Sequence[str], nbytes: float) -> tuple[float, str]:
        """Pipelined broadcast tree from the training hosts to the generation devices, region by region.

        Greedy (Prim-like) over regions of generation hosts: each step attaches the region that can get its
        copy soonest from any host already holding the weights (training hosts, or generation hosts fed
        before it — relaying through a fed region avoids a slow direct link), given what that host already
        sends. Inside a region the copy fans out over its hosts' ring and each host's intra link. A region's
        time = Σ latencies on its path + bytes / the narrowest hop (chunks stream through); a host sending
        k copies needs k × bytes / its link. Returns (seconds, label of the narrowest link used)."""
        links = self.cluster.links
        regions: dict[str, dict[str, int]] = {}
        for d in gen:
            cls = self.cluster.classes[self.cluster.device_class[d]]
            hosts = regions.setdefault(cls.region, {})
            hosts[cls.host] = hosts.get(cls.host, 0) + 1
        # host -> (path bandwidth, path latency, narrowest link) for hosts that already have the weights
        have: dict[str, tuple[float, float, LinkInfo | None]] = {
            self.cluster.host_of(d): (math.inf, 0.0, None) for d in train
        }
        uplink: dict[str, float] = {}
        finish, narrowest = 0.0, None
        todo = dict(regions)
        while todo:
            best = None
            for region, hosts in todo.items():
                for src, (bw, lat, narrow) in have.items():
                    link, _, _ = links.best_between(frozenset({src}), frozenset(hosts), nbytes)
                    path_bw = min(bw, link.bandwidth_Bps)
                    t = max(lat + link.latency_s + nbytes / path_bw, uplink.get(src, 0.0) + nbytes / link.bandwidth_Bps)
                    if best is None or t < best[0]:
                        n = link if narrow is None or link.bandwidth_Bps < narrow.bandwidth_Bps else narrow
                        best = (t, region, src, link, path_bw, lat + link.latency_s, n)
            assert best is not None
            _, region, src, link, path_bw, path_lat, narrow = best
            hosts = todo.pop(region)
            uplink[src] = uplink.get(src, 0.0) + nbytes / link.bandwidth_Bps
            fan = [links.ring(frozenset(hosts))] if len(hosts) > 1 else []
            fan += [links.intra(h) for h, n in hosts.items() if n > 1]
            for hop in fan:
                path_lat += hop.latency_s
                if hop.bandwidth_Bps < path_bw:
                    path_bw, narrow = hop.bandwidth_Bps, hop
            finish = max(finish, path_lat + nbytes / path_bw)
            if narrowest is None or (narrow is not None and narrow.bandwidth_Bps < narrowest.bandwidth_Bps):
                narrowest = narrow
            for h in hosts:
                have.setdefault(h, (path_bw, path_lat, narrow))
        finish = max(finish, max(uplink.values(), default=0.0))
        return finish, narrowest.label if narrowest is not None else "local copy"

    def syncs(
        self,
        placements: Sequence[TaskPlacement],
        groups: Sequence[GroupPlacement],
        critic_receivers: Callable[[TaskPlacement, TaskPlacement], tuple[str, ...]] | None = None,
    ) -> list[tuple]:
        """The weight syncs a plan runs each step, as (role, train devices, inference devices), in the runtime's
        order: the actor's always (a local reshard when colocated; where the runtime relays inside the group,
        `actor_relay`, (role, train devices, receivers, in-place receivers)), the critic's when critic_inference
        is in another group than critic_train, and in one group when `critic_receivers(infer, train)` (Tasks: the
        devices that run on a copy of their own, laid out unlike the trainer) names any: then to those alone,
        relayed from the trainer's leader (parts()); the others run on the trainer's own weights."""
        by_task = {p.task: p for p in placements}
        group_of = {t: g.name for g in groups for t in g.tasks if t in by_task}
        out: list[tuple] = []
        for role, apart in sync_roles(group_of):
            train_p, infer_p = by_task[SYNCED[role][0]], by_task[SYNCED[role][1]]
            relay = None if apart or role != "actor" else self.actor_relay(train_p, infer_p)
            out.append((role, train_p.devices, *relay) if relay else (role, train_p.devices, infer_p.devices))
        train, infer = (by_task.get(t) for t in SYNCED["critic"])
        together = train is not None and infer is not None and group_of.get(train.task, 0) == group_of.get(infer.task)
        if critic_receivers is not None and together and (receivers := critic_receivers(infer, train)):
            feeders = self.feeders(train)
            out.append(("critic", train.devices, receivers, *((None, feeders) if feeders else ())))
        return out

    def feeders(self, train: TaskPlacement) -> tuple[str, ...]:
        """The leaders of training replicas 1.. on hosts other than replica 0's leader's, which feed the receivers
        of an in-group sync on their own host (host_feeds; runtime/weightsync.feed_specs): after the optimizer
        step every replica holds the same full weights, each gathered on its leader. Replicas wholly on one host
        first (their gather crosses no host), then in replica order. None under ZeRO-3 (there the full weights
        come from one gather over all replicas' chunks)."""
        if self.step.workload.sharding == "zero3":
            return ()
        cluster = self.cluster
        if any(d not in cluster.device_class for rep in train.replicas for st in rep for d in st):
            return ()
        spread = [len({cluster.host_of(d) for st in rep for d in st}) > 1 for rep in train.replicas]
        order = sorted(range(1, len(train.replicas)), key=lambda i: (spread[i], i))  # whole on one host first
        home = cluster.host_of(train.replicas[0][0][0])
        leaders = [train.replicas[i][0][0] for i in order]
        return tuple(d for d in leaders if cluster.host_of(d) != home)

    def actor_relay(self, train: TaskPlacement, gen: TaskPlacement) -> tuple[tuple[str, ...], ...] | None:
        """(receivers, those loading in place[, feeders: `feeders()`, where any]) of the actor's sync where
        generation shares actor_train's group
        and the runtime relays weights over links (runtime/weightsync.sync_specs, Layout.sync_chain); None where
        every generation device loads in place (each a one-rank replica on a one-rank training replica:
        Layout.self_synced_ranks) or only the leader's own copy would be loaded (then a local reshard).
        Members of the relay: actor_train's leader and every generation device not self-synced, with a
        vLLM-like engine (`leader_loads`: the cost model's default) only each generation replica's first device
        (its TP workers take their slices from it on the host); each member but the leader gets a full copy."""
        solo = {rep[0][0] for rep in train.replicas if len(rep) == 1 and len(rep[0]) == 1}
        self_synced = {r[0][0] for r in gen.replicas if len(r) == 1 and len(r[0]) == 1 and r[0][0] in solo}
        leader = train.replicas[0][0][0]
        loading = [r[0][0] for r in gen.replicas] if self.leader_loads else list(gen.devices)
        relayed = tuple(d for d in loading if d not in self_synced and d != leader)
        if not relayed:
            return None
        feeders = self.feeders(train)  # other replicas' leaders feeding their own hosts (parts()) load in place
        in_place = tuple(d for d in gen.devices if d in self_synced or d == leader or (d in feeders and d in relayed))
        relayed = tuple(d for d in relayed if d not in in_place)
        return ((*in_place, *relayed), in_place, feeders) if feeders else ((*in_place, *relayed), in_place)

    # ---- data between groups ----------------------------------------------------------------------------
    def transfer(self, src: Sequence[str], dst: Sequence[str], nbytes: float) -> tuple[float, str]:
        """Rollouts/experience between groups: α + bytes/β on the best host pair; 0 on the same device set."""
        if nbytes <= 0 or set(src) == set(dst):
            return 0.0, ""
        known = self.cluster.device_class
        sh = frozenset(self.cluster.host_of(d) for d in src if d in known)
        dh = frozenset(self.cluster.host_of(d) for d in dst if d in known)
        if not sh or not dh:
            return 0.0, ""
        link, _, _ = self.cluster.links.best_between(sh, dh, nbytes)
        return p2p_s(nbytes, link), link.label

    def rollout_bytes(self) -> float:
        """Bytes of one step's rollouts (token ids + mask of prompt and response)."""
        return self.step.n_samples * self.step.seq_mean * C.ROLLOUT_BYTES_PER_TOKEN

    def experience_bytes(self, task: TaskName) -> float:
        """Bytes an inference task hands to training: a scalar per response token, or per sample (reward)."""
        if task == "reward":
            return self.step.n_samples * C.REWARD_BYTES_PER_SAMPLE
        return self.step.n_samples * self.step.resp_mean * C.EXPERIENCE_BYTES_PER_TOKEN

    def transfers(self, groups: Sequence[GroupPlacement]) -> list[Transfer]:
        """(name, src group, dst group, bytes) of every data hand-over between different groups; devices are
        not needed. Boundary 1 (after generation): the rollouts go from the generation group to every group
        with a later task, named `transfer:SRC->DST`. Boundary 2 (after inference): each group's inference
        outputs go to every group with a training task, named `transfer:SRC->DST:experience`.
        Each costs transfer(src devices, dst devices, bytes); the iteration adds them all up (they funnel
        through the single controller, as in verl), so the ILP can sum them too."""
        out: list[Transfer] = []
        gen = next((g for g in groups if "generation" in g.tasks), None)
        if gen is not None:
            for g in groups:
                if g is not gen and any(t in PHASES[1] + PHASES[2] for t in g.tasks):
                    out.append((f"transfer:{gen.name}->{g.name}", gen.name, g.name, self.rollout_bytes()))
        trainers = [g for g in groups if any(t in PHASES[2] for t in g.tasks)]
        for src in groups:
            produced = sum(self.experience_bytes(t) for t in src.tasks if t in PHASES[1] and t in self.step.arch)
            if produced <= 0:
                continue
            for dst in trainers:
                if dst is not src:
                    out.append((f"transfer:{src.name}->{dst.name}:experience", src.name, dst.name, produced))
        return out

    def boundary_transfers(self, groups: Sequence[GroupPlacement]) -> list[list[Transfer]]:
        """transfers() priced and split by boundary: [[(name, src, dst, seconds), ...] after phase 1, [...]
        after phase 2]. A boundary costs the sum of its entries."""
        by_name = {g.name: g for g in groups}
        out: list[list[Transfer]] = [[], []]
        for name, src, dst, nbytes in self.transfers(groups):
            seconds = self.transfer(by_name[src].devices, by_name[dst].devices, nbytes)[0]
            out[1 if name.endswith(":experience") else 0].append((name, src, dst, seconds))
        return out
