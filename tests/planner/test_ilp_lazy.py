"""Issue 24: the exact solver scales. Past 150 whole-host pools `--solver ilp` fell back to the hybrid
("ILP space too large (N whole-host pools)") with no bound; now the lazy ILP (planner/lazy.py) returns a plan
with a certified lower bound from the device-count relaxation (planner/bound.py).

The bound's validity is tested where it can be: every task floor below the task's fastest layout on every
pool of small clusters and on random pools of uneven ones, the relaxation below the full ILP's proven
optimum, and on a large cluster below every plan any solver finds."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
import time

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec, Workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.bound import space_bound, task_floors
from hetrl_cli.planner.ilp import solve_ilp
from hetrl_cli.planner.search import Budget
from hetrl_cli.planner.space import allocate, count_pools, enumerate_pools, groupings
from hetrl_cli.planner.tables import Tables

from .conftest import TINY, cluster, workload

HETRL = str(__import__("pathlib").Path(sys.executable).with_name("hetrl"))

WIDE = [  # 8 kinds of host, one each, three regions: 255 whole-host pools (the full ILP takes at most 150)
    {"gpu": "H100 SXM", "gpus_per_node": 4, "nodes": 1, "region": "r1"},
    {"gpu": "A100 80GB", "gpus_per_node": 4, "nodes": 1, "region": "r1"},
    {"gpu": "A100 40GB", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
    {"gpu": "L40S", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
    {"gpu": "L4", "gpus_per_node": 3, "nodes": 1, "region": "r3"},
    {"gpu": "A10G", "gpus_per_node": 4, "nodes": 1, "region": "r3"},
    {"gpu": "RTX 4090", "gpus_per_node": 1, "nodes": 1, "region": "r1"},
    {"gpu": "V100", "gpus_per_node": 2, "nodes": 1, "region": "r2"},
]
UNEVEN = [  # hosts of 1, 3, 5 and 6 GPUs beside 4 and 8, two regions
    {"gpu": "H100 SXM", "gpus_per_node": 8, "nodes": 1, "region": "r1"},
    {"gpu": "A100 80GB", "gpus_per_node": 3, "nodes": 2, "region": "r1"},
    {"gpu": "L40S", "gpus_per_node": 5, "nodes": 1, "region": "r2"},
    {"gpu": "A10G", "gpus_per_node": 6, "nodes": 1, "region": "r2"},
    {"gpu": "T4", "gpus_per_node": 1, "nodes": 2, "region": "r2"},
]
WORKLOADS = [("grpo", "sync"), ("grpo", "async"), ("ppo", "sync"), ("ppo", "async")]


def tables_for(profile, w: Workload) -> Tables:
    return Tables(CostModel(profile, w), profile, w)


def floors_hold(tables: Tables, pools) -> int:
    """Every task's floor ≤ its fastest layout alone, and ≤ its time in every group option, on `pools`."""
    floors = task_floors(tables)
    checked = 0
    for pool in pools:
        devices = allocate(tables.classes, [pool])[0]
        counts = [w * c.per_host + p for (w, p), c in zip(pool, tables.classes, strict=True)]
        for task in tables.tasks:
            fastest = tables.alone(task, devices)
            if fastest:
                assert floors[task].value(counts) <= fastest[0][0] * (1 + 1e-9), (task, pool)
                checked += 1
        for subset in ((t,) for t in tables.tasks):
            option = tables.group_option(subset, devices)
            if option is not None:
                assert floors[subset[0]].value(counts) <= option.task_s[0] * (1 + 1e-9)
    return checked


@pytest.mark.parametrize(("algorithm", "mode"), WORKLOADS)
def test_floors_hold_on_every_pool_of_the_tiny_clusters(algorithm, mode):
    for name, groups in TINY.items():
        t = tables_for(cluster(name, groups), workload(algorithm, mode))
        assert floors_hold(t, enumerate_pools(t.classes, "fine")) > 0


@pytest.mark.parametrize("arch", ["qwen3-1.7b", "qwen3-8b"])
def test_floors_hold_on_random_pools_of_an_uneven_cluster(arch):
    w = Workload(
        algorithm="ppo", mode="sync", actor=ModelSpec(arch=arch), critic=ModelSpec(arch=arch),
        reward=ModelSpec(arch="qwen3-0.6b"),
    )  # fmt: skip
    t = tables_for(cluster("uneven", UNEVEN), w)
    for granularity in ("host", "half"):  # whole hosts and half hosts (the hybrid's blocks)
        pools = enumerate_pools(t.classes, granularity)
        assert floors_hold(t, random.Random(0).sample(pools, 20)) > 20


@pytest.mark.parametrize(("algorithm", "mode"), WORKLOADS)
def test_the_relaxation_is_below_the_ilp_optimum(algorithm, mode):
    """Where the full ILP proves its optimum (all pools enumerated), the relaxation bound is below it."""
    for name, groups in TINY.items():
        t = tables_for(cluster(name, groups), workload(algorithm, mode))
        result, _space, _note = solve_ilp(t, Budget(60), granularity="fine")
        assert result.status == "optimal"
        relaxed = space_bound(t, time.monotonic() + 30)
        assert relaxed.complete and 0 < relaxed.bound <= result.objective * (1 + 1e-9), (name, relaxed.bound)


def test_the_relaxation_is_below_the_ilp_optimum_on_uneven_hosts():
    small = ModelSpec(arch="qwen3-0.6b")
    w = Workload(algorithm="grpo", mode="async", actor=ModelSpec(arch="qwen3-1.7b"), reward=small)
    t = tables_for(cluster("uneven", UNEVEN), w)
    result, _space, _note = solve_ilp(t, Budget(120), granularity="host")
    assert result.status == "optimal"
    relaxed = space_bound(t, time.monotonic() + 30)
    assert 0 < relaxed.bound <= result.objective * (1 + 1e-9)


@pytest.fixture(scope="module")
def wide():
    return cluster("wide", WIDE)


def ppo_8b() -> Workload:
    eight = ModelSpec(arch="qwen3-8b")
    return Workload(algorithm="ppo", mode="sync", actor=eight, critic=eight, reward=ModelSpec(arch="qwen3-1.7b"))


def test_past_150_pools_the_ilp_returns_a_plan_with_a_certified_bound(wide, tmp_path):
    """Before: 'ILP gave no plan (ILP space too large (255 whole-host pools)): fell back to the hybrid result'
    with no bound. Now a plan of the ILP with a bound below it, and every other plan above that bound."""
    w = ppo_8b()
    assert count_pools(tables_for(wide, w).classes, "host") == 255
    plan = make_plan(wide, w, solver="ilp", budget_s=20, max_evals=32, seed=0)
    s = plan.solver
    assert s.solver == "ilp" and "lazy ILP" in s.note and "fell back" not in s.note, s.note
    assert s.bound is not None and s.gap is not None and 0 < s.bound <= s.objective
    assert s.gap == pytest.approx(1 - s.bound / s.objective, abs=1e-9) or s.status == "optimal"
    assert make_plan(wide, w, solver="streamrl", budget_s=60).cost.iteration_s >= s.bound
    path = tmp_path / "plan.json"
    save_artifact(plan, path)
    shown = subprocess.run([HETRL, "show", str(path), "--format", "markdown"], capture_output=True, text=True)
    assert shown.returncode == 0 and f"bound {s.bound:.4g}" in shown.stdout and "gap" in shown.stdout


@pytest.mark.slow
def test_the_lazy_ilp_is_never_worse_than_the_hybrid_it_starts_from(wide):
    w = ppo_8b()
    hybrid = make_plan(wide, w, solver="hybrid", budget_s=600, max_evals=64, seed=0)
    ilp = make_plan(wide, w, solver="ilp", budget_s=20, max_evals=64, seed=0)
    assert ilp.solver.objective <= hybrid.solver.objective * (1 + 1e-9)
    assert hybrid.solver.objective >= ilp.solver.bound  # the bound holds for the hybrid's plan too


def test_the_relaxation_bounds_every_grouping(wide):
    """Each grouping's bound is at least its cheap bound and the space's bound is their least."""
    w = ppo_8b()
    t = tables_for(wide, w)
    relaxed = space_bound(t, time.monotonic() + 60)
    assert relaxed.complete and relaxed.refined >= 1
    assert relaxed.bound <= min(relaxed.per_grouping.values())
    assert set(relaxed.per_grouping) <= set(groupings(t.tasks))


def test_auto_estimates_the_ilps_seconds():
    """auto's estimate (ilp.estimate_s: a sample of pools timed in CPU seconds, the leaves' columns) against the
    ILP's own CPU seconds on fresh tables (process CPU time: the machine's load moves neither). Before issue 24
    the estimate was pools × Σ subset sizes × 15 calls × 0.5 ms: 1.7–5.5× the measured seconds on the uneven
    suite (the issue's 51-GPU case: ~206 s estimated, 50 s measured). The suite checks 2×; this test allows 4×
    (fresh tables without the hybrid's cutoff, which the leaves' rate is not fit to)."""
    from hetrl_cli.planner.ilp import estimate_s

    small = ModelSpec(arch="qwen3-0.6b")
    w = Workload(algorithm="grpo", mode="async", actor=ModelSpec(arch="qwen3-1.7b"), reward=small)
    profile = cluster("uneven", UNEVEN)
    estimate = estimate_s(tables_for(profile, w), "host")
    start = time.process_time()
    result, _space, _note = solve_ilp(tables_for(profile, w), Budget(600), granularity="host")
    measured = time.process_time() - start
    assert result.status == "optimal"
    assert measured / 4 <= estimate <= 4 * measured, (estimate, measured)


@pytest.mark.slow
def test_a_32_host_cluster_gets_a_plan_and_a_bound():
    """32 hosts of 16 kinds (1-8 GPUs, four regions): 43 million whole-host pools. The ILP returns a plan with a
    bound below it within its budget."""
    gpus = ["H100 SXM", "A100 80GB", "A100 40GB", "L40S", "L4", "A10G", "RTX 4090", "V100", "T4", "H200"]
    groups = [
        {"gpu": gpus[i % 10], "gpus_per_node": [1, 2, 3, 4, 5, 6, 8][i % 7], "nodes": 2, "region": f"r{i % 4}",
         "name_prefix": f"g{i}"}
        for i in range(16)
    ]  # fmt: skip
    profile = cluster("big32", groups)
    start = time.monotonic()
    plan = make_plan(profile, ppo_8b(), solver="ilp", budget_s=30, seed=0)
    assert time.monotonic() - start < 45
    s = plan.solver
    assert len(profile.hosts) == 32 and "lazy ILP" in s.note
    assert s.bound is not None and 0 < s.bound <= s.objective and s.gap is not None


PRICED_WIDE = [
    {**g, "price_per_gpu_hour": p} for g, p in zip(WIDE, [6.88, 3.43, 2.75, 1.9, 0.8, 1.2, 0.7, 3.06], strict=True)
]


@pytest.mark.slow
def test_past_150_pools_the_cost_objective_runs_the_lazy_master_with_a_bound():
    """Before: the cost sweep's ILP had no space past 150 pools and `--objective cost` returned the hybrid's plan
    with no bound. Now lazy steps under falling $/hour caps: a plan of the ILP at most the hybrid's $/iteration,
    with a $ bound below it (and below the hybrid's plan)."""
    priced = cluster("priced-wide", PRICED_WIDE)
    w = ppo_8b()
    assert count_pools(tables_for(priced, w).classes, "host") == 255
    hybrid = make_plan(priced, w, solver="hybrid", budget_s=600, max_evals=32, seed=0, objective="cost")
    plan = make_plan(priced, w, solver="ilp", budget_s=30, max_evals=32, seed=0, objective="cost")
    s = plan.solver
    assert s.solver == "ilp" and "lazy ILP" in s.note and "cost sweep" in s.note, s.note
    assert s.objective == pytest.approx(plan.price.usd_per_iteration, rel=1e-6)
    assert s.objective <= hybrid.price.usd_per_iteration * (1 + 1e-9)
    assert s.bound is not None and 0 < s.bound <= s.objective and s.bound <= hybrid.price.usd_per_iteration


def test_auto_counts_the_cost_sweeps_ilps(monkeypatch):
    """`--solver auto` under `--objective cost` estimates one time ILP per step of the sweep, not one: on 2 + 2
    devices at two prices (8 hourly prices a plan can have: 8 steps expected) the same tables and MILPs take
    8× the seconds; the sweep's real count is within that."""
    import hetrl_cli.planner.ilp as ilp_module
    from hetrl_cli.planner.api import choose_solver
    from hetrl_cli.planner.cost import make_objective
    from hetrl_cli.planner.cost_ilp import expected_steps

    priced = cluster(
        "priced",
        [
            {"gpu": "H100", "gpus_per_node": 2, "region": "r1", "price_per_gpu_hour": 6.88},
            {"gpu": "A100 80GB", "gpus_per_node": 2, "region": "r2", "price_per_gpu_hour": 3.43},
        ],
    )
    w = workload("grpo", "sync")
    t = tables_for(priced, w)
    monkeypatch.setattr(ilp_module, "estimate_s", lambda tables, gran: 10.0)
    t.objective = make_objective(priced, "time", None)
    assert choose_solver(t, Budget(50))[1] == "ILP, ~10 s of tables and MILPs fit the 50 s budget"
    t.objective = make_objective(priced, "cost", None)
    gran = ilp_module.choose_granularity(t, 150)
    assert expected_steps(t, gran) == 8
    assert choose_solver(t, Budget(50))[1] == "hybrid, the ILP would take ~80 s of the 50 s budget"
    monkeypatch.undo()
    plan = make_plan(priced, w, solver="ilp", budget_s=60, objective="cost")
    steps = int(plan.solver.note.split("cost sweep: ")[1].split()[0])
    assert 1 <= steps <= expected_steps(t, gran)


@pytest.mark.parametrize("arch", ["qwen3-1.7b", "qwen3-8b"])
def test_the_weight_sync_floor_is_below_every_sync(arch):
    """bound.sync_floor: a grouping's weight syncs at their least (groups apart: a broadcast at the fastest link;
    one group: the less of that and a local reshard + refit) ≤ the cost model's sync between any device sets
    of that kind (disjoint for groups apart, overlapping or equal for one group), on the uneven cluster; and
    the WAN floor where the inference devices hold a region the trainer's do not."""
    from hetrl_cli.planner.bound import sync_floor, sync_floors

    w = Workload(algorithm="grpo", mode="sync", actor=ModelSpec(arch=arch), reward=ModelSpec(arch="qwen3-0.6b"))
    t = tables_for(cluster("uneven", UNEVEN), w)
    apart = sync_floor(t, (("generation",), ("reference", "reward", "actor_train")))
    together = sync_floor(t, (("generation", "reference", "reward", "actor_train"),))
    assert 0 < together <= apart
    [split] = sync_floors(t, (("generation",), ("reference", "reward", "actor_train")))
    wan = split.wan
    assert wan > 5 * apart  # 1 Gbps WAN against NVLink
    crossed = 0
    devices = [d for c in t.classes for host in c.devices for d in host]
    rng = random.Random(0)
    for _ in range(60):
        rng.shuffle(devices)
        k = rng.randint(1, len(devices) - 1)
        train, gen = devices[:k], devices[k : rng.randint(k + 1, len(devices))]
        assert apart <= t.cm.weight_sync_s(train, gen, "actor") * (1 + 1e-9)
        shared = train[: rng.randint(1, len(train))] + gen[: rng.randint(0, len(gen))]
        assert together <= t.cm.weight_sync_s(train, shared, "actor") * (1 + 1e-9)
        assert together <= t.cm.weight_sync_s(train, train, "actor") * (1 + 1e-9)
        region = {d: c.region for c in t.classes for host in c.devices for d in host}
        if {region[d] for d in gen} - {region[d] for d in train}:  # the copy crosses into a region
            assert wan <= t.cm.weight_sync_s(train, gen, "actor") * (1 + 1e-9)
            crossed += 1
    assert crossed > 5


@pytest.mark.parametrize("arch", ["qwen3-1.7b", "qwen3-8b"])
def test_the_memory_rows_hold_on_random_pools(arch):
    """bound.memory_need (the relaxation's memory rows): on every group option the planner builds on random
    pools of the uneven cluster, each task's need (its bytes, its mates' resident ones, the optimizer states
    not offloaded) fits the devices' usable memory, and an offloaded trainer's copies take at least its floor."""
    from hetrl_cli.artifacts.rl import TRAIN_TASKS
    from hetrl_cli.costmodel import constants as C
    from hetrl_cli.planner.bound import memory_need

    spec = ModelSpec(arch=arch)
    w = Workload(algorithm="ppo", mode="sync", actor=spec, critic=spec, reward=ModelSpec(arch="qwen3-0.6b"))
    t = tables_for(cluster("uneven", UNEVEN), w)
    floors = task_floors(t)
    memory = {d: c.memory_bytes * max(C.GEN_MEMORY_UTILIZATION, C.USABLE_MEMORY_FRACTION)
              for c in t.classes for host in c.devices for d in host}  # fmt: skip
    subsets = sorted({s for gs in groupings(t.tasks) for s in gs if set(s) & set(TRAIN_TASKS)})
    rng = random.Random(0)
    checked = 0
    for pool in rng.sample(enumerate_pools(t.classes, "half"), 12):
        devices = allocate(t.classes, [pool])[0]
        counts = [w_ * c.per_host + p for (w_, p), c in zip(pool, t.classes, strict=True)]
        for subset in rng.sample(subsets, 4):
            option = t.group_option(subset, devices)
            if option is None:
                continue
            offloaded = {p.task for p in option.placements if p.offload and p.task in TRAIN_TASKS}
            for task in subset:
                assert memory_need(floors, subset, task, offloaded) <= sum(memory[d] for d in devices), (subset, task)
                checked += 1
            for i, placement in enumerate(option.placements):
                if placement.task in offloaded:
                    others = tuple(p for j, p in enumerate(option.placements) if j != i)
                    spent = t.task_estimate(placement, others).terms.get("offload", 0.0)
                    assert floors[placement.task].offload.value(counts) <= spent * (1 + 1e-9)
    assert checked > 10, checked
    # a trainer's optimizer state is in the need of every task of its group unless offloaded
    group = ("reference", "actor_train")
    assert memory_need(floors, group, "reference", ()) == pytest.approx(
        floors["reference"].memory + floors["actor_train"].resident + floors["actor_train"].optimizer
    )
    assert memory_need(floors, group, "reference", {"actor_train"}) < memory_need(floors, group, "reference", ())


def test_the_generation_floor_adds_prefill_and_late_steps():
    """Generation's summed floor (decode reads + prefill FLOPs + the steps past the mean response, which every
    replica takes) is above each of its parts and below the cost model on random pools (floors_hold)."""
    w = Workload(algorithm="grpo", mode="sync", actor=ModelSpec(arch="qwen3-8b"), reward=ModelSpec(arch="qwen3-0.6b"))
    t = tables_for(cluster("uneven", UNEVEN), w)
    floor = task_floors(t)["generation"]
    [(parts, late)] = floor.sums
    assert late > 0 and len(parts) == 2
    counts = [c.size for c in t.classes]
    assert floor.value(counts) > max(r.value(counts) for r in floor.ratios)
    pools = enumerate_pools(t.classes, "host")
    assert floors_hold(t, random.Random(1).sample(pools, 15)) > 15


def test_the_training_floor_counts_gradient_accumulation():
    """Each training micro-batch adds its gradient into every weight's (forward.py): more micro-batches (smaller
    ones), more bytes in the floor; inference floors do not change."""
    spec = ModelSpec(arch="qwen3-1.7b")

    def floors(micro_batch: int):
        w = Workload(algorithm="ppo", mode="sync", actor=spec, critic=spec, micro_batch=micro_batch)
        return task_floors(tables_for(cluster("uneven", UNEVEN), w))

    one, eight = floors(1), floors(8)
    assert one["actor_train"].ratios[1].work > eight["actor_train"].ratios[1].work * 1.01
    assert one["reference"].ratios[1].work == pytest.approx(eight["reference"].ratios[1].work)


@pytest.mark.parametrize(("resp_mean", "resp_tail"), [(512.0, 1024.0), (300.0, 1500.0), (256.0, 256.0)])
@pytest.mark.parametrize(("n_seq", "batch"), [(1024.0, 256.0), (40.0, 64.0), (0.5, 1.0)])
def test_the_generation_floor_reads_kv_at_each_sequences_own_context(resp_mean, resp_tail, n_seq, batch):
    """The floor's KV tokens past the prompt (n·Rm·_own_context) are the cost model's, summed over its decode
    segments at their contexts (generation.py): never above them (a valid floor), and above n·Rm·Rm/2 (the
    floor before) wherever lengths vary; so are its decode attention FLOPs (same tokens, same contexts)."""
    from hetrl_cli.costmodel.generation import decode_segments, drain_contexts, drain_profile
    from hetrl_cli.planner.bound import _own_context

    segments = decode_segments(n_seq, batch, resp_mean, resp_tail, drain_profile(resp_mean, resp_tail))
    contexts = drain_contexts(resp_mean, resp_tail)
    contexts = contexts[len(contexts) - len(segments) :]
    model = sum(steps * live * ctx for (steps, live), ctx in zip(segments, contexts, strict=True))
    floor = n_seq * resp_mean * _own_context(resp_mean, resp_tail)
    # as many tokens as the floor's n·Rm: attention FLOPs, affine in the context, then add up the same way
    assert sum(steps * live for steps, live in segments) == pytest.approx(n_seq * resp_mean, rel=1e-9)
    assert floor <= model * (1 + 1e-9)
    assert floor == pytest.approx(model, rel=1e-6)
    if resp_tail > resp_mean:
        assert floor > n_seq * resp_mean * resp_mean / 2 * 1.05


def test_a_trainer_over_two_regions_adds_its_all_reduce():
    """A trainer whose devices span both regions with DP ≥ 2 pays its gradient all-reduce across them on top of
    its slowest replica (training.py). On every layout of every whole-host pool over both regions: the floor's
    all-reduce is below the cost model's (and within 2.1× of it on one: a floor 2.5× too high fails), the
    layout's time above the floor; and the floor adds it exactly where DP 1 cannot hold the devices."""
    from hetrl_cli.planner.space import host_chunks, layouts, max_pp_of, place

    spec = ModelSpec(arch="qwen3-1.7b")
    t = tables_for(cluster("uneven", UNEVEN), Workload(algorithm="ppo", mode="sync", actor=spec, critic=spec))
    floors = task_floors(t)
    tightest, forced = float("inf"), 0
    for pool in enumerate_pools(t.classes, "host"):
        counts = [w * c.per_host + p for (w, p), c in zip(pool, t.classes, strict=True)]
        if len({c.region for c, n in zip(t.classes, counts, strict=True) if n}) < 2:
            continue
        devices = allocate(t.classes, [pool])[0]
        chunks = host_chunks(devices, t.host_of)
        for task in ("actor_train", "critic_train"):
            fl = floors[task]
            floor = fl.allreduce_s(counts)
            for layout in layouts([len(c) for c in chunks], t.shapes[task], True, max_pp_of(task)):
                est = t.task_estimate(place(task, chunks, layout), ())
                if est.violation is not None:
                    continue
                assert fl.value(counts) <= est.cost.total_s * (1 + 1e-9), (task, pool, layout)
                if len(est.placement.replicas) > 1:
                    assert floor <= est.terms["dp_allreduce"] * (1 + 1e-9), (task, pool, layout)
                    tightest = min(tightest, est.terms["dp_allreduce"] / floor)
            held = [k for k, n in enumerate(counts) if n]
            if sum(counts) > min(fl.layout_tp[k] for k in held) * fl.depth:  # DP ≥ 2 on every layout
                forced += 1
                bare = dataclasses.replace(fl, wan_grad=0.0)
                assert fl.value(counts) == pytest.approx(bare.value(counts) + floor)
    assert tightest < 2.5, tightest
    assert forced > 5, forced


TWO_REGIONS = [  # 3-GPU hosts (TP 1): 18 devices need DP ≥ 2 (pp ≤ 16), so a trainer on both regions all-reduces
    {"gpu": "A100 80GB", "gpus_per_node": 3, "nodes": 3, "region": "r1"},
    {"gpu": "A100 80GB", "gpus_per_node": 3, "nodes": 3, "region": "r2"},
]


def test_the_relaxation_with_the_cross_region_all_reduce_is_below_the_ilp_optimum():
    """The full ILP's optimum trains over both regions with DP ≥ 2; the relaxation's all-reduce rows raise the
    bound of its grouping, which stays below the optimum, and the same rows 20× too high would exceed it."""
    from hetrl_cli.planner.bound import grouping_bound

    t = tables_for(cluster("two-regions", TWO_REGIONS), workload("grpo", "sync"))
    result, _space, _note = solve_ilp(t, Budget(60), granularity="host")
    assert result.status == "optimal" and result.options is not None and result.grouping is not None
    [trainer] = [p for opt in result.options for p in opt.placements if p.task == "actor_train"]
    region = {d: c.region for c in t.classes for host in c.devices for d in host}
    assert len(trainer.replicas) > 1 and len({region[d] for r in trainer.replicas for s in r for d in s}) == 2
    floors = task_floors(t)

    def bound(scale: float) -> float:
        scaled = {k: dataclasses.replace(f, wan_grad=f.wan_grad * scale) for k, f in floors.items()}
        return grouping_bound(t, scaled, result.grouping, time.monotonic() + 30, integer=True)[0]

    assert bound(0.0) < bound(1.0) <= result.objective * (1 + 1e-9)
    assert bound(20.0) > result.objective
    relaxed = space_bound(t, time.monotonic() + 30)
    assert relaxed.complete and 0 < relaxed.bound <= result.objective * (1 + 1e-9)


def test_a_grouping_whose_milp_reaches_the_cutoff_is_passed_over_at_it():
    """The MILP pass prunes at the least bound so far (`stop_at`): a grouping proven at or above it counts at
    the cutoff (never above its own bound), one below it gets its own bound as without a cutoff."""
    from hetrl_cli.planner.bound import CUTOFF_SLACK, cheap_bound, grouping_bound

    t = tables_for(cluster("two-regions", TWO_REGIONS), workload("grpo", "sync"))
    floors = task_floors(t)
    grouping = (("generation", "reference", "actor_train"),)

    def bound(stop_at: float) -> float:
        return grouping_bound(t, floors, grouping, time.monotonic() + 30, stop_at, integer=True)[0]

    own, cheap = bound(math.inf), cheap_bound(t, floors, grouping)
    assert cheap < own
    middle = (cheap + own) / 2  # above the cheap bound (which alone would pass the grouping over), below its own
    assert bound(middle) == pytest.approx(middle * (1 - CUTOFF_SLACK))
    assert bound(own * 2) == pytest.approx(own, rel=0.02)
