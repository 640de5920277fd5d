"""The hybrid against the ILP optimum on the uneven suite, and auto's estimate against the ILP's seconds
(issue 24, item 2), on the settings of bench/uneven_suite.py where the full ILP runs (≤ 150 whole-host pools)
and proves optimality.

    .venv/bin/python bench/hybrid_uneven.py                         # every such setting
    .venv/bin/python bench/hybrid_uneven.py --only u12 u14 --ladder 64 128
    .venv/bin/python bench/hybrid_uneven.py --reuse                 # ILP optima from the last run's JSON
    .venv/bin/python bench/hybrid_uneven.py --reuse --estimate-only # auto's estimate only, the rest reused
    .venv/bin/python bench/hybrid_uneven.py --seed 1 --count 30 --ilp-budget 60 \
        --out bench/results/hybrid_uneven_seed1.json                # held-out settings (another seed)

Per setting: `make_plan(solver="ilp", budget_s=120, seed=0)` (`--ilp-budget`) with the wall and process-CPU
seconds of the exact solver inside it (`lazy.solve_exact`: tables + MILPs, as `uneven_suite.py --ilp` times
it); auto's estimate (`planner/estimate.py`, in CPU seconds) made where auto makes it: after the hybrid's
start, on the tables it filled, just before the exact solver (`est/CPU` divides it by the exact solver's CPU
seconds plus the estimate's own: its sampled entries and the largest leaf it solves are then cached and the
solver does not redo them; with `--estimate-only`, by that sum from the last full run); the estimate on fresh
tables (`cold_estimate_s`, what auto saw before it ran the start first); the load average; the hybrid (seed 0)
at each `--max-evals` of the ladder (deterministic: independent of the machine and its load) and at `--budget
2s` and `10s` (wall clock: what a user gets, and what a loaded machine takes away), each with its evaluations
and CPU seconds. Ratio = ILP s/it ÷ hybrid s/it. Writes bench/results/hybrid_uneven.json and .md.

Each timed run starts after `gc.collect()`. Before 5000a1e a finished run's cost model was a reference cycle
(its memos' bound methods), so its memory was otherwise freed by a collection inside the next run's budget —
after u10's ILP, 0.45 CPU s, and its `--budget 2s` hybrid got 9 evaluations (the baseline's plan) instead of 37
(the optimum); now it is freed when dropped (tests/planner/test_plan_frees_memory.py). A user's `hetrl plan`
runs in a fresh process and never paid it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from uneven_suite import settings  # noqa: E402

OUT = ROOT / "bench" / "results" / "hybrid_uneven.json"


class _EstimateMade(Exception):
    """`--estimate-only`: stop where the exact solver would start."""


def exact(profile, workload, estimate_only: bool = False, ilp_budget_s: float = 120.0) -> dict:
    """The ILP's plan and the seconds (wall, CPU) of the exact solver inside `make_plan`; auto's estimate made
    where auto makes it (after the hybrid's start, on the tables it filled, its largest leaf cut off at the
    start's plan), just before the exact solver, and the CPU seconds it took (its sampled entries and solved
    leaf are then cached: `est_ratio` divides by both). `estimate_only`: the estimate, no exact solver."""
    import hetrl_cli.planner.ilp as ilp_module
    import hetrl_cli.planner.lazy as lazy_module
    from hetrl_cli.planner.api import AUTO_ILP_SHARE, make_plan
    from hetrl_cli.planner.estimate import LEAVES_PER_LARGEST

    solve, took = lazy_module.solve_exact, {}

    def timed(tables, budget, *args, **kwargs):
        cpu = time.process_time()
        limit_s = AUTO_ILP_SHARE * budget.remaining_s() / LEAVES_PER_LARGEST  # as auto's (api.choose_solver)
        parts = ilp_module.estimate_parts(
            tables, ilp_module.choose_granularity(tables, 150), kwargs.get("incumbent"), limit_s
        )
        took["estimate_cpu_s"] = time.process_time() - cpu
        took["estimate_s"] = parts.total_s
        took["estimate_parts"] = [parts.tables_s, parts.leaves_s, parts.missing, parts.largest_s]
        if estimate_only:
            raise _EstimateMade
        wall, cpu = time.monotonic(), time.process_time()
        result = solve(tables, budget, *args, **kwargs)
        took["wall_s"], took["cpu_s"] = time.monotonic() - wall, time.process_time() - cpu
        took["solver_and_estimate_cpu_s"] = took["cpu_s"] + took["estimate_cpu_s"]
        return result

    lazy_module.solve_exact = timed
    gc.collect()
    try:
        plan = make_plan(profile, workload, solver="ilp", budget_s=ilp_budget_s, seed=0)
    except _EstimateMade:
        return took
    finally:
        lazy_module.solve_exact = solve
    return {"status": plan.solver.status, "iteration_s": plan.cost.iteration_s, **took}


def hybrid(profile, workload, **budget) -> dict:
    from hetrl_cli.planner.api import make_plan

    gc.collect()  # each budget from a clean heap (before 5000a1e the last run's cost model was freed here)
    wall, cpu = time.monotonic(), time.process_time()
    plan = make_plan(profile, workload, solver="hybrid", seed=0, **budget)
    return {
        "iteration_s": plan.cost.iteration_s,
        "evaluations": plan.solver.evaluations,
        "wall_s": time.monotonic() - wall,
        "cpu_s": time.process_time() - cpu,
    }


def run_setting(
    cluster: dict,
    workload_data: dict,
    ladder: list[int],
    old: dict | None,
    estimate_only: bool = False,
    ilp_budget_s: float = 120.0,
) -> dict | None:
    """One setting's row, None where the full ILP does not run (too many pools, or a task fits nowhere);
    `estimate_only`: auto's estimate afresh, the rest from `old` (the last run's row)."""
    import hetrl_cli.planner.ilp as ilp_module
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.errors import Infeasible
    from hetrl_cli.planner.api import check_feasible
    from hetrl_cli.planner.tables import Tables
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    tables = Tables(CostModel(profile, workload), profile, workload)
    gran = ilp_module.choose_granularity(tables, 150)
    try:
        check_feasible(tables)
    except Infeasible:
        return None
    if gran is None:
        return None
    row: dict = {"devices": len(profile.devices), "classes": len(tables.classes), "granularity": gran}
    cpu = time.process_time()
    row["cold_estimate_s"] = ilp_module.estimate_s(tables, gran)  # on fresh tables (no hybrid start)
    row["estimate_took_s"] = time.process_time() - cpu
    row["load"] = os.getloadavg()[0]
    if old and estimate_only:  # the measured seconds from the last full run, the estimate afresh
        measured = old["ilp"].get("solver_and_estimate_cpu_s", old["ilp"]["cpu_s"] + old["ilp"]["estimate_cpu_s"])
        row["ilp"] = {**old["ilp"], **exact(profile, workload, True), "solver_and_estimate_cpu_s": measured}
    else:
        try:
            row["ilp"] = old["ilp"] if old else exact(profile, workload, ilp_budget_s=ilp_budget_s)
        except Infeasible as exc:  # every task fits somewhere, no plan found (seed 2's u11): no row to compare
            print(f"exit 3: {exc}", flush=True)
            return None
    i = row["ilp"]
    row["estimate_s"] = i.get("estimate_s", row["cold_estimate_s"])
    row["est_ratio"] = row["estimate_s"] / i["solver_and_estimate_cpu_s"] if i.get("cpu_s") else None
    if old and estimate_only:
        row["hybrid"] = old["hybrid"]
        return row
    row["hybrid"] = {f"{n} evals": hybrid(profile, workload, budget_s=600, max_evals=n) for n in ladder}
    row["hybrid"] |= {f"{b:g} s": hybrid(profile, workload, budget_s=b) for b in (2.0, 10.0)}
    for h in row["hybrid"].values():
        h["ratio"] = row["ilp"]["iteration_s"] / h["iteration_s"]
    return row


def summary(rows: list[dict]) -> dict:
    proven = [r for r in rows if r["ilp"]["status"] == "optimal"]
    out: dict = {"settings": len(rows), "proven_optimal": len(proven)}
    for key in proven[0]["hybrid"] if proven else []:
        for target in (0.99, 0.97):
            out[f"{key} >= {target}"] = f"{sum(r['hybrid'][key]['ratio'] >= target for r in proven)}/{len(proven)}"
    ratios = [r["est_ratio"] for r in proven if r.get("est_ratio")]
    out["estimate_within_2x_of_cpu"] = f"{sum(0.5 <= x <= 2 for x in ratios)}/{len(ratios)}"
    return out


def markdown(rows: list[dict]) -> str:
    keys = list(rows[0]["hybrid"]) if rows else []
    head = ["setting", "GPUs (classes)", "ILP s/it", "ILP wall / CPU s", "estimate s", "est/CPU", *keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        i = r["ilp"]
        cells = [r["name"], f"{r['devices']} ({r['classes']})", f"{i['iteration_s']:.2f} ({i['status']})",
                 f"{i.get('wall_s', 0):.1f} / {i.get('cpu_s', 0):.1f}", f"{r['estimate_s']:.1f}",
                 f"{r['est_ratio']:.2f}" if r.get("est_ratio") else "–"]  # fmt: skip
        cells += [f"{r['hybrid'][k]['ratio']:.3f} ({r['hybrid'][k]['evaluations']})" for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=None, help="these settings only (names, e.g. u04 u12)")
    parser.add_argument("--ladder", type=int, nargs="*", default=[32, 64, 128, 256, 1024])
    parser.add_argument("--reuse", action="store_true", help="take the ILP's optima from the last run's JSON")
    parser.add_argument("--estimate-only", action="store_true", help="with --reuse: only auto's estimate afresh")
    parser.add_argument("--seed", type=int, default=0, help="the suite's seed (uneven_suite.settings)")
    parser.add_argument("--count", type=int, default=40, help="the suite's settings (uneven_suite.settings)")
    parser.add_argument("--ilp-budget", type=float, default=120.0, help="the exact solver's --budget, seconds")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    out = Path(args.out)
    old = {r["name"]: r for r in json.loads(out.read_text())["rows"]} if args.reuse and out.exists() else {}
    rows = []
    for name, cluster, workload in settings(args.count, args.seed):
        if args.only and name not in args.only:
            continue
        row = run_setting(cluster, workload, args.ladder, old.get(name), args.estimate_only, args.ilp_budget)
        if row is None:
            continue
        rows.append({"name": name, **row})
        brief = {k: round(h["ratio"], 3) for k, h in row["hybrid"].items()}
        print(f"{name} (load {row['load']:.1f}): ilp {row['ilp']['iteration_s']:.2f} est {row['estimate_s']:.1f} cpu "
              f"{row['ilp'].get('cpu_s')} {brief}", flush=True)  # fmt: skip
        out.write_text(json.dumps({"summary": summary(rows), "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(rows))
    print(json.dumps(summary(rows), indent=2))


if __name__ == "__main__":
    main()
