"""Where the lazy ILP's gap comes from (issue 24, item 2): the bound's weakness or the plan's.

    .venv/bin/python bench/gap_diagnosis.py u13 u29          # settings of bench/uneven_suite.py
    .venv/bin/python bench/gap_diagnosis.py --budget 10 u13
    .venv/bin/python bench/gap_diagnosis.py --bounds bench/results/uneven_ilp.json   # the bound now, per lazy setting
    .venv/bin/python bench/gap_diagnosis.py --bounds bench/results/uneven_ilp.json u13 u36   # only these
    .venv/bin/python bench/gap_diagnosis.py --lazy --seed 1 u10 u21   # the lazy ILP at 60 s: plan, bound, gap

Per setting: a plan (the hybrid at `--budget` s, seed 0), the relaxation bound (bound.space_bound, `--bound-s`),
and the bound's floors *at the plan's own devices* (each group's device counts per class, its grouping):
- `alloc` = the composed floors at the plan's allocation: if the plan's time is far above it, the floors miss
  what the plan pays (communication, bubbles, decode beyond the tail, weight sync) — the floors are weak;
- `bound` ≤ `alloc` where the relaxation found a cheaper (possibly unrealisable) split or grouping — the
  relaxation's freedom is the weakness;
and per task the plan's seconds by term against its floor there. Prints a JSON line per setting.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _plan_sync_floor(tables, grouping, plan) -> float:
    """bound.sync_floors at the plan's devices: a sync between groups at its WAN floor where the inference
    group holds a region the training group does not."""
    from hetrl_cli.planner.bound import sync_floors

    region = {d: c.region for c in tables.classes for host in c.devices for d in host}
    regions = [{region[d] for d in g.devices} for g in plan.groups]
    total = 0.0
    for f in sync_floors(tables, grouping):
        crosses = f.train >= 0 and bool(regions[f.infer] - regions[f.train])
        total += max(f.least, f.wan if crosses else 0.0)
    return total


def diagnose(cluster: dict, workload_data: dict, budget_s: float, bound_s: float = 20.0) -> dict:
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.api import make_plan
    from hetrl_cli.planner.bound import compose_floor, space_bound, task_floors
    from hetrl_cli.planner.tables import Tables
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    plan = make_plan(profile, workload, solver="hybrid", budget_s=budget_s, seed=0)
    tables = Tables(CostModel(profile, workload), profile, workload)
    floors = task_floors(tables)
    grouping = tuple(tuple(g.tasks) for g in plan.groups)
    counts = []
    for g in plan.groups:
        held = set(g.devices)
        counts.append([sum(d in held for host in c.devices for d in host) for c in tables.classes])
    per_group = [{t: floors[t].value(n) for t in g} for g, n in zip(grouping, counts, strict=True)]
    alloc = compose_floor(tables, grouping, per_group, _plan_sync_floor(tables, grouping, plan))
    relaxed = space_bound(tables, time.monotonic() + bound_s, plan.cost.iteration_s)
    tasks = {}
    for t in plan.tasks:
        floor = next(fs[t.task] for fs in per_group if t.task in fs)
        p = t.predicted
        tasks[t.task] = {
            "plan_s": round(p.total_s, 2), "floor_s": round(floor, 2), "comm_s": round(p.comm_s, 2),
            "bubble_s": round(p.bubble_s, 2), "memory_s": round(p.memory_s, 2), "compute_s": round(p.compute_s, 2),
            "other_s": round(p.other_s, 2), "tp": t.tp, "pp": t.pp, "dp": t.dp,
        }  # fmt: skip
    return {
        "plan_s": round(plan.cost.iteration_s, 2),
        "weight_sync_s": round(plan.cost.weight_sync_s, 2),
        "transfer_s": round(plan.cost.transfer_s, 2),
        "alloc_floor_s": round(alloc, 2),
        "bound_s": round(relaxed.bound, 2),
        "grouping_bound_s": round(relaxed.per_grouping.get(grouping, float("nan")), 2),
        "grouping": [list(g) for g in grouping],
        "tasks": tasks,
    }


def bound_now(cluster: dict, workload_data: dict, plan_s: float, seconds: float) -> dict:
    """The relaxation bound of this tree (bound.space_bound, `seconds`, the plan as incumbent) and its time."""
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.bound import space_bound
    from hetrl_cli.planner.tables import Tables
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    tables = Tables(CostModel(profile, workload), profile, workload)
    start = time.monotonic()
    relaxed = space_bound(tables, start + seconds, plan_s)
    return {"bound_s": relaxed.bound, "bound_took_s": time.monotonic() - start, "complete": relaxed.complete}


def lazy_run(cluster: dict, workload_data: dict, budget_s: float) -> dict:
    """`--solver ilp` (the lazy ILP past 150 whole-host pools) at `budget_s`, seed 0: plan, bound, gap, status,
    wall seconds, note."""
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.errors import Infeasible
    from hetrl_cli.planner.api import make_plan
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    start = time.monotonic()
    try:
        plan = make_plan(profile, workload, solver="ilp", budget_s=budget_s, seed=0)
    except Infeasible as exc:
        return {"infeasible": str(exc)[:120], "seconds": round(time.monotonic() - start, 1)}
    s = plan.solver
    return {
        "plan_s": s.objective, "bound_s": s.bound, "gap": s.gap, "status": s.status,
        "seconds": round(time.monotonic() - start, 1), "note": s.note,
    }  # fmt: skip


def main() -> None:
    from uneven_suite import settings

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--lazy", action="store_true", help="run --solver ilp at --ilp-s on the named settings")
    parser.add_argument("--ilp-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0, help="the suite's seed (settings(40, seed))")
    parser.add_argument("--bound-s", type=float, default=15.0, help="seconds of the relaxation bound per setting")
    parser.add_argument(
        "--bounds", help="an uneven_ilp.json: each lazy setting's bound now (--bound-s, its plan as incumbent) and gap"
    )
    args = parser.parse_args()
    if args.lazy:
        for name, cluster, workload in settings(40, args.seed):
            if name in args.names:
                row = {"name": name, "seed": args.seed, **lazy_run(cluster, workload, args.ilp_s)}
                print(json.dumps(row), flush=True)
        return
    if args.bounds:
        rows = {r["name"]: r for r in json.loads(Path(args.bounds).read_text())["rows"]}
        for name, cluster, workload in settings():
            ilp = rows.get(name, {}).get("ilp", {})
            if "lazy" not in str(ilp.get("note", "")) or (args.names and name not in args.names):
                continue
            now = bound_now(cluster, workload, ilp["objective"], args.bound_s)
            gap = 1 - now["bound_s"] / ilp["objective"]
            row = {"name": name, "plan_s": ilp["objective"], "bound_in_run_s": ilp["bound"], **now, "gap": gap}
            print(json.dumps(row), flush=True)
        return
    for name, cluster, workload in settings():
        if name in args.names:
            print(json.dumps({"name": name, **diagnose(cluster, workload, args.budget, args.bound_s)}), flush=True)


if __name__ == "__main__":
    main()
