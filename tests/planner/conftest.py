"""Tiny clusters and workloads for the planner tests (catalog-built: the same path as `hetrl profile --catalog`)."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.profiling.catalog import profile_from_cluster

LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}
WAN = {"default": {"bandwidth": "5Gbps", "latency": "10ms"}}


def cluster(name: str, node_groups: list[dict]) -> ClusterProfile:
    return profile_from_cluster(
        {"name": name, "node_groups": node_groups, "network": {"intra_region": LAN, "inter_region": WAN}}
    )


TINY = {
    # 2 types, 4 devices: an A100 pair in one region, an L4 pair in another
    "2x2": [
        {"gpu": "A100 80GB", "gpus_per_node": 2, "nodes": 1, "region": "r1"},
        {"gpu": "L4", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
    ],
    # 2 types, 3 single-device hosts (cross-host everything)
    "1p2": [
        {"gpu": "A100 80GB", "gpus_per_node": 1, "nodes": 1, "region": "r1"},
        {"gpu": "L4", "gpus_per_node": 1, "nodes": 2, "region": "r1"},
    ],
}


def workload(algorithm: str, mode: str, arch: str = "qwen3-0.6b") -> Workload:
    critic = ModelSpec(arch=arch) if algorithm == "ppo" else None
    return Workload(algorithm=algorithm, mode=mode, actor=ModelSpec(arch=arch), critic=critic)


@pytest.fixture(params=sorted(TINY))
def tiny_profile(request) -> ClusterProfile:
    return cluster(f"tiny-{request.param}", TINY[request.param])
