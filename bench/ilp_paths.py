"""Speed of the ILP's two leaf paths on one paper setting (docs/planner.md, "Other MILP solvers"): the default
(the leaf's rows → arrays → HiGHS through highspy) against pyomo (the same rows → a pyomo model → a solver
pyomo drives, e.g. cbc).

Per repeat, on one cost table (built once, not timed): every leaf MILP of the space (one per grouping whose
cheap bound is finite, no cutoff: the set `--write-model` writes), each path's build and solve seconds summed
over the leaves (pyomo's solve includes writing the model for the solver and reading its answer back;
`solver_process_s` is the solver's own run where pyomo reports it); then the search itself (`solve_ilp`:
leaves in bound order, cutoffs, pruning) through each path, on warm tables. Medians over the repeats; each
leaf's optimum is checked to agree between the paths.

    .venv/bin/python bench/ilp_paths.py                       # single-region, 8B PPO sync, cbc, 3 repeats
    .venv/bin/python bench/ilp_paths.py --algorithm grpo --solver glpk --repeats 1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIP_GAP = 1e-4
"""HiGHS's default relative MIP gap: how far the two paths' leaf optima may differ."""


def leaves_once(tables, space, solver: str) -> dict:
    """Build and solve every leaf through both paths; seconds summed over the leaves."""
    from pyomo.opt import SolverFactory

    from hetrl_cli.planner.ilp import IlpModel, lower_bound, subspace
    from hetrl_cli.planner.ilp_pyomo import to_pyomo

    keys = ("rows_s", "highs_load_s", "highs_solve_s", "pyomo_build_s", "pyomo_solve_s", "solver_process_s")
    sums = dict.fromkeys(keys, 0.0)
    leaves, worst = 0, 0.0
    for grouping in space.groupings:
        if math.isinf(lower_bound(tables, space, grouping)):
            continue
        t0 = time.perf_counter()
        model = IlpModel(tables, subspace(space, grouping))
        t1 = time.perf_counter()
        highs = model.highs(600.0)
        t2 = time.perf_counter()
        highs.run()
        t3 = time.perf_counter()
        pm = to_pyomo(model)
        t4 = time.perf_counter()
        results = SolverFactory(solver).solve(pm, timelimit=600)
        t5 = time.perf_counter()
        process_s = float(getattr(results.solver, "time", math.nan) or math.nan)  # the solver itself, where known
        for key, seconds in zip(sums, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, process_s), strict=True):
            sums[key] += seconds
        direct, other = highs.getInfo().objective_function_value, pm.v[model.T].value
        worst = max(worst, abs(direct - other) / max(abs(direct), 1e-12))
        leaves += 1
    return {**sums, "leaves": leaves, "worst_relative_difference": worst}


def search_once(tables, solver: str) -> dict:
    """The ILP's search (solve_ilp) through each path; the tables are warm, so this is mostly the MILPs."""
    from hetrl_cli.planner.ilp import solve_ilp
    from hetrl_cli.planner.ilp_pyomo import pyomo_leaf_solver
    from hetrl_cli.planner.search import Budget

    out = {}
    for label, leaf_solver in (("direct", None), (solver, pyomo_leaf_solver(solver))):
        start = time.perf_counter()
        result, _space, _note = solve_ilp(tables, Budget(3600), leaf_solver=leaf_solver)
        out[f"search_{label}_s"] = time.perf_counter() - start
        out[f"search_{label}_objective"] = result.objective
    return out


def main() -> None:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.artifacts.workload import paper_workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.planner.ilp import build_space, choose_granularity
    from hetrl_cli.planner.tables import Tables

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="single-region")
    parser.add_argument("--model", default="8b")
    parser.add_argument("--algorithm", default="ppo", choices=("ppo", "grpo"))
    parser.add_argument("--mode", default="sync", choices=("sync", "async"))
    parser.add_argument("--solver", default="cbc", help="a pyomo MILP solver name")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    args = parser.parse_args()
    profile = load_artifact(str(ROOT / "profiles" / f"paper-{args.scenario}.json"), ClusterProfile)
    workload = paper_workload(args.model, args.algorithm, args.mode)
    tables = Tables(CostModel(profile, workload), profile, workload)
    start = time.perf_counter()
    space = build_space(tables, choose_granularity(tables, 150))
    tables_s = time.perf_counter() - start
    runs = [
        {**leaves_once(tables, space, args.solver), **search_once(tables, args.solver)} for _ in range(args.repeats)
    ]
    medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    medians["worst_relative_difference"] = max(run["worst_relative_difference"] for run in runs)
    result = {
        "setting": f"{args.scenario} {args.model} {args.algorithm} {args.mode}",
        "solver": args.solver,
        "tables_s": tables_s,
        "groupings": len(space.groupings),
        "repeats": args.repeats,
        "medians": medians,
        "runs": runs,
        "measured": time.strftime("%Y-%m-%d %H:%M"),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
