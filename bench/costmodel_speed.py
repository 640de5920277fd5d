"""CostModel speed: µs per task() call (uncached and cached) and per evaluate() call, medians of repeats.

    .venv/bin/python bench/costmodel_speed.py                                  # current model only
    .venv/bin/python bench/costmodel_speed.py --baseline /tmp/model_orig.py    # side by side with an old model.py

Workload: Qwen3-8B PPO (sync) on profiles/paper-multi-region-hybrid.json (64 GPUs, 3 regions); the seeded
random placements of tests/costmodel/speed_cases.py (alone, with colocated task names, with colocated
placements, given shares/splits, offload). `uncached` = a fresh CostModel per pass (every cache empty),
`cached` = the same calls again on a warm model. Times are process CPU time (time.process_time), so other
load on a shared machine inflates them less; the two models alternate pass by pass. Writes
bench/results/costmodel_speed.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.costmodel import speed_cases  # noqa: E402

from hetrl_cli.costmodel.model import CostModel  # noqa: E402


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("hetrl_costmodel_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.CostModel


def one_pass(model_cls, prof, w, cases, plans) -> dict[str, float]:
    """µs per call of: task() on a fresh model, task() again (warm), evaluate() on a fresh model, again."""
    cm = model_cls(prof, w)
    t0 = time.process_time()
    for p, g in cases:
        cm.task(p, g)
    t1 = time.process_time()
    for p, g in cases:
        cm.task(p, g)
    t2 = time.process_time()
    cm = model_cls(prof, w)
    t3 = time.process_time()
    for groups, placements in plans:
        cm.evaluate(groups, placements)
    t4 = time.process_time()
    for groups, placements in plans:
        cm.evaluate(groups, placements)
    t5 = time.process_time()
    n, m = len(cases), len(plans)
    return {
        "task_uncached_us": 1e6 * (t1 - t0) / n,
        "task_cached_us": 1e6 * (t2 - t1) / n,
        "evaluate_uncached_us": 1e6 * (t4 - t3) / m,
        "evaluate_cached_us": 1e6 * (t5 - t4) / m,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="path of an older model.py to time side by side")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tasks", type=int, default=600)
    ap.add_argument("--plans", type=int, default=60)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "costmodel_speed.json"))
    args = ap.parse_args()
    prof = speed_cases.profile()
    w, _ = speed_cases.workloads()["ppo-8b"]
    cases = speed_cases.task_cases(11, speed_cases.PPO_TASKS, args.tasks, prof)
    plans = speed_cases.plan_cases(12, speed_cases.PPO_TASKS, args.plans, prof)
    models = {"current": CostModel}
    if args.baseline:
        models = {"baseline": load_baseline(args.baseline), "current": CostModel}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in models}
    for _ in range(args.repeats):
        for name, cls in models.items():  # alternate so both see the same machine load
            runs[name].append(one_pass(cls, prof, w, cases, plans))
    result = {
        "workload": "qwen3-8b ppo sync, paper-multi-region-hybrid (64 GPUs)",
        "task_calls": len(cases),
        "evaluate_calls": len(plans),
        "repeats": args.repeats,
        "clock": "time.process_time, median of repeats",
        "models": {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()},
    }
    if args.baseline:
        base, cur = result["models"]["baseline"], result["models"]["current"]
        result["speedup"] = {k: base[k] / cur[k] for k in cur}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, m in result["models"].items():
        print(f"{name:9s} " + "  ".join(f"{k}={v:9.1f}" for k, v in m.items()))
    if "speedup" in result:
        print("speedup   " + "  ".join(f"{k}={v:8.2f}x" for k, v in result["speedup"].items()))


if __name__ == "__main__":
    main()
