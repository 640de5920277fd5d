"""What a finished `make_plan` leaves to the cyclic garbage collector, and what the cost model's memos cost.

    git show 5000a1e~1:src/hetrl_cli/costmodel/memo.py > /tmp/memo_old.py
    git show 5000a1e~1:src/hetrl_cli/planner/screen.py > /tmp/screen_old.py
    .venv/bin/python bench/plan_gc.py --baseline-memo /tmp/memo_old.py --baseline-screen /tmp/screen_old.py

Per repeat, the baseline (the old `Memo` and the screen's old `_branch_and_bound`, patched in) and the current
code alternate: `make_plan(solver=ilp, budget_s=120)` on the uneven suite's u10 (bench/uneven_suite.py), its
process CPU seconds (a `gc.collect()` before, untimed), then the result dropped and `gc.collect()`'s CPU seconds
and unreachable objects; then bench/costmodel_speed.py's pass (task() and evaluate() µs, fresh and warm). Medians
of repeats. Writes bench/results/plan_gc.json; `--current-first` runs each pair the other way round
(bench/results/plan_gc_current_first.json was run so, with `--repeats 7 --out`).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from costmodel_speed import one_pass  # noqa: E402
from tests.costmodel import speed_cases  # noqa: E402
from uneven_suite import settings  # noqa: E402

MEMO_USERS = ("devices", "forward", "generation", "model", "step", "tasks", "weightsync")


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def variants(memo_path: str | None, screen_path: str | None) -> dict[str, dict]:
    """name → {module: {attribute: value}} to patch in before a pass (the current code's own values too)."""
    import importlib

    import hetrl_cli.planner.screen as screen

    users = {f"hetrl_cli.costmodel.{m}": importlib.import_module(f"hetrl_cli.costmodel.{m}") for m in MEMO_USERS}
    current = {name: {"Memo": mod.Memo} for name, mod in users.items()}
    current["hetrl_cli.planner.screen"] = {"_branch_and_bound": screen._branch_and_bound}
    out = {"current": current}
    if memo_path or screen_path:
        base = {}
        if memo_path:
            base |= {name: {"Memo": load(memo_path, "hetrl_memo_baseline").Memo} for name in users}
        if screen_path:
            old = load(screen_path, "hetrl_screen_baseline")._branch_and_bound
            base["hetrl_cli.planner.screen"] = {"_branch_and_bound": old}
        out = {"baseline": base, "current": current}
    return out


def patch(attrs: dict) -> None:
    for module, values in attrs.items():
        for attr, value in values.items():
            setattr(sys.modules[module], attr, value)


def plan_pass(profile, workload) -> dict[str, float]:
    from hetrl_cli.planner.api import make_plan

    gc.collect()
    cpu = time.process_time()
    plan = make_plan(profile, workload, solver="ilp", budget_s=120, seed=0)
    plan_cpu = time.process_time() - cpu
    del plan
    cpu = time.process_time()
    unreachable = gc.collect()
    return {"make_plan_cpu_s": plan_cpu, "gc_collect_cpu_s": time.process_time() - cpu, "unreachable": unreachable}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-memo", help="an older costmodel/memo.py")
    ap.add_argument("--baseline-screen", help="an older planner/screen.py")
    ap.add_argument("--setting", default="u10")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--current-first", action="store_true", help="each pair: the current code, then the baseline")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_gc.json"))
    args = ap.parse_args()
    from hetrl_cli.artifacts.workload import Workload
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.profiling.catalog import profile_from_cluster

    cluster, workload_data = next((c, w) for n, c, w in settings() if n == args.setting)
    profile, workload = profile_from_cluster(cluster), Workload.model_validate(workload_data)
    prof = speed_cases.profile()
    w, _ = speed_cases.workloads()["ppo-8b"]
    cases = speed_cases.task_cases(11, speed_cases.PPO_TASKS, 600, prof)
    plans = speed_cases.plan_cases(12, speed_cases.PPO_TASKS, 60, prof)
    models = variants(args.baseline_memo, args.baseline_screen)
    if args.current_first:
        models = dict(reversed(list(models.items())))
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in models}
    for _ in range(args.repeats):
        for name, attrs in models.items():  # alternate so both see the same machine load
            patch(attrs)
            gc.collect()
            row = plan_pass(profile, workload) | one_pass(CostModel, prof, w, cases, plans)
            runs[name].append(row)
            print(name, {k: round(v, 4) for k, v in row.items()}, flush=True)
    patch(models["current"])
    result = {
        "setting": f"{args.setting} make_plan(solver=ilp, budget_s=120); costmodel_speed's ppo-8b task/evaluate",
        "repeats": args.repeats,
        "order": list(models),
        "clock": "time.process_time, median of repeats, the variants alternating",
        "models": {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()},
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, m in result["models"].items():
        print(f"{name:9s} " + "  ".join(f"{k}={v:.4g}" for k, v in m.items()))


if __name__ == "__main__":
    main()
