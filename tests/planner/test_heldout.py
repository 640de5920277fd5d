"""Issue 24's planner targets on held-out settings: `bench/uneven_suite.py settings(30, seed=1)`, which no one
tuned on (seed 0's 40 settings shaped the hybrid, the estimate and the baselines; docs/benchmarks.md
"Held-out uneven settings (seed 1)"). Each cluster here is one generated setting, copied out so the tests do
not move if the generator does; the smallest that shows each defect."""

from __future__ import annotations

import pytest

from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.errors import Infeasible
from hetrl_cli.planner.api import make_plan
from hetrl_cli.profiling.catalog import profile_from_cluster

LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}


def cluster(name: str, groups: list[tuple[str, int, int, str]], wan: str, latency: str) -> dict:
    """A suite cluster.yaml as a dict: (gpu, gpus_per_node, nodes, region) per node group."""
    node_groups = [
        {"gpu": gpu, "gpus_per_node": size, "nodes": nodes, "region": region, "name_prefix": f"g{k}-{short}"}
        for k, (gpu, size, nodes, region) in enumerate(groups)
        for short in [gpu.split()[0].lower()]
    ]
    network = {"intra_region": LAN, "inter_region": {"default": {"bandwidth": wan, "latency": latency}}}
    return {"name": name, "node_groups": node_groups, "network": network}


U24 = cluster(
    "u24", [("L40S", 8, 2, "r0"), ("L4", 5, 2, "r0"), ("A10G", 3, 1, "r0"), ("V100", 8, 1, "r0")], "10Gbps", "20ms"
)
U24_WORKLOAD = {"algorithm": "grpo", "mode": "async", "actor": {"arch": "qwen3-1.7b"}}


def setting(cluster_dict: dict, workload: dict):
    return profile_from_cluster(cluster_dict), Workload.model_validate(workload)


@pytest.mark.slow
def test_the_hybrid_reaches_the_half_host_optimum_on_u24():
    """Held-out u24 (GRPO async 1.7B, 37 GPUs on 6 hosts, one region): hybrid ≥ 0.99 × the ILP's proven
    optimum at a fixed number of evaluations (the target says at 10 s; evaluations make it load-free)."""
    profile, workload = setting(U24, U24_WORKLOAD)
    exact = make_plan(profile, workload, solver="ilp", budget_s=60, seed=0)
    assert exact.solver.status == "optimal"
    hybrid = make_plan(profile, workload, solver="hybrid", budget_s=600, max_evals=256, seed=0)
    assert exact.cost.iteration_s / hybrid.cost.iteration_s >= 0.99


U19 = cluster(
    "u19",
    [("V100", 6, 1, "r1"), ("RTX 4090", 3, 2, "r0"), ("RTX 4090", 6, 1, "r0"), ("H200", 4, 1, "r1"),
     ("A100 80GB", 4, 1, "r0"), ("A100 80GB", 2, 2, "r1")],
    "10Gbps",
    "60ms",
)  # fmt: skip
U19_WORKLOAD = {
    "algorithm": "ppo",
    "mode": "async",
    "actor": {"arch": "qwen3-14b"},
    "critic": {"arch": "qwen3-14b"},
    "reward": {"arch": "qwen3-8b"},
}


@pytest.mark.parametrize("baseline", ["verl", "streamrl"])
def test_a_baseline_that_fails_names_the_task_that_fits_nowhere(baseline):
    """Held-out u19 (PPO async 14B actor and critic, 8B reward; 30 GPUs of four types, hosts of 2, 3, 4 and 6):
    the hybrid plans, neither baseline does, because training with its five group mates' states fits on no
    uniform subset. Before, both named generation on all 30 GPUs (TP 1 there: 532 GB on one H200, "use more
    devices"), which fits with TP 4 on the H200 host: the cause must be the task that fits nowhere, and
    where it comes closest."""
    profile, workload = setting(U19, U19_WORKLOAD)
    with pytest.raises(Infeasible) as caught:
        make_plan(profile, workload, solver=baseline, budget_s=60)
    message = str(caught.value)
    assert "None" not in message and "\n" not in message, message
    cause = message.split(" needs ", 1)[1]
    assert cause.split(" for ", 1)[1].startswith(("actor_train", "critic_train")), message
    assert "closest on " in message and "GB" in message, message


@pytest.mark.slow
def test_a_cap_the_uncapped_plan_meets_still_plans():
    """Held-out u19 (catalog prices for all four types): `--objective cost --max-evals 128` plans at 55.71 $/h;
    with `--max-cost-per-hour` just above that, the same search must still plan, at no higher $/iteration.
    (At 512 evaluations it does; `--objective time` under the same cap exits 3 at 128 too.)"""
    profile, workload = setting(U19, U19_WORKLOAD)
    free = make_plan(profile, workload, solver="hybrid", budget_s=600, max_evals=128, seed=0, objective="cost")
    assert free.price is not None
    cap = free.price.usd_per_hour * 1.01
    capped = make_plan(
        profile, workload, solver="hybrid", budget_s=600, max_evals=128, seed=0, objective="cost", max_cost_per_hour=cap
    )
    assert capped.price is not None and capped.price.usd_per_iteration <= free.price.usd_per_iteration * (1 + 1e-9)


@pytest.mark.slow
def test_the_hybrid_reaches_the_optimum_on_u19():
    """Held-out u19 (6 classes, 8 hosts, 143 whole-host pools): hybrid at 1024 evaluations ≥ 0.99 × the ILP's
    plan (proven optimal in 120 s on the loaded 2-core box; the ILP starts from the hybrid's plan)."""
    profile, workload = setting(U19, U19_WORKLOAD)
    exact = make_plan(profile, workload, solver="ilp", budget_s=120, seed=0)
    hybrid = make_plan(profile, workload, solver="hybrid", budget_s=600, max_evals=1024, seed=0)
    assert exact.cost.iteration_s / hybrid.cost.iteration_s >= 0.99


S2_U09 = cluster(
    "u09",
    [("H200", 1, 1, "r4"), ("H200", 3, 2, "r1"), ("L40S", 4, 1, "r3"), ("T4", 8, 1, "r3"), ("T4", 5, 2, "r0"),
     ("H100 SXM", 6, 2, "r4"), ("H100 SXM", 2, 1, "r3")],
    "2Gbps",
    "20ms",
)  # fmt: skip
S2_U09_WORKLOAD = {"algorithm": "grpo", "mode": "async", "actor": {"arch": "qwen3-8b"}}


def test_verl_sizes_the_group_past_a_task_with_few_layouts():
    """Held-out seed 2's u09 (GRPO async 8B, 43 GPUs; 12 H100 on two 6-GPU hosts): verl fits on the 12 H100
    (generation TP 2 or 4 beside reference and actor_train at larger model-parallel sizes: 47–50 s/it), but its
    sizing bumped only the first task that did not fit — generation, whose two layouts ran out — and exited 3
    ("fit one by one but not together"). Each bump now goes to the first misfit with a layout left, else to a
    group mate (its resident share shrinks as it spreads)."""
    profile, workload = setting(S2_U09, S2_U09_WORKLOAD)
    plan = make_plan(profile, workload, solver="verl", budget_s=60)
    (group,) = plan.groups
    assert len(group.devices) == 12 and all("h100" in d for d in group.devices), group.devices


U05 = cluster(
    "u05",
    [("L40S", 3, 1, "r1"), ("L40S", 6, 2, "r0"), ("T4", 5, 1, "r2"), ("H200", 5, 2, "r0")],
    "10Gbps",
    "60ms",
)
U05_WORKLOAD = {"algorithm": "grpo", "mode": "async", "actor": {"arch": "qwen3-1.7b"}, "reward": {"arch": "qwen3-4b"}}
TEST_PRICES = {"T4": 0.53, "L4": 0.80, "L40S": 1.86}
"""$/GPU-hour for the types the catalog has no price for (docs/benchmarks.md, the held-out CLI runs)."""


def priced(cluster_dict: dict) -> dict:
    groups = [{**g, "price_per_gpu_hour": TEST_PRICES[g["gpu"]]} if g["gpu"] in TEST_PRICES else g
              for g in cluster_dict["node_groups"]]  # fmt: skip
    return {**cluster_dict, "node_groups": groups}


def test_under_a_cap_every_plan_either_search_meets_is_a_candidate():
    """Held-out u05 (GRPO async 1.7B + 4B reward, 30 GPUs): at 128 evaluations the cost search plans at 29.71 s/it
    and 39.56 $/h. Under a cap of 39.96 $/h the capped cost search returned 59.26 s/it (22.32 $/h, a worse
    $/iteration: the over-cap genomes scored a penalty with no options, the search took another path), and so
    did the capped time search (it follows the fastest plans, nearly all over the cap). Now the cap filters
    the answers (the path is the uncapped one) and under a cap the time objective also runs the cost search."""
    profile, workload = setting(priced(U05), U05_WORKLOAD)
    kwargs = {"solver": "hybrid", "budget_s": 600, "max_evals": 128, "seed": 0}
    free = make_plan(profile, workload, objective="cost", **kwargs)
    assert free.price is not None
    cap = free.price.usd_per_hour * 1.01
    capped_cost = make_plan(profile, workload, objective="cost", max_cost_per_hour=cap, **kwargs)
    capped_time = make_plan(profile, workload, objective="time", max_cost_per_hour=cap, **kwargs)
    assert capped_cost.price is not None and capped_time.price is not None
    assert capped_cost.price.usd_per_iteration <= free.price.usd_per_iteration * (1 + 1e-9)
    assert capped_time.price.usd_per_hour <= cap
    assert capped_time.cost.iteration_s <= min(capped_cost.cost.iteration_s, free.cost.iteration_s) * (1 + 1e-9)


S2_U11 = cluster(
    "u11",
    [("H100 SXM", 4, 1, "r3"), ("L4", 4, 2, "r0"), ("L4", 3, 1, "r2"), ("T4", 8, 2, "r2"), ("A10G", 1, 1, "r3")],
    "5Gbps",
    "20ms",
)
S2_U11_WORKLOAD = {
    "algorithm": "ppo",
    "mode": "async",
    "actor": {"arch": "qwen3-8b"},
    "critic": {"arch": "qwen3-8b"},
    "reward": {"arch": "qwen3-0.6b"},
}


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["ilp", "hybrid"])
def test_nothing_plans_within_the_budget_and_the_proof_names_the_cause(solver):
    """Held-out seed 2's u11 (PPO async 8B actor and critic, 32 GPUs; one 4-GPU H100 host): nothing plans. The
    full ILP proves it in seconds, yet `--solver ilp --budget 10s` fell back to the hybrid and exited after
    22.5-33.9 s, `--solver hybrid --budget 10s` after 57.7 s (it searched on past the budget), both advising
    "raise --budget". Now both return within the budget, and the ILP's proof names the cause: actor_train and
    critic_train each need the whole H100 host and do not fit together."""
    import time

    profile, workload = setting(S2_U11, S2_U11_WORKLOAD)
    start = time.monotonic()
    with pytest.raises(Infeasible) as caught:
        make_plan(profile, workload, solver=solver, budget_s=10, seed=0)
    wall = time.monotonic() - start
    assert wall < 10 * 1.25 + 1.0, wall
    message = str(caught.value)
    if solver == "hybrid":  # no exhaustive part ran: it says which solver can prove it
        assert "--solver ilp proves" in message, message
    if solver == "ilp":
        assert "raise --budget" not in message and "proved" in message, message
        assert "actor_train" in message and "critic_train" in message and "H100" in message, message


S3_U20 = cluster(
    "u20",
    [("A100 80GB", 3, 1, "r1"), ("H100 SXM", 5, 1, "r2"), ("L4", 3, 2, "r1"), ("L4", 4, 1, "r2")],
    "2Gbps",
    "5ms",
)
S3_U20_WORKLOAD = {"algorithm": "grpo", "mode": "sync", "actor": {"arch": "qwen3-8b"}, "reward": {"arch": "qwen3-4b"}}


@pytest.mark.parametrize("solver", ["verl", "streamrl", "hybrid", "ilp"])
def test_a_task_that_fits_on_four_of_five_gpus_is_not_called_infeasible(solver):
    """Held-out seed 3's u20 (GRPO sync 8B + 4B reward, 18 GPUs: one 5-GPU H100 host, one 3-GPU A100 host, L4
    hosts of 3 and 4): 8B actor_train needs 243 GB at TP 1 and fits at TP 4, which a 5-GPU host cannot take
    whole (TP 1 or PP 5 only: 158.8 GB per GPU). A verl user runs TP 4 on 4 of the 5 GPUs, one idle; every
    solver exited 3 before ("no TP/PP layout of actor_train fits on the 18 devices"), the check that a task
    fits somewhere trying whole hosts only. Now the baselines take the largest power-of-two share of each
    uneven host too, the check tries it, and every solver plans (at least the baselines' plan)."""
    profile, workload = setting(S3_U20, S3_U20_WORKLOAD)
    plan = make_plan(profile, workload, solver=solver, budget_s=30, max_evals=32, seed=0)
    assert plan.cost.iteration_s < float("inf")
    h100 = [d for g in plan.groups if "actor_train" in g.tasks for d in g.devices if "h100" in d]
    assert len(h100) == 4, plan.groups


def test_the_ilp_claims_no_optimum_for_a_plan_outside_its_pools():
    """On u20 the only plans use 4 of the 5-GPU H100 host (the baselines' power-of-two share), which no pool of
    the ILP's space holds (a 5-GPU sub-host has no halving chain). The ILP found nothing better in its space and
    returned the incumbent as `optimal` with gap 0 and its own time as the bound: a certificate over a space the
    plan is not in. Now its bound is the device-count relaxation's (valid for any device sets), below the plan
    here, so `feasible` with that gap, and the note says why."""
    profile, workload = setting(S3_U20, S3_U20_WORKLOAD)
    plan = make_plan(profile, workload, solver="ilp", budget_s=30, max_evals=32, seed=0)
    h100 = [d for g in plan.groups for d in g.devices if "h100" in d]
    assert 0 < len(h100) < 5
    assert plan.solver.status == "feasible"
    assert plan.solver.bound is not None and 0 < plan.solver.bound < plan.cost.iteration_s * (1 - 1e-4)
    assert plan.solver.gap == pytest.approx(1 - plan.solver.bound / plan.cost.iteration_s)
    assert "not a pool" in plan.solver.note


def test_in_pools_holds_whole_hosts_and_one_halving_part_per_class():
    """The device sets the ILP's space holds: whole sub-hosts plus at most one part of the halving chain per
    class (DeviceClass.parts); 4 of 5, two parts of one class, or a device outside every class are not."""
    from hetrl_cli.planner.space import DeviceClass, in_pools

    eight = DeviceClass(
        0, "H100", 80, 8, ("a", "b"), (tuple(f"a{i}" for i in range(8)), tuple(f"b{i}" for i in range(8))), "r0", 1.0
    )
    five = DeviceClass(1, "H100", 80, 5, ("c",), (tuple(f"c{i}" for i in range(5)),), "r0", 1.0)
    classes = [eight, five]
    whole = [*eight.devices[0], *five.devices[0]]
    assert in_pools(classes, "fine", [whole, eight.devices[1][:4]])
    assert in_pools(classes, "half", [eight.devices[1][:4]])
    assert not in_pools(classes, "host", [eight.devices[1][:4]])  # host granularity: no parts
    assert not in_pools(classes, "fine", [eight.devices[1][:3]])  # 3 is not on the chain 4, 2, 1
    assert not in_pools(classes, "fine", [[*eight.devices[0][:4], *eight.devices[1][:4]]])  # two parts, one class
    assert not in_pools(classes, "fine", [five.devices[0][:4]])  # 4 of 5: no chain below an odd host
    assert not in_pools(classes, "fine", [["z0"]])


S4_U27 = cluster(
    "u27",
    [("V100", 2, 2, "r2"), ("T4", 5, 1, "r0"), ("RTX 4090", 1, 1, "r2"), ("L4", 2, 1, "r2"), ("H100 SXM", 3, 2, "r2"),
     ("H100 SXM", 8, 2, "r2")],
    "1Gbps",
    "60ms",
)  # fmt: skip
S4_U27_WORKLOAD = {
    "algorithm": "ppo",
    "mode": "async",
    "actor": {"arch": "qwen3-8b"},
    "critic": {"arch": "qwen3-8b"},
    "reward": {"arch": "qwen3-4b"},
}


def test_the_cost_objective_is_no_dearer_than_the_time_objective():
    """Held-out seed 4's u27 (PPO async 8B + 4B reward, 34 GPUs; H100 hosts of 3 and 8 beside V100, T4, L4, RTX
    4090): at 128 evaluations `--objective time` planned 65.75 s/it at 165.10 $/h (3.0152 $/iteration) and
    `--objective cost` 103.52 s/it at 110.08 $/h (3.1654 $/iteration): asked for the cheapest iteration, the
    planner returned a dearer one than asked for the fastest. The cost search follows $/iteration toward cheap
    devices; it now also runs the time objective's path, each plan judged by $/iteration."""
    profile, workload = setting(priced(S4_U27), S4_U27_WORKLOAD)
    kwargs = {"solver": "hybrid", "budget_s": 600, "max_evals": 128, "seed": 0}
    fastest = make_plan(profile, workload, objective="time", **kwargs)
    cheapest = make_plan(profile, workload, objective="cost", **kwargs)
    assert fastest.price is not None and cheapest.price is not None
    assert cheapest.price.usd_per_iteration <= fastest.price.usd_per_iteration * (1 + 1e-9)
