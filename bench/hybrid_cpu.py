"""The hybrid's CPU seconds to its good plans (issue 24, item 2: a 2 s budget on a loaded box), one or two source
trees side by side.

    .venv/bin/python bench/hybrid_cpu.py --evals 256                        # this tree, every case, once
    .venv/bin/python bench/hybrid_cpu.py --trees /tmp/head/src src --repeats 3 --evals 256 --taskset 0
    .venv/bin/python bench/hybrid_cpu.py --only u12 --profile               # cProfile of one case (top 25)
    .venv/bin/python bench/hybrid_cpu.py --budget 2                         # wall-clock 2 s, not --max-evals
    .venv/bin/python bench/hybrid_cpu.py --trees OLD/src src --budget 2 --loads 1 4 8 --repeats 3 \
        --optima OPTIMA.json --only u04 u12 ...                             # 2 s under N busy loops each

Cases: the 9 settings of bench/uneven_suite.py where the ILP proves optimality (bench/hybrid_uneven.py's; with
`--optima FILE` their ILP optima under the first tree's cost model, worked out once into FILE, and each plan's
`ratio` = optimum ÷ its seconds per iteration) and the four paper profiles with the default workload and with a
PPO-async 8B one. Each run is its own process (`PYTHONPATH=TREE`, pinned with `taskset -c CPU` when asked; the
trees alternate run by run) and `make_plan(solver="hybrid", seed=0)` under `--max-evals` (deterministic: the same
plan on any machine and load) or a wall-clock `--budget`. Per run, in process CPU seconds from make_plan's start:
`first_1pc` (the first plan scored within 1 % of the run's final plan), `final` (the first time the final plan's
value was scored), `total` (make_plan whole), the plan's seconds per iteration and evaluations. Medians over
the repeats; the plans of the trees side by side (same, better, worse). `--loads N ...`: the whole run at each
load in turn, N busy loops (`nice -n 10`, as the runs themselves) beside it; per run also `first`, the CPU to its
first plan (a baseline's, as a rule), and `to_opt`, to its first plan within 1 % of the ILP optimum (with
`--optima`; the total where it found none).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROVEN = ["u04", "u07", "u10", "u12", "u14", "u16", "u18", "u23", "u32"]
PAPER = ["paper-single-region", "paper-multi-region-hybrid", "paper-multi-country", "paper-multi-continent"]
PPO_ASYNC = {"algorithm": "ppo", "mode": "async", "actor": {"arch": "qwen3-8b"}, "critic": {"arch": "qwen3-8b"},
             "reward": {"arch": "qwen3-8b"}}  # fmt: skip


def cases() -> list[str]:
    return PROVEN + PAPER + [f"{p}+ppo" for p in PAPER]


def load(case: str):
    """(profile, workload) of a case name."""
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.artifacts.workload import Workload

    if case.startswith("u"):
        sys.path.insert(0, str(ROOT / "bench"))
        from uneven_suite import settings

        from hetrl_cli.profiling.catalog import profile_from_cluster

        _, cluster, workload = next(s for s in settings() if s[0] == case)
        return profile_from_cluster(cluster), Workload.model_validate(workload)
    name, _, ppo = case.partition("+")
    profile = ClusterProfile.model_validate_json((ROOT / "profiles" / f"{name}.json").read_text())
    return profile, Workload.model_validate(PPO_ASYNC) if ppo else Workload()


def one(case: str, evals: int | None, budget_s: float, profile_top: int = 0) -> dict:
    """One run in this process: the timeline of the best plan scored so far (process CPU, through
    `Hybrid.evaluate`, which scores every genome: the screen's, the baselines', the search's)."""
    import hetrl_cli.planner.hybrid as hybrid_module
    from hetrl_cli.planner.api import make_plan

    profile, workload = load(case)
    timeline: list[tuple[float, float, int]] = []
    evaluate = hybrid_module.Hybrid.evaluate

    def watched(search, grouping, genome, budget):
        cand = evaluate(search, grouping, genome, budget)
        if cand.options is not None and (not timeline or cand.score < timeline[-1][1] - 1e-12):
            timeline.append((time.process_time() - cpu, cand.score, budget.evals))
        return cand

    hybrid_module.Hybrid.evaluate = watched
    cpu, wall = time.process_time(), time.monotonic()
    if profile_top:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        plan = prof.runcall(make_plan, profile, workload, solver="hybrid", budget_s=budget_s, max_evals=evals, seed=0)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile_top)
    else:
        from hetrl_cli.errors import Infeasible

        try:
            plan = make_plan(profile, workload, solver="hybrid", budget_s=budget_s, max_evals=evals, seed=0)
        except Infeasible as exc:  # a run that found no plan in its time (a loaded box): inf s/it, ratio 0
            total = time.process_time() - cpu
            return {"case": case, "iteration_s": math.inf, "evaluations": 0, "final": total, "first_1pc": total,
                    "total": total, "wall": time.monotonic() - wall, "load": os.getloadavg()[0],
                    "timeline": [(round(t, 3), s, n) for t, s, n in timeline], "error": str(exc)}  # fmt: skip
    total = time.process_time() - cpu
    final = plan.cost.iteration_s
    reached = [t for t, s, _ in timeline if s <= final * (1 + 1e-9)]
    near = [t for t, s, _ in timeline if s <= final * 1.01]
    return {
        "case": case,
        "iteration_s": final,
        "evaluations": plan.solver.evaluations,
        "final": reached[0] if reached else total,
        "first_1pc": near[0] if near else total,
        "total": total,
        "wall": time.monotonic() - wall,
        "load": os.getloadavg()[0],
        "timeline": [(round(t, 3), s, n) for t, s, n in timeline],
    }


def ilp_optimum(case: str) -> dict:
    """`--solver ilp --budget 120s` on an uneven case: its plan's seconds per iteration and status."""
    from hetrl_cli.planner.api import make_plan

    profile, workload = load(case)
    plan = make_plan(profile, workload, solver="ilp", budget_s=120, seed=0)
    return {"iteration_s": plan.cost.iteration_s, "status": plan.solver.status}


def ilp_optima(path: Path, tree: str, names: list[str]) -> dict[str, float]:
    """The ILP's proven optima of the uneven cases under `tree`'s cost model, worked out once into `path` (the
    cost model moves between sessions: bench/results/hybrid_uneven.json's are of its own run)."""
    known = json.loads(path.read_text()) if path.exists() else {}
    for case in [c for c in names if c in PROVEN and c not in known]:
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        cmd = [sys.executable, __file__, "--ilp-worker", case]
        known[case] = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        path.write_text(json.dumps(known, indent=1) + "\n")
    return {c: r["iteration_s"] for c, r in known.items() if r["status"] == "optimal"}


def spawn(tree: str, case: str, args) -> dict:
    cmd = ["nice", "-n", "10", sys.executable, __file__, "--worker", case, "--budget", str(args.budget)]
    if args.evals:
        cmd += ["--evals", str(args.evals)]
    if args.taskset is not None:
        cmd = ["taskset", "-c", str(args.taskset), *cmd]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{case} on {tree} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="*", default=[str(ROOT / "src")], help="src/ folders, run alternately")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--evals", type=int, default=None, help="--max-evals (deterministic); else --budget only")
    parser.add_argument("--budget", type=float, default=600.0, help="wall-clock seconds (with --evals: a cap)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--taskset", type=int, default=None, help="pin each run to this CPU")
    parser.add_argument("--profile", action="store_true", help="cProfile in this process (first case only)")
    parser.add_argument("--optima", default=None, help="JSON of the ILP's optima (worked out where missing)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ilp-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="write the runs and medians as JSON here")
    parser.add_argument("--loads", type=int, nargs="*", default=None, help="busy loops beside the runs, in turn")
    args = parser.parse_args()
    if args.ilp_worker:
        print(json.dumps(ilp_optimum(args.ilp_worker)))
        return
    if args.worker:
        print(json.dumps(one(args.worker, args.evals, args.budget)))
        return
    names = [c for c in cases() if not args.only or c in args.only]
    if args.profile:
        print(json.dumps(one(names[0], args.evals, args.budget, profile_top=25)))
        return
    optima = ilp_optima(Path(args.optima), args.trees[0], names) if args.optima else {}
    if args.loads is None:
        compare(names, optima, args, args.out)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops its busy loops (finally)
    for n in args.loads:
        loops = [subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        try:
            time.sleep(5)  # the load average follows
            print(f"== {n} busy loops", flush=True)
            compare(names, optima, args, args.out and args.out.replace(".json", f"_load{n}.json"))
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()


def compare(names: list[str], optima: dict[str, float], args, out: str | None) -> None:
    """Every case on every tree (alternating), its medians printed per line and every run written to `out`."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for case in names:
        for _ in range(args.repeats):
            for tree in args.trees:  # alternating, so the load falls on both alike
                runs.setdefault(case, {}).setdefault(tree, []).append(spawn(tree, case, args))
        cells = []
        for tree in args.trees:
            got = runs[case][tree]
            if case in optima:
                for r in got:
                    r["ratio"] = optima[case] / r["iteration_s"]
                    near = [t for t, s, _ in r["timeline"] if optima[case] / s >= 0.99]
                    r["to_opt"] = near[0] if near else r["total"]
            for r in got:
                r["first"] = r["timeline"][0][0] if r["timeline"] else r["total"]
            keys = ("first", "first_1pc", "final", "total", "load") + (("to_opt",) if case in optima else ())
            med = {k: statistics.median(r[k] for r in got) for k in keys}
            plans = sorted({round(r["iteration_s"], 9) for r in got})
            ratios = " ratio " + "/".join(f"{r['ratio']:.3f}" for r in got) if case in optima else ""
            opt = f"to opt: {med['to_opt']:.2f} " if "to_opt" in med else ""
            cells.append(f"{plans} s/it{ratios} evals {'/'.join(str(r['evaluations']) for r in got)} "
                         f"first: {med['first']:.2f} 1%: {med['first_1pc']:.2f} final: {med['final']:.2f} "
                         f"total: {med['total']:.2f} {opt}"
                         f"load {med['load']:.1f}")  # fmt: skip
        print(case, " || ".join(cells), flush=True)
        if out:
            Path(out).write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
