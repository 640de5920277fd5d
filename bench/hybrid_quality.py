"""Hybrid search quality against the ILP optima already in bench/results/plan_suite.json (no ILP re-solve).

    .venv/bin/python bench/hybrid_quality.py                       # GRPO 4B/8B × sync/async × 4 scenarios, 2 s + 10 s
    .venv/bin/python bench/hybrid_quality.py --models 4b 8b 14b --algorithms grpo ppo --budgets 2 10 --jobs 2
    .venv/bin/python bench/hybrid_quality.py --max-evals 300        # a fixed evaluation budget (machine-independent)
    .venv/bin/python bench/hybrid_quality.py --compare BEFORE.json AFTER.json   # side by side, no run

Before vs after a change of the search: run this once with the old planner files in a copy of the tree
(PYTHONPATH=COPY/src) and once here, concurrently, so both see the same load; then --compare.

Ratio = ILP iteration seconds / hybrid iteration seconds (throughput ratio hybrid/ILP; ≥ 0.99 is the target where
the ILP status is `optimal`). Writes `--out` (.json) with every row and the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from plan_suite import MODES, SCENARIOS, workload  # noqa: E402


def run_one(args: tuple[str, str, str, str, float, int | None]) -> dict:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.planner.api import make_plan

    scenario, model, algorithm, mode, budget, max_evals = args
    profile = load_artifact(str(ROOT / "profiles" / f"paper-{scenario}.json"), ClusterProfile)
    start = time.monotonic()
    plan = make_plan(profile, workload(model, algorithm, mode), solver="hybrid", budget_s=budget, max_evals=max_evals)
    return {
        "scenario": scenario,
        "model": model,
        "algorithm": algorithm,
        "mode": mode,
        "budget_s": budget,
        "max_evals": max_evals,
        "iteration_s": plan.cost.iteration_s,
        "evaluations": plan.solver.evaluations,
        "wall_s": time.monotonic() - start,
        "groups": [list(g.tasks) for g in plan.groups],
        "note": plan.solver.note,
    }


def summarise(rows: list[dict]) -> dict:
    out = {}
    for key in sorted({(r["algorithm"], r["budget_s"], r["max_evals"]) for r in rows}, key=str):
        sel = [r for r in rows if (r["algorithm"], r["budget_s"], r["max_evals"]) == key and r.get("ratio")]
        ratios = sorted(r["ratio"] for r in sel)
        opt = sorted(r["ratio"] for r in sel if r["ilp_status"] == "optimal")
        label = f"{key[0]}@{key[2]} evals" if key[2] else f"{key[0]}@{key[1]:g}s"
        out[label] = {
            "n": len(ratios),
            "min": ratios[0] if ratios else None,
            "median": ratios[len(ratios) // 2] if ratios else None,
            "mean": sum(ratios) / len(ratios) if ratios else None,
            "ge_0.99_where_ilp_optimal": f"{sum(x >= 0.99 for x in opt)}/{len(opt)}",
            "wall_s_max": max(r["wall_s"] for r in sel) if sel else None,
        }
    return out


def compare(before: dict, after: dict) -> str:
    """A markdown table: per algorithm and budget, min / median / ≥0.99 (where the ILP is optimal) of both
    runs, and the settings where they differ by more than 1 %."""
    lines = ["| subset | before: min / median / ≥0.99 | after: min / median / ≥0.99 |", "|---|---|---|"]
    for label in sorted(set(before["summary"]) | set(after["summary"])):
        cells = []
        for run in (before, after):
            s = run["summary"].get(label)
            cells.append(f"{s['min']:.3f} / {s['median']:.3f} / {s['ge_0.99_where_ilp_optimal']}" if s else "—")
        lines.append(f"| {label} (n={after['summary'].get(label, {}).get('n', '?')}) | {cells[0]} | {cells[1]} |")
    key = lambda r: (r["scenario"], r["model"], r["algorithm"], r["mode"], r["budget_s"], r["max_evals"])  # noqa: E731
    old = {key(r): r for r in before["rows"]}
    lines.append("")
    for r in after["rows"]:
        b = old.get(key(r))
        if b and b.get("ratio") and r.get("ratio") and abs(b["ratio"] - r["ratio"]) > 0.01:
            lines.append(f"- {' '.join(map(str, key(r)[:5]))}s: {b['ratio']:.3f} → {r['ratio']:.3f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--models", nargs="*", default=["4b", "8b"])
    parser.add_argument("--algorithms", nargs="*", default=["grpo"])
    parser.add_argument("--budgets", type=float, nargs="*", default=[2.0, 10.0])
    parser.add_argument("--max-evals", type=int, default=None, help="fixed evaluations instead of wall-clock")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--suite", default=str(ROOT / "bench" / "results" / "plan_suite.json"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "hybrid_quality.json"))
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print two result files side by side")
    args = parser.parse_args()
    if args.compare:
        try:
            before, after = (json.loads(Path(f).read_text()) for f in args.compare)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"hybrid_quality: cannot read {args.compare}: {exc}") from None
        print(compare(before, after), end="")
        return
    suite = json.loads(Path(args.suite).read_text())
    ilp = {(r["scenario"], r["model"], r["algorithm"], r["mode"]): r["solvers"].get("ilp", {}) for r in suite["rows"]}
    budgets = [60.0] if args.max_evals else args.budgets
    jobs = [
        (s, m, a, mode, b, args.max_evals)
        for b in budgets
        for s in args.only
        for m in args.models
        for a in args.algorithms
        for mode in MODES
    ]
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(run_one, jobs):
            ref = ilp.get((row["scenario"], row["model"], row["algorithm"], row["mode"]), {})
            row["ilp_s"] = ref.get("iteration_s")
            row["ilp_status"] = ref.get("status")
            row["ratio"] = row["ilp_s"] / row["iteration_s"] if row["ilp_s"] else None
            rows.append(row)
            print(
                f"{row['scenario']:>20} {row['model']:>3} {row['algorithm']} {row['mode']:<5} "
                f"{row['budget_s']:g}s: {row['iteration_s']:.1f} s/it vs ilp {row['ilp_s']:.1f} "
                f"({row['ilp_status']}) ratio {row['ratio']:.3f} evals {row['evaluations']} wall {row['wall_s']:.1f}s",
                flush=True,
            )
    result = {"summary": summarise(rows), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
