"""The hf engine's decode-step host work (CostModel(engine="hf")): per layer on a CPU (added to the step), a
dispatch floor under the step on a GPU; a vLLM-like engine (the default) keeps DECODE_STEP_OVERHEAD_S."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host
from hetrl_cli.costmodel import constants as C
from hetrl_cli.costmodel.architectures import BUILTIN
from hetrl_cli.costmodel.generation import decode_host_step_s
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import TaskPlacement

from .conftest import GRPO_SMALL, make_profile

GEN = TaskPlacement("generation", ((("h/0",),),))
LAYERS = BUILTIN["qwen3-0.6b"].num_layers


def cpu_profile() -> ClusterProfile:
    device = Device(id="h/0", host="h", index=0, kind="cpu", name="x86 CPU", memory_bytes=64 * 10**9,
                    peak_tflops={"fp32": 0.5, "bf16": 0.5, "fp16": 0.5}, memory_gbps=20.0)  # fmt: skip
    host = Host(name="h", address="h")
    profile = ClusterProfile(name="cpu", created_at="2025-01-01T00:00:00Z", method="catalog", hosts=[host],
                             devices=[device], links=[])  # fmt: skip
    return profile.with_fingerprint()


def test_host_step_of_each_engine() -> None:
    assert decode_host_step_s(None, 36, True) == (C.DECODE_STEP_OVERHEAD_S, 0.0)
    assert decode_host_step_s("vllm", 36, False) == (C.DECODE_STEP_OVERHEAD_S, 0.0)
    assert decode_host_step_s("hf", 36, False) == pytest.approx((0.4e-3, 36 * 0.25e-3))
    assert decode_host_step_s("hf", 36, True) == pytest.approx((0.4e-3, 36 * 1.0e-3))


def test_default_engine_prices_as_before() -> None:
    profile = cpu_profile()
    plain = CostModel(profile, GRPO_SMALL).task(GEN)
    assert CostModel(profile, GRPO_SMALL, engine=None).task(GEN).terms == plain.terms


def test_hf_on_a_cpu_adds_its_per_layer_host_work_to_every_step() -> None:
    profile = cpu_profile()
    plain = CostModel(profile, GRPO_SMALL).task(GEN).terms
    hf = CostModel(profile, GRPO_SMALL, engine="hf").task(GEN).terms
    ratio = sum(decode_host_step_s("hf", LAYERS, False)) / C.DECODE_STEP_OVERHEAD_S  # 7.4 for 28 layers
    assert hf["overhead"] == pytest.approx(plain["overhead"] * ratio)
    assert {k: v for k, v in hf.items() if k != "overhead"} == {k: v for k, v in plain.items() if k != "overhead"}


def test_hf_on_a_gpu_cannot_step_faster_than_it_dispatches() -> None:
    profile = make_profile([("h", "A100", 1, "r")])
    plain = CostModel(profile, GRPO_SMALL).task(GEN).terms
    hf = CostModel(profile, GRPO_SMALL, engine="hf").task(GEN).terms
    steps = plain["overhead"] / C.DECODE_STEP_OVERHEAD_S  # a catalog GPU host: no slowdown
    serial, floor = decode_host_step_s("hf", LAYERS, True)  # 0.4 ms + 28 ms a step for 28 layers
    device = plain["compute"] + plain["memory"] + plain["tp_comm"]  # with the prefill: an upper bound of decode's
    assert hf["overhead"] <= steps * (serial + floor)
    assert hf["overhead"] >= steps * (serial + floor) - device
    assert hf["compute"] + hf["memory"] + hf["overhead"] >= steps * (serial + floor)


def test_the_bench_fits_a_line_over_layers() -> None:
    from benchload import bench_module

    with bench_module("hf_step_overhead") as bench:
        fitted = bench.fit_line([1, 2, 4, 8], [0.6 + 0.35 * n for n in (1, 2, 4, 8)])
    assert fitted == pytest.approx((0.6, 0.35))
