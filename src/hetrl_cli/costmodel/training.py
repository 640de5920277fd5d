"""What a training task adds to its slowest replica's passes: the DP gradient all-reduce (hierarchical, as
NCCL does across nodes), the optimizer step (memory-traffic bound) and, with offload, the optimizer state's
copies to and from host memory (docs/costmodel.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetrl_cli.artifacts.rl import HEAD, Algorithm, TaskName, separate_old_logprob_pass
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import ArchSpec
from hetrl_cli.costmodel.comm import allgather_s, allreduce_s, reduce_scatter_s
from hetrl_cli.costmodel.devices import ClassLayout, Cluster, Stage
from hetrl_cli.costmodel.memory import (
    grad_bytes_per_param,
    optimizer_bytes_per_param,
    optimizer_step_traffic_bytes_per_param,
)
from hetrl_cli.costmodel.step import Step


def add_train_sync(
    step: Step,
    cluster: Cluster,
    task: TaskName,
    rep_key: ClassLayout,
    stages: Sequence[tuple[Stage, ...]],
    splits: Sequence[Sequence[int]],
    terms: dict[str, float],
    links: dict[str, str],
    offload: bool,
    shares: Sequence[float] = (),
) -> None:
    """Add the DP gradient sync, the optimizer step and optimizer offload copies to `terms` (and the
    all-reduce's bottleneck link to `links`). `shares`: the replicas' batch shares (zero3 gathers once per
    micro-batch of the largest share)."""
    w = step.workload
    arch = step.arch[task]
    head = HEAD[task]
    dp = len(rep_key)
    epochs = w.ppo_epochs
    if dp > 1:
        dp_s, label = dp_allreduce(cluster, rep_key, arch.param_count(head) * grad_bytes_per_param(w))
        terms["dp_allreduce"] = epochs * dp_s
        if w.sharding == "zero3":
            most = max(shares, default=1.0 / dp) / (sum(shares) or 1.0)
            micro_batches = max(1, math.ceil(most * step.n_samples / w.micro_batch - 1e-9))
            passes = Zero3Passes.of(micro_batches, epochs, zero3_forward_passes(task, w.algorithm, epochs))
            terms["dp_allreduce"] = zero3_comm_s(cluster, rep_key, arch, head, grad_bytes_per_param(w), passes)
        links["dp_allreduce"] = label
    shard = dp if (w.sharding != "none" and dp > 1) else 1
    traffic = optimizer_step_traffic_bytes_per_param(w)
    opt_s, off_s = 0.0, 0.0
    for r, rep in enumerate(stages):
        for p, st in enumerate(rep):
            params_dev = step.stage_params(arch, head, splits[r], p) / st.tp / shard
            opt_s = max(opt_s, params_dev * traffic / st.opt_Bps)
            if offload:
                off_s = max(off_s, 2 * params_dev * optimizer_bytes_per_param(w) / C.HOST_DEVICE_Bps)
    terms["optimizer"] = epochs * opt_s
    if offload:
        terms["offload"] = off_s


def critic_sync_receivers(
    infer: Sequence[tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]],
    train: Sequence[tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]],
    zero3: bool,
) -> tuple[str, ...]:
    """The devices of critic inference in critic_train's group that run on a copy of their own, so that the
    critic sync sends them the weights; the rest run on the trainer's weights (runtime/weightsync.
    critic_shared_ranks, which worker._critic_shared and the sync group follow). `infer` and `train` are each
    replica's (devices by stage, layer split). An inference replica laid out as one of the trainer's shares; under
    zero3 (critic_train sharded over dp > 1) all share when every replica of both is the same, in order, else
    none does."""
    if zero3:
        return () if list(infer) == list(train) else tuple(d for rep, _ in infer for st in rep for d in st)
    return tuple(d for rep, split in infer if (rep, split) not in train for st in rep for d in st)


def add_zero3_inference_gathers(
    step: Step,
    cluster: Cluster,
    task: TaskName,
    rep_key: ClassLayout,
    terms: dict[str, float],
    links: dict[str, str],
    names: frozenset[str],
    shares: Sequence[float],
) -> None:
    """Critic inference beside critic_train runs on the trainer's weights (memory.py; worker._critic_shared) when
    their layouts match (`critic_sync_receivers` finds none; Tasks.estimate drops critic_train from `names`
    otherwise), which
    under zero3 are chunks: its value forward (roles.Critic.values -> zero3.forward_passes) gathers each layer once
    per micro-batch of the largest replica's share and the root unit once (Zero3Passes.of(m, 0, 1)), over the
    critic's ZeRO group (its replicas)."""
    w = step.workload
    dp = len(rep_key)
    if task != "critic_inference" or "critic_train" not in names or w.sharding != "zero3" or dp <= 1:
        return
    most = max(shares, default=1.0 / dp) / (sum(shares) or 1.0)
    micro_batches = max(1, math.ceil(most * step.n_samples / w.micro_batch - 1e-9))
    arch = step.arch[task]
    passes = Zero3Passes.of(micro_batches, 0, 1)
    grad_bytes = grad_bytes_per_param(w)
    terms["dp_allreduce"] = zero3_comm_s(cluster, rep_key, arch, HEAD[task], grad_bytes, passes)
    links["dp_allreduce"] = dp_allreduce(cluster, rep_key, arch.param_count(HEAD[task]) * grad_bytes)[1]


@dataclass(frozen=True)
class Zero3Passes:
    """How many times one update moves each ZeRO-3 unit whole (an all-gather or a reduce-scatter of its full
    size, half an all-reduce each), as runtime/zero3.py runs it, for every replica the largest replica's
    `micro_batches` (dummy micro-batches pad the others):
    - a training pass (one per epoch) gathers each decoder layer for its forward and again for its backward and
      reduce-scatters its gradient, per micro-batch (3 x the layers: ZERO3_COMM_FACTOR all-reduces); the root
      unit (embedding, final norm, head) is gathered once for the pass and reduce-scattered once after it;
    - a forward-only pass on the trained weights (the actor's old log-probs when the runtime computes them:
      `zero3_forward_passes`) gathers each layer once per micro-batch and the root once.
    Activation recomputation adds none: the backward's gather serves the recomputed forward (non-reentrant
    checkpointing calls the layer's forward without its module hooks)."""

    layers: int
    root: int

    @classmethod
    def of(cls, micro_batches: int, epochs: int, forward_passes: int) -> Zero3Passes:
        train_layers = round(2 * C.ZERO3_COMM_FACTOR)  # gathered forward + backward, reduce-scattered
        return cls(layers=micro_batches * (epochs * train_layers + forward_passes), root=2 * epochs + forward_passes)


def zero3_forward_passes(task: TaskName, algorithm: Algorithm, epochs: int) -> int:
    """Forward-only passes of a training task on its zero3 weights per update: the actor's old log-probs, unless
    one update per batch with the KL in the loss lets the update's own forward give them (roles.Actor
    .reuses_old_logprobs)."""
    return 1 if task == "actor_train" and separate_old_logprob_pass(algorithm, epochs) else 0


def zero3_step_bytes(arch: ArchSpec, head: str, bytes_per_param: int, passes: Zero3Passes) -> float:
    """Full-unit bytes one rank's ZeRO group all-gathers plus reduce-scatters in one update (unsharded by TP/PP)."""
    layers = arch.num_layers * arch.layer_params * bytes_per_param
    root = arch.param_count(head) * bytes_per_param - layers
    return passes.layers * layers + passes.root * root


def zero3_comm_s(
    cluster: Cluster, rep_key: ClassLayout, arch: ArchSpec, head: str, grad_bytes: int, passes: Zero3Passes
) -> float:
    """One update's ZeRO-3 traffic (Zero3Passes): each whole-unit gather or reduce-scatter costs half of a DP
    all-reduce of the unit's bytes."""
    layers = arch.num_layers * arch.layer_params * grad_bytes
    layers_s, _ = dp_allreduce(cluster, rep_key, layers)
    root_s, _ = dp_allreduce(cluster, rep_key, arch.param_count(head) * grad_bytes - layers)
    return 0.5 * (passes.layers * layers_s + passes.root * root_s)


def dp_allreduce(cluster: Cluster, rep_key: ClassLayout, grad_bytes: float) -> tuple[float, str]:
    """Hierarchical gradient all-reduce (as NCCL does across nodes): replicas on one host reduce-scatter
    and all-gather over the intra link; one copy of each host's shards all-reduces over a ring across
    hosts, which crosses the ring's bottleneck (a host holding a full replica moves all G bytes)."""
    tp, pp = len(rep_key[0][0]), len(rep_key[0])
    shards = tp * pp
    shard_bytes = grad_bytes / shards
    per_host: dict[str, dict[tuple[int, int], int]] = {}
    for rep in rep_key:
        for p, st in enumerate(rep):
            for t, c in enumerate(st):
                host = cluster.classes[c].host
                d = per_host.setdefault(host, {})
                d[(p, t)] = d.get((p, t), 0) + 1
    intra_s, intra_label = 0.0, ""
    for host, counts in per_host.items():
        n = max(counts.values())
        if n > 1:
            link = cluster.links.intra(host)
            s = reduce_scatter_s(shard_bytes, n, link) + allgather_s(shard_bytes, n, link)
            if s > intra_s:
                intra_s, intra_label = s, link.label
    inter_s, label = 0.0, intra_label
    if len(per_host) > 1:
        ring = cluster.links.ring(frozenset(per_host))
        frac = max(len(c) for c in per_host.values()) / shards
        inter_s = allreduce_s(grad_bytes * frac, len(per_host), ring)
        label = ring.label
    return intra_s + inter_s, label
