"""Realistic plans built directly from the pydantic models (the solvers are not needed to test `show`).

- `ppo_plan`: 3 groups on 2 A100 hosts + 1 L4 host; generation spans A100 and L4 (uneven batch shares),
  one A100 left idle, a pipelined actor_train with an uneven layer split.
- `baseline_plan`: the same PPO workload fully colocated on the two A100 hosts (verl-like), 36.5 s.
- `grpo_plan`: GRPO colocated on one A100 host, no bottleneck sentence and no plan-level memory figures,
  so `show` must derive both.
- `uniform_plan(n_hosts)`: two groups over n_hosts × 8 A100 in two regions (64 and 1024 devices).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hetrl_cli.artifacts.plan import (
    Plan,
    PlanCost,
    Replica,
    SolverStats,
    TaskCost,
    TaskGroup,
    TaskPlan,
    TimelineEntry,
)
from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link
from hetrl_cli.artifacts.workload import ModelSpec, Workload

GB = 10**9
A100 = ("NVIDIA A100-SXM4-80GB", 80 * 2**30, 312.0, 2039.0)
L4 = ("NVIDIA L4", 24 * 2**30, 121.0, 300.0)


def make_profile(name: str, hosts: list[tuple[str, str, tuple[str, int, float, float], int]]) -> ClusterProfile:
    """(host, region, device spec, device count) per host; a full mesh of 100 Gb/s links."""
    host_models, devices = [], []
    for host, region, (model, memory, tflops, gbps), count in hosts:
        intra = IntraLink(kind="nvlink", bandwidth_Bps=300e9, latency_s=2e-6, source="catalog")
        host_models.append(Host(name=host, address=host, region=region, intra_link=intra))
        devices += [
            Device(
                id=f"{host}/{i}",
                host=host,
                index=i,
                kind="cuda",
                name=model,
                memory_bytes=memory,
                peak_tflops={"bf16": tflops},
                memory_gbps=gbps,
            )
            for i in range(count)
        ]
    names = [h[0] for h in hosts]
    links = [Link(a=a, b=b, bandwidth_Bps=12.5e9, latency_s=1e-3) for i, a in enumerate(names) for b in names[i + 1 :]]
    profile = ClusterProfile(
        name=name, created_at="2026-01-01T00:00:00Z", method="catalog", hosts=host_models, devices=devices, links=links
    )
    return profile.with_fingerprint()


def replica(devices: list[list[str]], share: float, layers: list[int]) -> Replica:
    return Replica(stages=devices, batch_share=share, layer_split=layers)


def cost(total: float, **terms: float) -> TaskCost:
    return TaskCost(total_s=total, **terms)


def ids(host: str, indices: range | list[int]) -> list[str]:
    return [f"{host}/{i}" for i in indices]


def pairs(devices: list[str]) -> list[list[str]]:
    return [devices[i : i + 2] for i in range(0, len(devices), 2)]


def timeline(*entries: tuple[str, str, float, float]) -> list[TimelineEntry]:
    return [TimelineEntry(name=n, group=g, start_s=s, end_s=e) for n, g, s, e in entries]


@pytest.fixture
def cluster() -> ClusterProfile:
    """2 A100 hosts in us-east-1, 1 L4 host in us-west-2 (20 devices)."""
    return make_profile(
        "lab", [("a100-0", "us-east-1", A100, 8), ("a100-1", "us-east-1", A100, 8), ("l4-0", "us-west-2", L4, 4)]
    )


@pytest.fixture
def ppo_workload() -> Workload:
    return Workload(
        name="ppo-8b",
        algorithm="ppo",
        actor=ModelSpec(arch="qwen3-8b"),
        critic=ModelSpec(arch="qwen3-8b"),
        prompts_per_step=128,
        responses_per_prompt=8,
    )


@pytest.fixture
def ppo_plan(cluster: ClusterProfile, ppo_workload: Workload) -> Plan:
    """The heterogeneous PPO plan: 15.8 s per iteration."""
    rollout = ids("a100-0", range(4)) + ids("l4-0", range(4))
    infer = ids("a100-0", range(4, 7))
    train = ids("a100-1", range(8))
    gen_replicas = [replica([p], s, [36]) for p, s in zip(pairs(rollout), (0.31, 0.31, 0.19, 0.19), strict=True)]
    one_each = [replica([[d]], share, [36]) for d, share in zip(infer, (0.34, 0.33, 0.33), strict=True)]
    tasks = [
        TaskPlan(
            task="generation",
            group="rollout",
            tp=2,
            pp=1,
            dp=4,
            replicas=gen_replicas,
            predicted=cost(6.0, compute_s=1.2, memory_s=4.2, comm_s=0.4, other_s=0.2),
        ),
        TaskPlan(
            task="reference",
            group="infer",
            tp=1,
            pp=1,
            dp=3,
            replicas=one_each,
            predicted=cost(1.2, compute_s=0.9, memory_s=0.2, comm_s=0.1),
        ),
        TaskPlan(
            task="critic_inference",
            group="infer",
            tp=1,
            pp=1,
            dp=3,
            replicas=one_each,
            predicted=cost(1.2, compute_s=0.9, memory_s=0.2, comm_s=0.1),
        ),
        TaskPlan(
            task="actor_train",
            group="train",
            tp=2,
            pp=2,
            dp=2,
            replicas=[replica(pairs(train[:4]), 0.5, [20, 16]), replica(pairs(train[4:]), 0.5, [20, 16])],
            predicted=cost(4.0, compute_s=3.1, comm_s=0.5, bubble_s=0.4),
        ),
        TaskPlan(
            task="critic_train",
            group="train",
            tp=2,
            pp=1,
            dp=4,
            replicas=[replica([p], 0.25, [36]) for p in pairs(train)],
            predicted=cost(2.1, compute_s=1.7, comm_s=0.2, other_s=0.2),
        ),
    ]
    memory = {d: 61 * GB for d in rollout[:4]} | {d: 21_500_000_000 for d in rollout[4:]}
    memory |= {d: 18 * GB for d in infer} | {d: 72 * GB for d in train}
    return Plan(
        name="lab-ilp",
        created_at="2026-01-02T10:00:00Z",
        profile_name="lab",
        profile_fingerprint=cluster.fingerprint,
        workload=ppo_workload,
        groups=[
            TaskGroup(name="rollout", tasks=["generation"], devices=rollout),
            TaskGroup(name="infer", tasks=["reference", "critic_inference"], devices=infer),
            TaskGroup(name="train", tasks=["actor_train", "critic_train"], devices=train),
        ],
        tasks=tasks,
        cost=PlanCost(
            iteration_s=15.8,
            samples_per_s=1024 / 15.8,
            tokens_per_s=1024 * 512 / 15.8,
            weight_sync_s=0.8,
            transfer_s=0.5,
            breakdown={
                "compute": 7.0,
                "memory": 4.4,
                "comm": 1.3,
                "bubble": 0.4,
                "weight_sync": 0.8,
                "transfer": 0.5,
                "other": 1.4,
            },
            timeline=timeline(
                ("generation", "rollout", 0.0, 6.0),
                ("transfer:generation->infer", "infer", 6.0, 6.3),
                ("reference", "infer", 6.3, 7.5),
                ("critic_inference", "infer", 7.5, 8.7),
                ("transfer:infer->train", "train", 8.7, 8.9),
                ("actor_train", "train", 8.9, 12.9),
                ("critic_train", "train", 12.9, 15.0),
                ("weight_sync", "rollout", 15.0, 15.8),
            ),
            bottleneck="generation on rollout is memory-bound: decode on the 4 L4s sets the pace (6 s of 15.8 s)",
        ),
        solver=SolverStats(
            solver="ilp", status="optimal", objective=15.8, bound=15.8, gap=0.0, seconds=4.2, evaluations=3120
        ),
        memory_per_device=memory,
    )


@pytest.fixture
def baseline_plan(cluster: ClusterProfile, ppo_workload: Workload) -> Plan:
    """Everything colocated on the 16 A100s, verl-style: 36.5 s per iteration."""
    devices = ids("a100-0", range(8)) + ids("a100-1", range(8))
    names = ["generation", "reference", "critic_inference", "actor_train", "critic_train"]
    totals = [18.0, 2.5, 2.5, 8.6, 4.6]
    tasks = [
        TaskPlan(
            task=name,
            group="all",
            tp=2,
            pp=1,
            dp=8,
            replicas=[replica([p], 0.125, [36]) for p in pairs(devices)],
            predicted=cost(total, compute_s=total * 0.7, memory_s=total * 0.3),
        )
        for name, total in zip(names, totals, strict=True)
    ]
    starts = [0.0, 18.0, 20.5, 23.0, 31.6]
    entries = [(n, "all", s, s + t) for n, s, t in zip(names, starts, totals, strict=True)]
    return Plan(
        name="lab-verl",
        created_at="2026-01-02T10:05:00Z",
        profile_name="lab",
        profile_fingerprint=cluster.fingerprint,
        workload=ppo_workload,
        groups=[TaskGroup(name="all", tasks=names, devices=devices)],
        tasks=tasks,
        cost=PlanCost(
            iteration_s=36.5,
            samples_per_s=1024 / 36.5,
            tokens_per_s=1024 * 512 / 36.5,
            weight_sync_s=0.3,
            transfer_s=0.0,
            timeline=timeline(*entries, ("weight_sync", "all", 36.2, 36.5)),
            bottleneck="generation on 16 A100s colocated with training: 18 s of 36.5 s",
        ),
        solver=SolverStats(solver="verl", status="heuristic", seconds=0.01, evaluations=1),
        memory_per_device={d: 70 * GB for d in devices},
    )


@pytest.fixture
def grpo_plan(cluster: ClusterProfile) -> Plan:
    """GRPO fully colocated on a100-0; leaves bottleneck and memory_per_device empty for `show` to derive."""
    devices = ids("a100-0", range(8))
    workload = Workload(name="grpo-8b", algorithm="grpo", actor=ModelSpec(arch="qwen3-8b"))
    tasks = [
        TaskPlan(
            task="generation",
            group="colocated",
            tp=2,
            pp=1,
            dp=4,
            replicas=[replica([p], 0.25, [36]) for p in pairs(devices)],
            predicted=cost(5.2, compute_s=1.0, memory_s=3.9, other_s=0.3),
            memory_bytes={d: 52 * GB for d in devices},
        ),
        TaskPlan(
            task="reference",
            group="colocated",
            tp=1,
            pp=1,
            dp=8,
            replicas=[replica([[d]], 0.125, [36]) for d in devices],
            predicted=cost(0.7, compute_s=0.6, memory_s=0.1),
            memory_bytes={d: 40 * GB for d in devices},
        ),
        TaskPlan(
            task="actor_train",
            group="colocated",
            tp=1,
            pp=2,
            dp=4,
            replicas=[replica([[a], [b]], 0.25, [18, 18]) for a, b in pairs(devices)],
            predicted=cost(3.5, compute_s=2.8, comm_s=0.3, bubble_s=0.4),
            memory_bytes={d: 66 * GB for d in devices},
        ),
    ]
    return Plan(
        name="lab-grpo",
        created_at="2026-01-03T09:00:00Z",
        profile_name="lab",
        profile_fingerprint=cluster.fingerprint,
        workload=workload,
        groups=[TaskGroup(name="colocated", tasks=["generation", "reference", "actor_train"], devices=devices)],
        tasks=tasks,
        cost=PlanCost(
            iteration_s=9.5,
            samples_per_s=1024 / 9.5,
            tokens_per_s=1024 * 512 / 9.5,
            weight_sync_s=0.1,
            timeline=timeline(
                ("generation", "colocated", 0.0, 5.2),
                ("reference", "colocated", 5.2, 5.9),
                ("actor_train", "colocated", 5.9, 9.4),
                ("weight_sync", "colocated", 9.4, 9.5),
            ),
        ),
        solver=SolverStats(solver="hybrid", status="heuristic", seconds=12.0, evaluations=4800, seed=0),
    )


def build_uniform(n_hosts: int) -> tuple[Plan, ClusterProfile]:
    """n_hosts × 8 A100, first half of the hosts in us-east-1 rolling out, second half in eu-west-1 training."""
    hosts = [(f"a100-{h}", "us-east-1" if h < n_hosts // 2 else "eu-west-1", A100, 8) for h in range(n_hosts)]
    profile = make_profile(f"uniform-{n_hosts * 8}", hosts)
    rollout = [d for h in range(n_hosts // 2) for d in ids(f"a100-{h}", range(8))]
    train = [d for h in range(n_hosts // 2, n_hosts) for d in ids(f"a100-{h}", range(8))]
    gen = pairs(rollout)
    stages = [pairs(train[i : i + 4]) for i in range(0, len(train), 4)]
    tasks = [
        TaskPlan(
            task="generation",
            group="rollout",
            tp=2,
            pp=1,
            dp=len(gen),
            replicas=[replica([p], 1 / len(gen), [36]) for p in gen],
            predicted=cost(8.0, compute_s=2.0, memory_s=6.0),
        ),
        TaskPlan(
            task="actor_train",
            group="train",
            tp=2,
            pp=2,
            dp=len(stages),
            replicas=[replica(s, 1 / len(stages), [18, 18]) for s in stages],
            predicted=cost(5.0, compute_s=4.0, comm_s=0.6, bubble_s=0.4),
        ),
    ]
    # Memory varies by host so "fullest first" has something to sort.
    memory = {d: (50 + int(d.split("-")[1].split("/")[0]) % 17) * GB for d in rollout + train}
    plan = Plan(
        name=f"uniform-{n_hosts * 8}",
        created_at="2026-01-04T00:00:00Z",
        profile_name=profile.name,
        profile_fingerprint=profile.fingerprint,
        workload=Workload(name="grpo-8b", algorithm="grpo", prompts_per_step=1024),
        groups=[
            TaskGroup(name="rollout", tasks=["generation"], devices=rollout),
            TaskGroup(name="train", tasks=["actor_train"], devices=train),
        ],
        tasks=tasks,
        cost=PlanCost(
            iteration_s=14.0,
            samples_per_s=8192 / 14.0,
            tokens_per_s=8192 * 512 / 14.0,
            weight_sync_s=1.0,
            timeline=timeline(
                ("generation", "rollout", 0.0, 8.0),
                ("actor_train", "train", 8.0, 13.0),
                ("weight_sync", "rollout", 13.0, 14.0),
            ),
        ),
        solver=SolverStats(solver="hybrid", status="heuristic", seconds=30.0, evaluations=20000, seed=1),
        memory_per_device=memory,
    )
    return plan, profile


@pytest.fixture
def uniform_plan() -> Callable[[int], tuple[Plan, ClusterProfile]]:
    return build_uniform
