"""Small cluster profiles built directly from the artifact models (no catalog, no probing)."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link
from hetrl_cli.artifacts.workload import Workload

GPU = {
    # name: (bf16 TFLOP/s, memory GB, HBM GB/s) — datasheet dense figures
    "A100": ("NVIDIA A100-SXM4-80GB", 312.0, 80, 2039.0),
    "L40S": ("NVIDIA L40S", 362.0, 48, 864.0),
    "L4": ("NVIDIA L4", 121.0, 24, 300.0),
}
NVLINK = IntraLink(kind="nvlink", bandwidth_Bps=300e9, latency_s=5e-6, source="catalog")
PCIE = IntraLink(kind="pcie", bandwidth_Bps=25e9, latency_s=10e-6, source="catalog")


def make_profile(
    hosts: list[tuple[str, str, int, str]],
    links: dict[tuple[str, str], tuple[float, float]] | None = None,
    default_link: tuple[float, float] = (100e9 / 8, 1e-4),
    wan_between_regions: tuple[float, float] | None = None,
    memory_gb: dict[str, float] | None = None,
) -> ClusterProfile:
    """hosts: (host name, GPU kind, count, region); links: (a, b) -> (B/s, s); others get default_link
    (or wan_between_regions for hosts in different regions)."""
    links = links or {}
    host_objs, devices, link_objs = [], [], []
    for name, kind, n, region in hosts:
        full, tflops, mem_gb, gbps = GPU[kind]
        mem_gb = (memory_gb or {}).get(kind, mem_gb)
        intra = None
        if n > 1:
            intra = NVLINK if kind == "A100" else PCIE
        host_objs.append(Host(name=name, address=name, region=region, intra_link=intra))
        for i in range(n):
            devices.append(
                Device(
                    id=f"{name}/{i}",
                    host=name,
                    index=i,
                    kind="cuda",
                    name=full,
                    memory_bytes=int(mem_gb * 1e9),
                    peak_tflops={"bf16": tflops, "fp16": tflops, "fp32": tflops / 16},
                    memory_gbps=gbps,
                )
            )
    names = [h[0] for h in hosts]
    region = {h[0]: h[3] for h in hosts}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            bw, lat = (
                links.get((a, b))
                or links.get((b, a))
                or (wan_between_regions if wan_between_regions and region[a] != region[b] else default_link)
            )
            kind = "wan" if region[a] != region[b] else "lan"
            link_objs.append(Link(a=a, b=b, bandwidth_Bps=bw, latency_s=lat, kind=kind, source="assumed"))
    return ClusterProfile(
        name="test",
        created_at="2025-01-01T00:00:00Z",
        method="catalog",
        hosts=host_objs,
        devices=devices,
        links=link_objs,
    ).with_fingerprint()


@pytest.fixture
def mixed_profile() -> ClusterProfile:
    """2 hosts × 2 A100 (us-east) + 1 host × 4 L4 (us-west), 100 Gbps LAN, 5 Gbps / 10 ms WAN."""
    return make_profile(
        [("a0", "A100", 2, "us-east"), ("a1", "A100", 2, "us-east"), ("l0", "L4", 4, "us-west")],
        wan_between_regions=(5e9 / 8, 10e-3),
    )


GRPO_SMALL = Workload(
    actor={"arch": "qwen3-0.6b"},
    prompts_per_step=16,
    responses_per_prompt=4,
    max_prompt_tokens=256,
    max_response_tokens=256,
    micro_batch=4,
)
"""A small GRPO job on Qwen3-0.6B that fits everywhere (a constant too: hypothesis tests can't take fixtures)."""


@pytest.fixture
def grpo_small() -> Workload:
    """A small GRPO job on Qwen3-0.6B that fits everywhere."""
    return GRPO_SMALL
