"""Issue 24's planner targets on held-out settings of the uneven suite (a seed no one tuned on): one summary
from the three runs' JSON, written to bench/results/uneven_seed<N>.json and .md.

    .venv/bin/python bench/uneven_suite.py --seed 1 --count 30 --out bench/results/uneven_suite_seed1.json
    .venv/bin/python bench/hybrid_uneven.py --seed 1 --count 30 --ilp-budget 120 --ladder 32 64 128 1024 \\
        --out bench/results/hybrid_uneven_seed1.json
    .venv/bin/python bench/uneven_suite.py --ilp --seed 1 --count 30 --only <the lazy settings> \\
        --out bench/results/uneven_suite_seed1.json        # writes uneven_ilp_seed1.json
    .venv/bin/python bench/uneven_suite.py --cost --seed 1 --count 30 --out bench/results/uneven_suite_seed1.json
    .venv/bin/python bench/heldout_report.py --seed 1

The first is deterministic (baselines, the hybrid over a --max-evals ladder: never infeasible where a
baseline plans, anytime, no `None`); the second runs the full ILP (≤ 150 whole-host pools) against the hybrid
at fixed evaluations and at 2 s / 10 s, and auto's estimate against the exact solver's CPU seconds; the third
the lazy ILP (past 150 pools) at 60 s against the hybrid at 2 s / 10 s; the fourth `--objective cost` and
`--max-cost-per-hour` (writes uneven_cost_seed1.json; seed 3 on). A missing file leaves its part out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def ladder_part(suite: dict) -> dict:
    """Baselines and the hybrid's ladder: the checks, and who plans."""
    rows = suite["rows"]
    planned = [r for r in rows if any(v is not None for v in r["hybrid"].values())]
    return {
        "settings": len(rows),
        "hybrid_plans": len(planned),
        "verl_plans": sum(r["verl"] is not None for r in rows),
        "streamrl_plans": sum(r["streamrl"] is not None for r in rows),
        "no_baseline_but_hybrid": [r["name"] for r in planned if r["verl"] is None and r["streamrl"] is None],
        "infeasible_with_baseline": [r["name"] for r in rows if r["infeasible_with_baseline"]],
        "worse_with_more_evals": [r["name"] for r in rows if r["worse"]],
        "none_in_message": [r["name"] for r in rows if r["none_in_message"]],
    }


def lazy_part(ilp: dict, full: dict | None) -> dict:
    """The lazy ILP at 60 s against the hybrid it starts from (never worse) and at 2 s / 10 s."""
    rows = [r for r in ilp["rows"] if "status" in r.get("ilp", {})]
    gaps = sorted(r["ilp"]["gap"] for r in rows if r["ilp"]["gap"] is not None)
    return {
        "settings": len(rows),
        "with_bound": sum(r["ilp"]["bound"] is not None for r in rows),
        "proven_optimal": sum(r["ilp"]["status"] == "optimal" for r in rows),
        "gap_median": gaps[len(gaps) // 2] if gaps else None,
        "gap_range": [gaps[0], gaps[-1]] if gaps else None,
        "ilp_worse_than_hybrid10": [r["name"] for r in rows if r["ilp"]["objective"] > r["hybrid10"] * (1 + 1e-9)],
        "ilp_over_hybrid10": {r["name"]: round(r["ilp"]["objective"] / r["hybrid10"], 3) for r in rows},
        "hybrid10_over_hybrid2": {r["name"]: round(r["hybrid10"] / r["hybrid2"], 3) for r in rows},
        "exit3": [r["name"] for r in ilp["rows"] if "error" in r.get("ilp", {})],
    }


def markdown(seed: int, summary: dict, hybrid: dict | None, ilp: dict | None, suite: dict | None) -> str:
    out = [f"# Held-out uneven settings (seed {seed})", "", "## Summary", "", "```json", json.dumps(summary, indent=2)]
    out += ["```", ""]
    for title, name in (
        ("Baselines and the hybrid's --max-evals ladder (uneven_suite.py)", f"uneven_suite_seed{seed}.md"),
        ("Full ILP (≤ 150 pools) vs the hybrid, auto's estimate (hybrid_uneven.py)", f"hybrid_uneven_seed{seed}.md"),
        ("Lazy ILP (> 150 pools) at 60 s against the hybrid (uneven_suite.py --ilp)", f"uneven_ilp_seed{seed}.md"),
        ("--objective cost and --max-cost-per-hour (uneven_suite.py --cost)", f"uneven_cost_seed{seed}.md"),
    ):  # fmt: skip
        path = RESULTS / name
        if path.exists():
            out += [f"## {title}", "", path.read_text().rstrip(), ""]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    suite = load(f"uneven_suite_seed{args.seed}.json")
    hybrid = load(f"hybrid_uneven_seed{args.seed}.json")
    ilp = load(f"uneven_ilp_seed{args.seed}.json")
    cost = load(f"uneven_cost_seed{args.seed}.json")
    summary: dict = {"seed": args.seed}
    if suite:
        summary["ladder"] = ladder_part(suite)
    if hybrid:
        summary["full_ilp"] = hybrid["summary"] | {"load": [round(r["load"], 1) for r in hybrid["rows"]]}
    if ilp:
        summary["lazy_ilp"] = lazy_part(ilp, hybrid)
    if cost:
        summary["cost"] = cost["summary"]
    out = RESULTS / f"uneven_seed{args.seed}.json"
    parts = {"summary": summary, "suite": suite, "full_ilp": hybrid, "lazy_ilp": ilp, "cost": cost}
    out.write_text(json.dumps(parts, indent=2))
    out.with_suffix(".md").write_text(markdown(args.seed, summary, hybrid, ilp, suite))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
