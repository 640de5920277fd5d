"""What a training task adds to its slowest replica's passes: the DP gradient all-reduce (hierarchical, as
NCCL does across nodes), the optimizer step (memory-traffic bound) and, with offload, the optimizer state's
copies to and from host memory (docs/costmodel.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetrl_cli.artifacts.rl import HEAD, TaskName
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
        if w.sharding == "zero3":
            most = max(shares, default=1.0 / dp) / (sum(shares) or 1.0)
            micro_batches = max(1, math.ceil(most * step.n_samples / w.micro_batch - 1e-9))
            dp_s = zero3_comm_s(cluster, rep_key, arch, head, grad_bytes_per_param(w), micro_batches)
        terms["dp_allreduce"] = epochs * dp_s
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


def zero3_comm_s(
    cluster: Cluster, rep_key: ClassLayout, arch: ArchSpec, head: str, grad_bytes: int, micro_batches: int
) -> float:
    """One update's ZeRO-3 traffic as runtime/zero3.py moves it: every micro-batch gathers each decoder layer
    for its forward and again for its backward and reduce-scatters its gradient (3 x the layers' bytes, i.e.
    ZERO3_COMM_FACTOR all-reduces), and the rest of the model (embedding, norm, head) is gathered once per pass and
    reduce-scattered once (one all-reduce). All replicas run the largest replica's micro-batch count."""
    layers = arch.num_layers * arch.layer_params * grad_bytes
    layers_s, _ = dp_allreduce(cluster, rep_key, layers)
    root_s, _ = dp_allreduce(cluster, rep_key, arch.param_count(head) * grad_bytes - layers)
    return micro_batches * C.ZERO3_COMM_FACTOR * layers_s + root_s


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
