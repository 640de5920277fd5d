"""The paper's 48 planning settings (PAPER.md §6): 4 network scenarios × Qwen3 4B/8B/14B × PPO/GRPO × sync/async
on the shipped profiles/paper-*.json. Predicted throughput of ilp, hybrid, verl and streamrl (one cost model),
their ratios, solve times and the ILP gap. Writes bench/results/plan_suite.json and plan_suite.md.

    .venv/bin/python bench/plan_suite.py                      # all 48, ILP 60 s, hybrid 2 s and 10 s
    .venv/bin/python bench/plan_suite.py --jobs 2 --ilp-budget 60
    .venv/bin/python bench/plan_suite.py --only single-region --models 8b   # a subset
    .venv/bin/python bench/plan_suite.py --algorithms ppo      # re-run PPO; GRPO rows of the old file kept

Rows of an existing `--out` file for settings not re-run are kept (each row says when it was measured), so
a subset refreshes the table without discarding the rest.

Workload (GSM8K-like): prompts_per_step 128 × 8 responses = 1024 samples, ≤1024 prompt + ≤1024 response
tokens, the same model size for actor, critic, reference and reward model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("single-region", "multi-region-hybrid", "multi-country", "multi-continent")
MODELS = ("4b", "8b", "14b")
ALGORITHMS = ("ppo", "grpo")
MODES = ("sync", "async")


def workload(model: str, algorithm: str, mode: str):
    from hetrl_cli.artifacts.workload import paper_workload

    return paper_workload(model, algorithm, mode)


def run_setting(args: tuple[str, str, str, str, float, list[float]]) -> dict:
    """One setting: every solver, each with its own budget; a failure is recorded, not raised."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.planner.api import make_plan

    scenario, model, algorithm, mode, ilp_budget, hybrid_budgets = args
    profile = load_artifact(str(ROOT / "profiles" / f"paper-{scenario}.json"), ClusterProfile)
    w = workload(model, algorithm, mode)
    row: dict = {"scenario": scenario, "model": model, "algorithm": algorithm, "mode": mode, "solvers": {}}
    runs = [("verl", "verl", 10.0), ("streamrl", "streamrl", 10.0), ("ilp", "ilp", ilp_budget)]
    runs += [(f"hybrid@{b:g}s", "hybrid", b) for b in hybrid_budgets]
    for label, solver, budget in runs:
        start = time.monotonic()
        try:
            plan = make_plan(profile, w, solver=solver, budget_s=budget, seed=0)
        except Exception as exc:  # recorded in the table
            row["solvers"][label] = {"error": f"{type(exc).__name__}: {exc}", "wall_s": time.monotonic() - start}
            continue
        row["solvers"][label] = {
            "iteration_s": plan.cost.iteration_s,
            "samples_per_s": plan.cost.samples_per_s,
            "status": plan.solver.status,
            "gap": plan.solver.gap,
            "bound": plan.solver.bound,
            "evaluations": plan.solver.evaluations,
            "wall_s": time.monotonic() - start,
            "groups": [g.tasks for g in plan.groups],
            "devices": sum(len(g.devices) for g in plan.groups),
            "note": plan.solver.note,
        }
    return row


def ratio(row: dict, a: str, b: str) -> float | None:
    sa, sb = row["solvers"].get(a, {}), row["solvers"].get(b, {})
    if "samples_per_s" not in sa or "samples_per_s" not in sb or not sb["samples_per_s"]:
        return None
    return sa["samples_per_s"] / sb["samples_per_s"]


def markdown(rows: list[dict], hybrid_labels: list[str]) -> str:
    head = (
        "| scenario | model | alg | mode | verl s/it | streamrl s/it | ilp s/it (status, gap, wall) | "
        + " | ".join(f"{h} s/it (wall)" for h in hybrid_labels)
        + " | ilp/verl | ilp/streamrl | "
        + " | ".join(f"{h}/ilp" for h in hybrid_labels)
        + " |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def cell(row, label):
        s = row["solvers"].get(label, {})
        return f"{s['iteration_s']:.1f}" if "iteration_s" in s else "—"

    def fmt(x):
        return "—" if x is None else f"{x:.2f}"

    for r in rows:
        ilp = r["solvers"].get("ilp", {})
        ilp_cell = "—"
        if "iteration_s" in ilp:
            gap = ilp["gap"]
            gap_txt = "—" if gap is None else f"{100 * gap:.1f}%"
            ilp_cell = f"{ilp['iteration_s']:.1f} ({ilp['status']}, {gap_txt}, {ilp['wall_s']:.0f}s)"
        hyb = " | ".join(f"{cell(r, h)} ({r['solvers'].get(h, {}).get('wall_s', 0):.1f}s)" for h in hybrid_labels)
        ratios = " | ".join(fmt(ratio(r, h, "ilp")) for h in hybrid_labels)
        lines.append(
            f"| {r['scenario']} | {r['model']} | {r['algorithm']} | {r['mode']} | {cell(r, 'verl')} | "
            f"{cell(r, 'streamrl')} | {ilp_cell} | {hyb} | {fmt(ratio(r, 'ilp', 'verl'))} | "
            f"{fmt(ratio(r, 'ilp', 'streamrl'))} | {ratios} |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: list[dict], hybrid_labels: list[str]) -> dict:
    out: dict = {}
    for scenario in SCENARIOS:
        for mode in MODES:
            sel = [r for r in rows if r["scenario"] == scenario and r["mode"] == mode]
            vs_verl = [x for r in sel if (x := ratio(r, "ilp", "verl")) is not None]
            vs_stream = [x for r in sel if (x := ratio(r, "ilp", "streamrl")) is not None]
            if vs_verl or vs_stream:
                out[f"{scenario}/{mode}"] = {
                    "ilp/verl": [min(vs_verl, default=None), max(vs_verl, default=None)],
                    "ilp/streamrl": [min(vs_stream, default=None), max(vs_stream, default=None)],
                }
    for h in hybrid_labels:
        vals = [x for r in rows if (x := ratio(r, h, "ilp")) is not None]
        proven = [
            x for r in rows if r["solvers"].get("ilp", {}).get("status") == "optimal" and (x := ratio(r, h, "ilp"))
        ]
        out[f"{h}/ilp"] = {
            "min": min(vals, default=None),
            "median": sorted(vals)[len(vals) // 2] if vals else None,
            "min_where_ilp_optimal": min(proven, default=None),
            "n": len(vals),
        }
    gaps = [r["solvers"]["ilp"]["gap"] for r in rows if r["solvers"].get("ilp", {}).get("gap") is not None]
    out["ilp_gap_max"] = max(gaps, default=None)
    out["ilp_optimal"] = sum(1 for r in rows if r["solvers"].get("ilp", {}).get("status") == "optimal")
    return out


def _key(row: dict) -> tuple[str, str, str, str]:
    return row["scenario"], row["model"], row["algorithm"], row["mode"]


def _merge(old_file: Path, rows: list[dict]) -> list[dict]:
    """New rows plus the old file's rows of settings not re-run, in the suite's setting order."""
    new = {_key(r): r for r in rows}
    old = json.loads(old_file.read_text())["rows"] if old_file.exists() else []
    merged = {**{_key(r): r for r in old}, **new}
    order = {k: i for i, k in enumerate(itertools.product(SCENARIOS, MODELS, ALGORITHMS, MODES))}
    return sorted(merged.values(), key=lambda r: order.get(_key(r), len(order)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--algorithms", nargs="*", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--ilp-budget", type=float, default=60.0)
    parser.add_argument("--hybrid-budgets", type=float, nargs="*", default=[2.0, 10.0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_suite"))
    args = parser.parse_args()
    settings = [
        (s, m, a, mode, args.ilp_budget, args.hybrid_budgets)
        for s in args.only
        for m in args.models
        for a in args.algorithms
        for mode in MODES
    ]
    start = time.monotonic()
    measured = time.strftime("%Y-%m-%d")
    rows: list[dict] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(run_setting, settings):
            row["measured"] = measured
            rows.append(row)
            ilp = row["solvers"].get("ilp", {})
            print(
                f"{row['scenario']:>20} {row['model']:>3} {row['algorithm']} {row['mode']:<5} "
                f"ilp={ilp.get('iteration_s', float('nan')):.1f}s ({ilp.get('status', ilp.get('error', '?'))})",
                flush=True,
            )
    labels = [f"hybrid@{b:g}s" for b in args.hybrid_budgets]
    rows = _merge(Path(args.out + ".json"), rows)
    result = {
        "settings": len(rows),
        "rerun": len(settings),
        "ilp_budget_s": args.ilp_budget,
        "hybrid_budgets_s": args.hybrid_budgets,
        "wall_s": time.monotonic() - start,
        "summary": summary(rows, labels),
        "rows": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text(markdown(rows, labels))
    print(json.dumps(result["summary"], indent=2))


if __name__ == "__main__":
    main()
