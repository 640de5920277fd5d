"""The derived data every format prints: exact strings and numbers from the fixture plans."""

from __future__ import annotations

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile, Device
from hetrl_cli.render.digest import (
    IDLE,
    MISSING,
    compact_layers,
    compact_shares,
    digest_plan,
    hostlist,
    seconds,
    short_type,
    si,
)


def test_group_summary_counts_devices_by_type_and_host(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    d = digest_plan(ppo_plan, cluster)
    assert d.group_devices == {
        "rollout": "4×A100 (a100-0), 4×L4 (l4-0)",
        "infer": "3×A100 (a100-0)",
        "train": "8×A100 (a100-1)",
    }


def test_group_summary_without_profile_names_hosts_only(ppo_plan: Plan) -> None:
    assert digest_plan(ppo_plan).group_devices["rollout"] == "4 on a100-0, 4 on l4-0"


def test_compact_shares_and_layers(ppo_plan: Plan) -> None:
    assert compact_shares(ppo_plan.task("generation")) == "0.31/0.31/0.19/0.19"
    assert compact_shares(ppo_plan.task("critic_train")) == "4×0.25"
    assert compact_layers(ppo_plan.task("actor_train")) == "20/16"


def test_short_type_strips_vendor_and_variant() -> None:
    def dev(name: str, kind: str = "cuda") -> Device:
        return Device(id="h/0", host="h", index=0, kind=kind, name=name, memory_bytes=1, memory_gbps=1)

    assert short_type(dev("NVIDIA A100-SXM4-80GB")) == "A100"
    assert short_type(dev("NVIDIA GeForce RTX 4090")) == "RTX 4090"
    assert short_type(dev("NVIDIA L4")) == "L4"
    assert short_type(dev("Intel(R) Xeon(R) Gold", kind="cpu")) == "CPU"


def test_device_map_marks_groups_and_idle(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    rows = {r.label: (r.region, r.types, r.marks) for r in digest_plan(ppo_plan, cluster).hosts}
    assert rows["a100-0"] == ("us-east-1", "8×A100", ["A", "A", "A", "A", "B", "B", "B", IDLE])
    assert rows["a100-1"] == ("us-east-1", "8×A100", ["C"] * 8)
    assert rows["l4-0"] == ("us-west-2", "4×L4", ["A"] * 4)


def test_device_map_merges_lookalike_hosts_on_big_clusters(uniform_plan) -> None:
    plan, profile = uniform_plan(128)
    rows = digest_plan(plan, profile).hosts
    assert [(r.label, r.region, "".join(r.marks)) for r in rows] == [
        ("a100-[0-63] (64 hosts)", "us-east-1", "AAAAAAAA"),
        ("a100-[64-127] (64 hosts)", "eu-west-1", "BBBBBBBB"),
    ]


def test_memory_is_fullest_first_by_fraction_of_capacity(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    view = digest_plan(ppo_plan, cluster).memory
    assert view.per_host  # 19 devices > 16
    assert [(r.name, r.devices) for r in view.rows] == [("a100-1", 8), ("l4-0", 4), ("a100-0", 7)]
    assert view.rows[0].fraction == 72e9 / (80 * 2**30)


def test_memory_without_profile_sorts_by_bytes_and_falls_back_to_task_peaks(grpo_plan: Plan) -> None:
    view = digest_plan(grpo_plan).memory
    assert not view.per_host
    assert {r.peak_bytes for r in view.rows} == {66 * 10**9}  # max over tasks, plan has no memory_per_device
    assert all(r.capacity_bytes is None for r in view.rows)


def test_memory_summary_truncates_long_lists(uniform_plan) -> None:
    plan, profile = uniform_plan(128)
    view = digest_plan(plan, profile).memory
    assert len(view.rows) == 12 and view.hidden == 116
    assert view.emptiest is not None and view.emptiest.peak_bytes == 50 * 10**9


def test_bottleneck_is_the_plans_sentence_when_given(ppo_plan: Plan) -> None:
    assert digest_plan(ppo_plan).bottleneck == ppo_plan.cost.bottleneck


def test_bottleneck_is_derived_from_the_timeline_when_empty(grpo_plan: Plan) -> None:
    assert digest_plan(grpo_plan).bottleneck == (
        "generation (group A, colocated) takes 5.2 s of the 9.5 s iteration (55%), mostly memory (3.9 s)"
    )


def test_not_stale_when_fingerprints_match(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    assert digest_plan(ppo_plan, cluster).stale is None
    assert digest_plan(ppo_plan).stale is None


def test_stale_names_missing_and_unused_devices(ppo_plan: Plan, cluster: ClusterProfile) -> None:
    shrunk = cluster.model_copy(
        update={
            "hosts": [h for h in cluster.hosts if h.name != "l4-0"],
            "devices": [dv for dv in cluster.devices if dv.host != "l4-0"],
            "links": [lk for lk in cluster.links if "l4-0" not in (lk.a, lk.b)],
        }
    ).with_fingerprint()
    d = digest_plan(ppo_plan, shrunk)
    assert d.stale is not None
    assert d.stale.missing_devices == ["l4-0/0", "l4-0/1", "l4-0/2", "l4-0/3"]
    assert d.stale.unused_devices == ["a100-0/7"]
    assert "4 device(s) the plan uses are gone: l4-0/0, l4-0/1, l4-0/2, l4-0/3" in d.stale.sentence()
    assert next(r for r in d.hosts if r.label == "l4-0").marks == [MISSING] * 4


def test_number_formats() -> None:
    assert [seconds(x) for x in (0, 0.000436, 0.3124, 1.234, 15.8, 36.5, 1234.0)] == [
        "0 s",
        "436 µs",
        "312 ms",
        "1.23 s",
        "15.8 s",
        "36.5 s",
        "1,234 s",
    ]
    assert [si(x) for x in (64.81, 33182.8, 2.5e6)] == ["64.8", "33.2k", "2.5M"]


def test_hostlist_is_slurm_style() -> None:
    assert hostlist(["a100-0", "a100-1", "a100-2", "a100-5"]) == "a100-[0-2,5]"
    assert hostlist(["l40s-0", "l4-1", "l4-0", "gpu"]) == "l40s-0, l4-[0-1], gpu"


def test_many_hosts_summarised_per_type(uniform_plan) -> None:
    plan, profile = uniform_plan(8)
    assert digest_plan(plan, profile).group_devices["rollout"] == "32×A100 (a100-[0-3])"
    assert digest_plan(plan).group_devices["train"] == "32 devices (a100-[4-7])"


def test_a_model_read_from_a_directory_is_named_by_it() -> None:
    from hetrl_cli.artifacts.workload import ModelSpec, Workload
    from hetrl_cli.render.digest import model_label, workload_line

    assert model_label(ModelSpec(arch="qwen3-8b")) == "qwen3-8b"
    assert model_label(ModelSpec(arch="hf", path="/models/Qwen3-8B")) == "hf:Qwen3-8B"
    assert model_label(ModelSpec(arch="hf", config_path="/models/Llama-3.1-8B/config.json")) == "hf:Llama-3.1-8B"
    line = workload_line(Workload(actor=ModelSpec(arch="hf", path="/models/Qwen3-8B")))
    assert line.startswith("GRPO sync · actor hf:Qwen3-8B, reward rule:")
