"""Planner scale: synthetic clusters of 8…1024 devices (profiling.catalog.synthetic_cluster), hybrid and ILP
solve time and quality. Writes bench/results/plan_scale.json and plan_scale.md.

    .venv/bin/python bench/plan_scale.py                       # 8 16 64 256 1024 devices, GRPO and PPO, 8B
    .venv/bin/python bench/plan_scale.py --devices 8 64 --algorithms grpo
    .venv/bin/python bench/plan_scale.py --devices 8 16 --recompute --out bench/results/plan_scale_small

Without recompute the cost model finds no layout of qwen3-8b actor_train on 8 or 16 synthetic GPUs
(activations of 8 × 2048-token micro-batches), so the small clusters are measured with recompute on.

The ILP runs with a 60 s budget (it reports 'too large' and falls back to the hybrid where its whole-host
pool space exceeds 150 pools); the hybrid runs with a 2 s and a 60 s budget (1024 devices: 60 s target).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(n: int, algorithm: str, budgets: list[float], ilp_budget: float, seed: int, recompute: bool = False) -> dict:
    from hetrl_cli.artifacts.workload import ModelSpec, Workload
    from hetrl_cli.planner.api import make_plan
    from hetrl_cli.profiling.catalog import synthetic_cluster

    profile = synthetic_cluster(n, seed)
    spec = ModelSpec(arch="qwen3-8b")
    w = Workload(algorithm=algorithm, actor=spec, critic=spec if algorithm == "ppo" else None, recompute=recompute)
    row: dict = {"devices": n, "hosts": len(profile.hosts), "algorithm": algorithm, "recompute": recompute}
    row["solvers"] = {}
    runs = [("verl", "verl", 60.0), ("streamrl", "streamrl", 60.0), ("ilp", "ilp", ilp_budget)]
    runs += [(f"hybrid@{b:g}s", "hybrid", b) for b in budgets]
    for label, solver, budget in runs:
        start = time.monotonic()
        try:
            plan = make_plan(profile, w, solver=solver, budget_s=budget, seed=0)
        except Exception as exc:
            row["solvers"][label] = {"error": f"{type(exc).__name__}: {exc}", "wall_s": time.monotonic() - start}
            continue
        row["solvers"][label] = {
            "iteration_s": plan.cost.iteration_s,
            "samples_per_s": plan.cost.samples_per_s,
            "status": plan.solver.status,
            "gap": plan.solver.gap,
            "evaluations": plan.solver.evaluations,
            "wall_s": time.monotonic() - start,
            "devices_used": sum(len(g.devices) for g in plan.groups),
            "note": plan.solver.note,
        }
        print(
            f"{n:>5} {algorithm} {label:>12}: {plan.cost.iteration_s:8.2f} s/it  {time.monotonic() - start:6.1f} s",
            flush=True,
        )
    return row


def markdown(rows: list[dict]) -> str:
    labels = sorted({k for r in rows for k in r["solvers"]}, key=lambda k: (k.startswith("hybrid"), k))
    head = "| devices | hosts | alg | " + " | ".join(f"{k} s/it (wall)" for k in labels) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = []
        for k in labels:
            s = r["solvers"].get(k, {})
            if "iteration_s" in s:
                extra = f", {s['status']}" + (f" gap {100 * s['gap']:.1f}%" if s.get("gap") is not None else "")
                cells.append(f"{s['iteration_s']:.1f} ({s['wall_s']:.1f}s{extra if k == 'ilp' else ''})")
            else:
                cells.append("error" if "error" in s else "—")
        lines.append(f"| {r['devices']} | {r['hosts']} | {r['algorithm']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="*", default=[8, 16, 64, 256, 1024])
    parser.add_argument("--algorithms", nargs="*", default=["grpo", "ppo"])
    parser.add_argument("--hybrid-budgets", type=float, nargs="*", default=[2.0, 60.0])
    parser.add_argument("--ilp-budget", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recompute", action="store_true", help="activation recomputation (8B fits 8–16 GPUs)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_scale"))
    args = parser.parse_args()
    rows = [
        run(n, a, args.hybrid_budgets, args.ilp_budget, args.seed, args.recompute)
        for n in args.devices
        for a in args.algorithms
    ]
    Path(args.out + ".json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    Path(args.out + ".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
