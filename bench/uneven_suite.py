"""Clusters and workloads unlike the paper's (issue 24, item 2): a seeded generator of settings, and the
planner checks that need no ILP optimum — never "infeasible" where a baseline plans, a real cause where
nothing does, and anytime over a ladder of --max-evals.

    .venv/bin/python bench/uneven_suite.py                      # 40 settings, ladder 32 64 128 256 512
    .venv/bin/python bench/uneven_suite.py --count 8 --ladder 32 128
    .venv/bin/python bench/uneven_suite.py --list               # the settings only, nothing planned
    .venv/bin/python bench/uneven_suite.py --ilp                # the exact solver: bound, gap, auto's estimate

Each setting (`settings(count, seed)`): 3–6 GPU types of V100, T4, A10G, L4, L40S, A100 40/80 GB, H100, H200
and RTX 4090; hosts of 1, 2, 3, 4, 5, 6 or 8 GPUs (one or two host sizes per type); 2–5 regions; WAN
0.5–10 Gbps; an actor of 1.7B–32B (qwen3 built-ins), a separate reward model of another size or a rule;
PPO or GRPO, sync or async. Other benches take `settings()` for their own checks (hybrid against the ILP).

Per setting: both baselines (plan, or the stated cause), the hybrid at each --max-evals of the ladder (seed
0), and the checks: `infeasible_with_baseline` (the hybrid exited 3 where a baseline planned), `worse`
(a larger --max-evals gave a worse plan), `none_in_message` (an exit-3 message with `None` in it). Writes
bench/results/uneven_suite.json and .md.

With `--ilp` (issue 24: the exact solver scales, auto's estimate, the hybrid against the ILP), per setting
that plans: `--solver ilp --budget 60s` (status, objective, certified bound and gap; the lazy ILP past 150
whole-host pools), auto's estimate of the ILP's seconds (`ilp.estimate_s`, on fresh tables) against the
seconds `solve_ilp` took inside that run where it finished (space enumerated, every grouping settled), and
the hybrid at `--budget 2s` and `10s` against the ILP's plan where the ILP proved it optimal. Writes
bench/results/uneven_ilp.json and .md.

With `--cost` (issue 24, item 5), per setting, the types without a catalog price at TEST_PRICES: the hybrid at
`--max-evals 128` under `--objective time` and `cost`, both again under `--max-cost-per-hour` 1.01x the cost
plan's $/hour, and under a cap of 0.01 $/h. Checks: the cost plan's $/iteration no higher than the time
plan's; under the cap the cost search keeps its plan, no plan is over the cap, the time search is no slower
than a plan it or the cost search found under the cap; the 0.01 cap exits 3 with one line naming a $/h and no
`None`. Writes bench/results/uneven_cost.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUS = ["V100", "T4", "A10G", "L4", "L40S", "A100 40GB", "A100 80GB", "H100 SXM", "H200", "RTX 4090"]
HOST_SIZES = [1, 2, 3, 4, 5, 6, 8]
ACTORS = ["qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]
REWARDS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", None]
LAN = {"bandwidth": "100Gbps", "latency": "0.1ms"}


def settings(count: int = 40, seed: int = 0) -> list[tuple[str, dict, dict]]:
    """`count` (name, cluster.yaml as a dict, workload as a dict) settings, the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        regions = [f"r{k}" for k in range(rng.randint(2, 5))]
        groups = []
        for gpu in rng.sample(GPUS, rng.randint(3, 6)):
            for size in rng.sample(HOST_SIZES, rng.randint(1, 2)):
                groups.append(
                    {"gpu": gpu, "gpus_per_node": size, "nodes": rng.randint(1, 2), "region": rng.choice(regions)}
                )
        for k, g in enumerate(groups):  # two groups of one type need their own host names
            g["name_prefix"] = f"g{k}-{g['gpu'].split()[0].lower()}"
        wan = {"bandwidth": f"{rng.choice([0.5, 1, 2, 5, 10])}Gbps", "latency": f"{rng.choice([5, 20, 60])}ms"}
        network = {"intra_region": LAN, "inter_region": {"default": wan}}
        cluster = {"name": f"u{i:02d}", "node_groups": groups, "network": network}
        actor = rng.choice(ACTORS)
        algorithm = rng.choice(["ppo", "grpo"])
        reward = rng.choice([r for r in REWARDS if r != actor])
        workload = {"algorithm": algorithm, "mode": rng.choice(["sync", "async"]), "actor": {"arch": actor}}
        if algorithm == "ppo":
            workload["critic"] = {"arch": actor}
        if reward is not None:
            workload["reward"] = {"arch": reward}
        out.append((cluster["name"], cluster, workload))
    return out


def run_setting(cluster: dict, workload_data: dict, ladder: list[int]) -> dict:
    """Baselines and the hybrid over the ladder on one setting; the checks."""
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.errors import Infeasible
    from hetrl_cli.planner.api import make_plan
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    row: dict = {"devices": len(profile.devices), "hosts": len(profile.hosts), "messages": []}

    def attempt(solver: str, **kw) -> float | None:
        try:
            return make_plan(profile, workload, solver=solver, budget_s=600, seed=0, **kw).cost.iteration_s
        except Infeasible as exc:
            row["messages"].append(f"{solver}: {exc}")
            return None

    start = time.monotonic()
    row["verl"], row["streamrl"] = attempt("verl"), attempt("streamrl")
    row["hybrid"] = {n: attempt("hybrid", max_evals=n) for n in ladder}
    row["seconds"] = time.monotonic() - start
    planned = [s for s in row["hybrid"].values() if s is not None]
    based = row["verl"] is not None or row["streamrl"] is not None
    row["infeasible_with_baseline"] = based and len(planned) < len(ladder)
    seq = [row["hybrid"][n] for n in ladder]
    row["worse"] = any(a is not None and (b is None or b > a * (1 + 1e-12)) for a, b in itertools.pairwise(seq))
    row["none_in_message"] = any("None" in m for m in row["messages"])
    return row


def run_ilp_setting(cluster: dict, workload_data: dict, ilp_budget: float = 60.0) -> dict:
    """The exact solver on one setting (module docstring, `--ilp`); `ilp.error` where it exits 3."""
    import hetrl_cli.planner.ilp as ilp_module
    import hetrl_cli.planner.lazy as lazy_module
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.errors import Infeasible
    from hetrl_cli.planner.api import check_feasible, make_plan
    from hetrl_cli.planner.space import count_pools, groupings
    from hetrl_cli.planner.tables import Tables
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(cluster)
    workload = Workload.model_validate(workload_data)
    tables = Tables(CostModel(profile, workload), profile, workload)
    row: dict = {"devices": len(profile.devices), "hosts": len(profile.hosts), "classes": len(tables.classes)}
    row["pools"] = count_pools(tables.classes, "host")
    try:
        check_feasible(tables)
    except Infeasible as exc:  # a task fits nowhere: exit 3 before any solver
        row["ilp"] = {"error": str(exc)}
        return row
    gran = ilp_module.choose_granularity(tables, 150)
    row["granularity"] = gran
    start = time.monotonic()
    row["estimate_s"] = None if gran is None else ilp_module.estimate_s(tables, gran)
    row["estimate_took_s"] = time.monotonic() - start
    if gran is not None:  # the estimate before issue 24: pools × Σ subset sizes × 15 calls × 0.5 ms (tables only)
        subsets = {g for gs in groupings(tables.tasks) for g in gs}
        row["old_estimate_s"] = count_pools(tables.classes, gran) * sum(len(s) for s in subsets) * 15 * 5e-4
    solve, took = lazy_module.solve_exact, {}

    def timed(*args, **kwargs):  # the seconds of the ILP itself inside make_plan (tables + MILPs)
        begin = time.monotonic()
        result = solve(*args, **kwargs)
        took["s"], took["space"] = time.monotonic() - begin, result[1]
        return result

    lazy_module.solve_exact = timed
    try:
        plan = make_plan(profile, workload, solver="ilp", budget_s=ilp_budget, seed=0)
    except Infeasible as exc:
        row["ilp"] = {"error": str(exc)}
        return row
    finally:
        lazy_module.solve_exact = solve
    s = plan.solver
    row["ilp"] = {"status": s.status, "objective": s.objective, "bound": s.bound, "gap": s.gap, "seconds": s.seconds,
                  "solve_s": took.get("s"), "lazy": "lazy ILP" in s.note, "note": s.note}  # fmt: skip
    finished = gran is not None and s.status == "optimal" and took.get("space") is not None
    row["measured_s"] = took.get("s") if finished else None
    row["ratio"] = row["estimate_s"] / row["measured_s"] if row["measured_s"] and row["estimate_s"] else None
    old = row.get("old_estimate_s")
    row["old_ratio"] = old / row["measured_s"] if row["measured_s"] and old else None
    for budget in (2, 10):
        hybrid = make_plan(profile, workload, solver="hybrid", budget_s=budget, seed=0)
        row[f"hybrid{budget}"] = hybrid.solver.objective
        row[f"quality{budget}"] = s.objective / hybrid.solver.objective if s.status == "optimal" else None
    return row


TEST_PRICES = {"T4": 0.53, "L4": 0.80, "L40S": 1.86}
"""$/GPU-hour for the suite's types the catalog has no list price for (tests/planner/test_heldout.py's)."""


def priced(cluster: dict) -> dict:
    """`cluster` with TEST_PRICES on the node groups of those types (the rest priced from the catalog)."""
    groups = [{**g, "price_per_gpu_hour": TEST_PRICES[g["gpu"]]} if g["gpu"] in TEST_PRICES else g
              for g in cluster["node_groups"]]  # fmt: skip
    return {**cluster, "node_groups": groups}


def run_cost_setting(cluster: dict, workload_data: dict, evals: int = 128) -> dict:
    """`--objective cost` and `--max-cost-per-hour` on one setting (module docstring, `--cost`): the hybrid at
    `evals` evaluations (deterministic) under each objective, under a cap 1.01x the cost plan's $/hour, and
    under a cap no plan meets (0.01 $/h); the checks."""
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.errors import Infeasible
    from hetrl_cli.planner.api import make_plan
    from hetrl_cli.profiling.catalog import profile_from_cluster

    profile = profile_from_cluster(priced(cluster))
    workload = Workload.model_validate(workload_data)

    def attempt(objective: str, cap: float | None = None) -> dict:
        try:
            plan = make_plan(profile, workload, solver="hybrid", budget_s=600, max_evals=evals, seed=0,
                             objective=objective, max_cost_per_hour=cap)  # fmt: skip
        except Infeasible as exc:
            return {"error": str(exc)}
        price = plan.price
        assert price is not None, "every device is priced"
        return {"s_it": plan.cost.iteration_s, "usd_h": price.usd_per_hour, "usd_it": price.usd_per_iteration}

    row: dict = {"time": attempt("time"), "cost": attempt("cost")}
    if "error" in row["cost"]:
        row["checks"] = ["cost_exit3_where_time_plans"] if "error" not in row["time"] else []
        return row
    cap = row["cost"]["usd_h"] * 1.01
    row["cap"] = cap
    row["capped_cost"], row["capped_time"] = attempt("cost", cap), attempt("time", cap)
    row["tiny_cap"] = attempt("cost", 0.01)
    row["checks"] = cost_checks(row, cap)
    return row


def cost_checks(row: dict, cap: float) -> list[str]:
    """What went wrong in `run_cost_setting`'s row (empty: each objective and cap behaved)."""
    bad, free, cost, time_ = [], row["cost"], row["capped_cost"], row["capped_time"]
    if "error" not in row["time"] and free["usd_it"] > row["time"]["usd_it"] * (1 + 1e-9):
        bad.append("cost_plan_dearer_than_time_plan")
    if "error" in cost or cost["usd_it"] > free["usd_it"] * (1 + 1e-9):
        bad.append("cap_lost_the_cost_plan")
    if any("error" not in p and p["usd_h"] > cap * (1 + 1e-12) for p in (cost, time_)):
        bad.append("over_cap")
    meets = [p["s_it"] for p in (free, cost, row["time"]) if "error" not in p and p["usd_h"] <= cap * (1 + 1e-12)]
    if "error" in time_ or time_["s_it"] > min(meets) * (1 + 1e-9):
        bad.append("capped_time_slower_than_a_plan_under_the_cap")
    tiny = row["tiny_cap"].get("error")
    if tiny is None:
        bad.append("tiny_cap_planned")
    elif "None" in tiny or "\n" in tiny or "$/h" not in tiny:
        bad.append("tiny_cap_message")
    return bad


def main_cost(args) -> None:
    rows = []
    for name, cluster, workload in settings(args.count, args.seed):
        if args.only and name not in args.only:
            continue
        start = time.monotonic()
        row = {"name": name, **run_cost_setting(cluster, workload)}
        rows.append(row)
        print(f"{name}: {time.monotonic() - start:.0f} s, {row['checks'] or 'ok'}, "
              f"time {row['time']} cost {row['cost']}", flush=True)  # fmt: skip
        summary = {"settings": len(rows), "planned": sum("error" not in r["cost"] for r in rows),
                   "failed": {r["name"]: r["checks"] for r in rows if r["checks"]}}  # fmt: skip
        out = Path(args.out).with_name(Path(args.out).name.replace("uneven_suite", "uneven_cost"))
        out.write_text(json.dumps({"summary": summary, "test_prices": TEST_PRICES, "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text(cost_markdown(rows))
    print(json.dumps(summary))


def cost_markdown(rows: list[dict]) -> str:
    head = ["setting", "time: s/it, $/h, $/it", "cost: s/it, $/h, $/it", "cap $/h", "capped cost", "capped time",
            "cap 0.01", "checks"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(p: dict | None) -> str:
        if p is None:
            return "–"
        return "exit 3" if "error" in p else f"{p['s_it']:.1f}, {p['usd_h']:.2f}, {p['usd_it']:.4f}"

    for r in rows:
        tiny = r.get("tiny_cap")
        cells = [r["name"], f(r["time"]), f(r["cost"]), f"{r['cap']:.2f}" if "cap" in r else "–",
                 f(r.get("capped_cost")), f(r.get("capped_time")),
                 "–" if tiny is None else ("exit 3" if "error" in tiny else "planned"),
                 ", ".join(r["checks"]) or "ok"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def ilp_summary(rows: list[dict]) -> dict:
    """The targets: a bound on every planned setting; auto's estimate within 2x; the hybrid against proofs."""
    planned = [r for r in rows if "status" in r.get("ilp", {})]
    proven = [r for r in planned if r["ilp"]["status"] == "optimal"]
    ratios = [r["ratio"] for r in planned if r["ratio"]]
    old = [r["old_ratio"] for r in planned if r.get("old_ratio")]
    out = {"settings": len(rows), "planned": len(planned),
           "with_bound": sum(r["ilp"]["bound"] is not None for r in planned),
           "lazy": sum(r["ilp"]["lazy"] for r in planned), "proven_optimal": len(proven),
           "gap_median": sorted(r["ilp"]["gap"] or 0.0 for r in planned)[len(planned) // 2] if planned else None,
           "estimate_within_2x": sum(0.5 <= x <= 2 for x in ratios), "estimates_compared": len(ratios),
           "old_estimate_within_2x": sum(0.5 <= x <= 2 for x in old)}  # fmt: skip
    for budget, target in ((10, 0.99), (2, 0.97)):
        good = [r for r in proven if r[f"quality{budget}"] is not None and r[f"quality{budget}"] >= target]
        out[f"hybrid{budget}_at_{target}"] = f"{len(good)}/{len(proven)}"
    return out


def ilp_markdown(rows: list[dict]) -> str:
    head = ["setting", "GPUs (hosts, classes)", "pools", "ILP status", "ILP s/it", "bound", "gap", "ILP solve s",
            "auto estimate s", "est/measured", "old est/measured", "hybrid@2s", "hybrid@10s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x, spec=".1f"):
        return "–" if x is None else format(x, spec)

    for r in rows:
        i = r["ilp"]
        if "status" not in i:
            lines.append(f"| {r['name']} | {r['devices']} | {r['pools']} | exit 3 |" + " |" * 9)
            continue
        q2 = "" if r["quality2"] is None else f" ({r['quality2']:.3f})"
        q10 = "" if r["quality10"] is None else f" ({r['quality10']:.3f})"
        status = i["status"] + (" (lazy)" if i["lazy"] else "")
        cells = [r["name"], f"{r['devices']} ({r['hosts']}, {r['classes']})", str(r["pools"]), status,
                 f(i["objective"]), f(i["bound"]), f(i["gap"], ".1%"), f(r["measured_s"]), f(r["estimate_s"]),
                 f(r["ratio"], ".2f"), f(r.get("old_ratio"), ".2f"), f(r["hybrid2"]) + q2,
                 f(r["hybrid10"]) + q10]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main_ilp(args) -> None:
    rows = []
    for name, cluster, workload in settings(args.count, args.seed):
        if args.only and name not in args.only:
            continue
        start = time.monotonic()
        row = {"name": name, **run_ilp_setting(cluster, workload)}
        rows.append(row)
        i = row["ilp"]
        print(f"{name}: {time.monotonic() - start:.0f} s, ilp {i.get('status')} {i.get('objective')} bound "
              f"{i.get('bound')} est {row.get('estimate_s')} measured {row.get('measured_s')} hybrid "
              f"{row.get('hybrid2')} {row.get('hybrid10')}", flush=True)  # fmt: skip
        summary = ilp_summary(rows)  # written after every setting: a cut-short run keeps what it measured
        out = Path(args.out).with_name(Path(args.out).name.replace("uneven_suite", "uneven_ilp"))
        out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
        out.with_suffix(".md").write_text(ilp_markdown(rows))
    print(json.dumps(ilp_summary(rows)))


def markdown(rows: list[dict], ladder: list[int]) -> str:
    head = [
        "setting",
        "GPUs (hosts)",
        "workload",
        "verl s/it",
        "streamrl s/it",
        *(f"hybrid@{n}" for n in ladder),
        "checks",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(x: float | None) -> str:
        return "exit 3" if x is None else f"{x:.1f}"

    for r in rows:
        w = r["workload"]
        label = f"{w['algorithm']} {w['mode']} {w['actor']['arch']}" + (
            f" + rm {w['reward']['arch']}" if "reward" in w else ""
        )
        bad = [k for k in ("infeasible_with_baseline", "worse", "none_in_message") if r[k]]
        cells = [r["name"], f"{r['devices']} ({r['hosts']})", label, fmt(r["verl"]), fmt(r["streamrl"])]
        cells += [fmt(r["hybrid"][n]) for n in ladder] + [", ".join(bad) or "ok"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ladder", type=int, nargs="*", default=[32, 64, 128, 256, 512])
    parser.add_argument("--list", action="store_true", help="print the settings and stop")
    parser.add_argument("--ilp", action="store_true", help="the exact solver's bound, auto's estimate, hybrid vs ILP")
    parser.add_argument("--cost", action="store_true", help="--objective cost and --max-cost-per-hour checks")
    parser.add_argument("--only", nargs="*", default=None, help="these settings only (names, e.g. u04 u13)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "uneven_suite.json"))
    args = parser.parse_args()
    if args.ilp:
        main_ilp(args)
        return
    if args.cost:
        main_cost(args)
        return
    rows = []
    for name, cluster, workload in settings(args.count, args.seed):
        if args.only and name not in args.only:
            continue
        if args.list:
            print(json.dumps({"name": name, "cluster": cluster, "workload": workload}))
            continue
        row = {"name": name, "cluster": cluster, "workload": workload, **run_setting(cluster, workload, args.ladder)}
        rows.append(row)
        ok = "ok" if not any(row[k] for k in ("infeasible_with_baseline", "worse", "none_in_message")) else "FAIL"
        print(f"{name}: {row['devices']} GPUs, {ok}, {row['seconds']:.0f} s, hybrid {row['hybrid']}", flush=True)
    if args.list:
        return
    summary = {k: sum(bool(r[k]) for r in rows) for k in ("infeasible_with_baseline", "worse", "none_in_message")}
    summary["settings"] = len(rows)
    summary["planned"] = sum(any(v is not None for v in r["hybrid"].values()) for r in rows)
    out = Path(args.out)
    out.write_text(json.dumps({"summary": summary, "ladder": args.ladder, "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, args.ladder))
    print(json.dumps(summary))
    sys.exit(0)


if __name__ == "__main__":
    main()
