"""How well the cost model predicts real runs on this machine, before and after calibration.

On localhost with slots=2 (devices localhost/0, localhost/1): the tiny GRPO (sync and async) and PPO (sync)
workloads, six candidate two-device layouts each (calibration/candidates.py), every one run for STEPS steps
with the real runtime. Calibration is cross-fitted: the runs are split into two folds by layout, and each
run's calibrated prediction comes from the calibration fitted on the *other* fold (never on itself).

    .venv/bin/python bench/validate_local.py            # ~5 min on 2 cores
    → bench/results/validate_local.json (docs/benchmarks.md quotes it)
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import Workload, load_workload
from hetrl_cli.calibration.candidates import candidate_plans
from hetrl_cli.calibration.fit import fit_calibration
from hetrl_cli.calibration.inputs import run_engine
from hetrl_cli.calibration.validate import abs_error_stats, load_run, validate_run
from hetrl_cli.planner.build import rescore
from hetrl_cli.runtime.api import RunOptions, run_plan

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "validate_local.json"
STEPS = 6
WARMUP = 1
D0, D1 = "localhost/0", "localhost/1"
GRPO_LAYOUTS = ("single", "colocated-50", "colocated-25", "gen|ref+train", "gen+ref|train", "gen+train|ref")
PPO_LAYOUTS = (
    "single",
    "colocated-50",
    "colocated-25",
    "gen|ref+critic+train+critic-train",
    "gen+ref+critic|train+critic-train",
    "gen+train+critic-train|ref+critic",
)
FOLD_A = {"single", "colocated-25", "gen+ref|train", "gen+ref+critic|train+critic-train"}
"""Layouts of fold A; the others are fold B. Each fold is calibrated on the other's runs."""


def workloads() -> dict[str, Workload]:
    base = load_workload(REPO / "examples" / "tiny-grpo.yaml").model_dump()
    grpo_async = {**base, "name": "tiny-grpo-async", "mode": "async"}
    ppo = {**base, "name": "tiny-ppo", "algorithm": "ppo", "critic": {"arch": "tiny"}}
    return {
        "grpo-sync": Workload.model_validate(base),
        "grpo-async": Workload.model_validate(grpo_async),
        "ppo-sync": Workload.model_validate(ppo),
    }


def make_profile(work: Path) -> ClusterProfile:
    (work / "hosts.txt").write_text("localhost slots=2\n")
    hetrl = str(Path(sys.executable).with_name("hetrl"))
    subprocess.run([hetrl, "profile", "hosts.txt", "-o", "profile.json"], cwd=work, check=True, capture_output=True)
    return load_artifact(work / "profile.json", ClusterProfile)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ with average ranks for ties (Pearson correlation of the ranks)."""

    def ranks(v: list[float]) -> np.ndarray:
        a = np.asarray(v, dtype=float)
        order = a.argsort(kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for value in np.unique(a):
            tie = a == value
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def run_all(profile: ClusterProfile, work: Path) -> list[dict]:
    runs = []
    for wl_name, wl in workloads().items():
        plans = candidate_plans(profile, wl, D0, D1)
        for layout in PPO_LAYOUTS if wl.algorithm == "ppo" else GRPO_LAYOUTS:
            plan = plans[layout].model_copy(update={"name": f"{wl_name}:{layout}"})
            run_dir = work / "runs" / f"{wl_name}-{len(runs):02d}"
            start = time.monotonic()
            run_plan(plan, RunOptions(steps=STEPS, run_dir=run_dir, engine="hf", echo=lambda _line: None))
            wall = time.monotonic() - start
            print(f"{wl_name:10s} {layout:40s} {wall:5.1f} s", file=sys.stderr, flush=True)
            runs.append({"workload": wl_name, "layout": layout, "run_dir": run_dir, "wall_s": wall})
    return runs


def cross_fit(profile: ClusterProfile, runs: list[dict]) -> dict[str, dict]:
    """Calibration of each fold, fitted on the other fold's runs."""
    fits = {}
    for fold in ("A", "B"):
        train = [r for r in runs if (r["layout"] in FOLD_A) != (fold == "A")]
        data = [(r["run_dir"].name, *load_run(r["run_dir"]), run_engine(r["run_dir"])) for r in train]  # as it ran
        fits[fold] = fit_calibration(data, profile, WARMUP)
    return fits


def run_errors(before, after) -> dict:
    """One run's step and per-task seconds, measured and predicted before/after calibration, with the errors."""
    tasks = {
        c.task: {"measured_s": c.measured_s, "before_s": c.predicted_s, "after_s": a.predicted_s,
                 "error_before": c.error, "error_after": a.error}
        for c, a in zip(before.tasks, after.tasks, strict=True)
    }  # fmt: skip
    return {
        "measured_step_s": before.iteration.measured_s,
        "predicted_step_s_before": before.iteration.predicted_s,
        "predicted_step_s_after": after.iteration.predicted_s,
        "step_error_before": before.iteration.error,
        "step_error_after": after.iteration.error,
        "tasks": tasks,
    }


def evaluate(profile: ClusterProfile, runs: list[dict], fits: dict) -> list[dict]:
    rows = []
    for r in runs:
        fold = "A" if r["layout"] in FOLD_A else "B"
        before = validate_run(r["run_dir"], WARMUP, write=False)
        plan, _ = load_run(r["run_dir"])
        scored = rescore(plan, profile, calibration=fits[fold].factors(), engine=run_engine(r["run_dir"]))
        after = validate_run(r["run_dir"], WARMUP, scored=scored, predictions=f"calibration fold {fold}", write=False)
        rows.append({"workload": r["workload"], "layout": r["layout"], "fold": fold,
                     "wall_s": round(r["wall_s"], 1), **run_errors(before, after)})  # fmt: skip
    return rows


def summarise(rows: list[dict]) -> dict:
    """Per task and per workload: median and p90 |error| before/after; Spearman of plan rankings."""
    out: dict = {"per_task": {}, "per_workload": {}, "all_tasks": {}}
    names = sorted({t for r in rows for t in r["tasks"]})
    for side in ("before", "after"):
        every = [v[f"error_{side}"] for r in rows for v in r["tasks"].values() if v[f"error_{side}"] is not None]
        med, p90 = abs_error_stats(every)
        out["all_tasks"][side] = {"median_abs_error": med, "p90_abs_error": p90, "n": len(every)}
    for task in names:
        out["per_task"][task] = {}
        for side in ("before", "after"):
            errs = [r["tasks"][task][f"error_{side}"] for r in rows if task in r["tasks"]]
            med, p90 = abs_error_stats([e for e in errs if e is not None])
            out["per_task"][task][side] = {"median_abs_error": med, "p90_abs_error": p90, "n": len(errs)}
    for wl in sorted({r["workload"] for r in rows}):
        mine = [r for r in rows if r["workload"] == wl]
        measured = [r["measured_step_s"] for r in mine]
        entry = {"plans": len(mine)}
        for side in ("before", "after"):
            predicted = [r[f"predicted_step_s_{side}"] for r in mine]
            med, p90 = abs_error_stats([r[f"step_error_{side}"] for r in mine])
            entry[side] = {"spearman": spearman(predicted, measured), "step_median_abs_error": med, "step_p90": p90}
        entry["fastest_measured"] = min(mine, key=lambda r: r["measured_step_s"])["layout"]
        entry["fastest_predicted_after"] = min(mine, key=lambda r: r["predicted_step_s_after"])["layout"]
        out["per_workload"][wl] = entry
    return out


def main() -> None:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hetrl-validate-") as tmp:
        work = Path(tmp)
        profile = make_profile(work)
        runs = run_all(profile, work)
        fits = cross_fit(profile, runs)
        rows = evaluate(profile, runs, fits)
        calibrations = {fold: json.loads(cal.model_dump_json()) for fold, cal in fits.items()}
        for cal in calibrations.values():
            cal.pop("residuals")
        result = {
            "command": ".venv/bin/python bench/validate_local.py",
            "machine": f"{platform.node()}: {profile.devices[0].name}, 2 devices of {profile.devices[0].cores} core",
            "steps": STEPS,
            "warmup": WARMUP,
            "engine": "hf",
            "profile_fingerprint": profile.fingerprint,
            "measured_tflops_fp32": profile.devices[0].measured_tflops.get("fp32"),
            "folds": {"A": sorted(FOLD_A), "B": "the other layouts"},
            "calibrations": calibrations,
            "summary": summarise(rows),
            "runs": rows,
            "bench_wall_s": round(time.monotonic() - start, 1),
        }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {OUT} in {result['bench_wall_s']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
