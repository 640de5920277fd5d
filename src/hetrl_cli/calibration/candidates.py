"""Candidate plans on two devices, scored by the cost model: the plans `bench/validate_local.py` and the
calibration tests run to compare predicted with measured seconds (TP = PP = 1, what `hetrl run` executes).

Groups must use disjoint device sets, so on devices a, b the layouts are: everything on a; everything on
both (even or uneven shares); or the tasks split between a and b (every two-way partition)."""

from __future__ import annotations

from itertools import combinations

from hetrl_cli.artifacts.plan import Plan, SolverStats
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

Layout = list[tuple[tuple[str, ...], tuple[str, ...], tuple[float, ...]]]
"""[(tasks, devices, batch shares)]: one entry per group; every task of a group has one replica per device."""


def two_device_layouts(tasks: tuple[str, ...], a: str, b: str) -> dict[str, Layout]:
    """Named layouts of `tasks` on devices a and b (generation is always in the first group of a split)."""
    layouts: dict[str, Layout] = {
        "single": [(tasks, (a,), (1.0,))],
        "colocated-50": [(tasks, (a, b), (0.5, 0.5))],
        "colocated-25": [(tasks, (a, b), (0.25, 0.75))],
    }
    rest = [t for t in tasks if t != "generation"]
    for k in range(len(rest)):
        for extra in combinations(rest, k):
            first = ("generation", *extra)
            second = tuple(t for t in rest if t not in extra)
            name = "+".join(_short(t) for t in first) + "|" + "+".join(_short(t) for t in second)
            layouts[name] = [(first, (a,), (1.0,)), (second, (b,), (1.0,))]
    return layouts


def _short(task: str) -> str:
    return {"generation": "gen", "reference": "ref", "actor_train": "train", "critic_inference": "critic"}.get(
        task, task.replace("_train", "-train")
    )


def scored_plan(profile: ClusterProfile, workload: Workload, layout: Layout, name: str) -> Plan:
    """The layout as a Plan with the (uncalibrated) cost model's predictions."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.build import to_plan

    model = CostModel(profile, workload)
    groups, placements = [], []
    for i, (tasks, devices, shares) in enumerate(layout):
        groups.append(GroupPlacement(f"g{i}", tasks, devices))
        replicas = tuple(((d,),) for d in devices)
        placements += [TaskPlacement(t, replicas, batch_shares=shares) for t in tasks]
    estimate = model.evaluate(groups, placements)
    stats = SolverStats(solver="manual", status="heuristic", note=f"candidate layout {name}")
    return to_plan(model, estimate, groups, stats, name)


def candidate_plans(profile: ClusterProfile, workload: Workload, a: str, b: str) -> dict[str, Plan]:
    """Every two-device layout of the workload's planned tasks (rule-based reward needs no devices)."""
    from hetrl_cli.costmodel.model import CostModel

    tasks = CostModel(profile, workload).required_tasks
    layouts = two_device_layouts(tasks, a, b)
    return {name: scored_plan(profile, workload, layout, name) for name, layout in layouts.items()}
