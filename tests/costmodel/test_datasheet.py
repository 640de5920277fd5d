"""Datasheet figures become achievable rates by GPU generation (issue 24, item 1): a catalog profile's peak
FLOP/s and memory bandwidth are scaled by constants.DATASHEET_MATMUL_FRACTION / DATASHEET_HBM_FRACTION, a probed
figure is used as it is, and the per-sequence decode cost adds to generation's overhead."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.devices import Cluster, compute_tflops, gpu_generation
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import TaskPlacement
from hetrl_cli.profiling.catalog import profile_from_cluster


def catalog(gpu: str, n: int = 1):
    spec = {"name": "t", "node_groups": [{"gpu": gpu, "gpus_per_node": n, "nodes": 1}]}
    return profile_from_cluster(spec, created_at="2026-01-01T00:00:00Z")


def test_generation_by_compute_capability():
    assert gpu_generation("9.0") == "hopper" and gpu_generation("10.0") == "hopper"
    assert gpu_generation("8.9") == "ada"  # issue 24: Ada's own fractions, fitted on RTX 4090 figures
    assert {gpu_generation(cc) for cc in ("8.0", "8.6", "7.5", "7.0", None, "")} == {"ampere"}


@pytest.mark.parametrize(("gpu", "generation"), [("H100 SXM", "hopper"), ("A100 80GB", "ampere"), ("L4", "ada")])
def test_catalog_figures_scaled_by_generation(gpu, generation):
    profile = catalog(gpu)
    device = profile.devices[0]
    cls = Cluster(profile, "bf16", {}).classes[0]
    assert cls.compute_Fps == pytest.approx(device.peak_tflops["bf16"] * 1e12 * C.DATASHEET_MATMUL_FRACTION[generation])
    assert cls.mem_Bps == pytest.approx(device.memory_gbps * 1e9 * C.DATASHEET_HBM_FRACTION[generation])


def test_hopper_datasheet_peak_is_not_reached():
    """The fitted Hopper fraction is below 1 and the H100's achievable rate sits between its datasheet peak and
    the H200 probe's 658.9 TFLOP/s (bench/results/gpu_check_h200)."""
    rate = compute_tflops(catalog("H100 SXM").devices, "bf16")["h100-0/0"]
    assert 658.9 <= rate < 989.5


def test_probed_figures_are_used_as_they_are():
    profile = catalog("H100 SXM")
    probed = profile.devices[0].model_copy(
        update={"measured_tflops": {"bf16": 658.9}, "memory_gbps": 3000.0, "peak_memory_gbps": None}
    )
    profile = profile.model_copy(update={"devices": [probed]})
    cls = Cluster(profile, "bf16", {}).classes[0]
    assert cls.compute_Fps == pytest.approx(658.9e12)
    assert cls.mem_Bps == pytest.approx(3000.0e9)


def test_per_sequence_decode_cost_adds_per_generated_token(monkeypatch):
    profile = catalog("H100 SXM")
    workload = Workload(
        name="w", algorithm="grpo", actor=ModelSpec(arch="qwen3-1.7b"), prompts_per_step=8,
        responses_per_prompt=4, max_prompt_tokens=128, max_response_tokens=256,
    )  # fmt: skip
    placement = TaskPlacement(task="generation", replicas=((("h100-0/0",),),))
    base = CostModel(profile, workload).task(placement).terms["overhead"]
    monkeypatch.setattr(C, "DECODE_SEQ_OVERHEAD_S", 1e-4)
    more = CostModel(profile, workload).task(placement).terms["overhead"]
    step = CostModel(profile, workload).step
    assert more - base == pytest.approx(step.n_samples * step.resp_mean * 1e-4)
