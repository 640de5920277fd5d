"""Issue 5 on real processes: planned vs baseline plans and the cost model's error on an emulated 3-host cluster.

As root: brings up examples/emulate-suite.yaml (fast 1.0 / mid 0.5 cores in east, slow 0.25 in west, 50 Mbit/s
east-west) under its own name prefix, subnet and state dir so the tests' cluster can be up beside it; profiles
it (`profile_hosts`, full probe budgets); builds a bigger random Qwen2 (examples/emulate-model.json) so a step takes
seconds on the slow host; plans GRPO sync, GRPO async and PPO sync (examples/emulate-{grpo,ppo}.yaml) with the
ilp solver, verl and streamrl, plus three hand-made layouts (>= 6 plans each); runs every plan for STEPS steps
across the hosts, round-robin over plans, for as many rounds as the time budget allows; then cross-fits the
calibration (plans in two folds, each predicted by the fit on the other fold; also each plan by the fit on all
others) and reports step time, per-task error before/after and Spearman's rho of predicted vs measured step
time; and the errors after calibration once more without each CPU probe rate the profile has (decode,
forward), to show what each does. Before each run a short probe on the fast host's CPUs records the
machine's speed, to tell the box's drift from the model's error.

    sudo .venv/bin/python bench/emulated_suite.py [--budget-min 25] [--steps 4] [--quick]
    → bench/results/emulated_suite.json (rewritten after every run; docs/benchmarks.md quotes it)

`hetrl emulate down` runs in a finally, also on failure (only this prefix's cluster is swept).
"""

from __future__ import annotations

import os

os.environ.setdefault("HETRL_EMULATE_PREFIX", "hetrl-emb-")  # before hetrl_cli.emulate is imported

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.calibration.candidates import scored_plan
from hetrl_cli.calibration.fit import COMM_TERMS, fit_calibration, link_kind
from hetrl_cli.calibration.inputs import run_engine
from hetrl_cli.calibration.validate import load_run, validate_run
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.emulate.api import emulate_down, emulate_up, host_cpu_sets
from hetrl_cli.emulate.spec import load_spec
from hetrl_cli.planner.api import make_plan
from hetrl_cli.planner.build import placement_from_plan, rescore
from hetrl_cli.profiling.remote import ProfileOptions, profile_hosts
from hetrl_cli.runtime.api import RunOptions, run_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from validate_local import run_errors, spearman, summarise

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "emulated_suite.json"
SPEC = REPO / "examples" / "emulate-suite.yaml"
STATE = Path("/run/hetrl-emulated-suite")
WORK = Path("/tmp/hetrl-emulated-suite")
MODEL_CONFIG = REPO / "examples" / "emulate-model.json"
WARMUP = 2
"""Steps left out of each median: in the multi-host plans training needs two steps to reach its steady pace
(run 2026-12-04 16:56: actor_train's second step took >= 1.3x its fourth in 14 of 30 multi-host runs, 0 of 6
one-host)."""
BASELINES = ("verl", "streamrl")
MACHINE_SPEED = """
import os, sys, torch
from hetrl_cli.profiling.probe import decode_steps_per_s
if sys.argv[1]:
    os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
print(max(decode_steps_per_s(torch, 0.2) for _ in range(3)))
"""


def machine_speed(cpus: tuple[int, ...]) -> float | None:
    """This machine's speed just before a run: the decode probe's steps/s in one process on `cpus` (the fast
    host's, without its quota). A shared machine drifts over minutes (2026-12-04 21:42: the first three runs
    measured generation 118-120 ms, the same layout 136-146 ms minutes later); the speed beside each run lets
    the analysis see how much of the error follows it. None when the probe fails."""
    done = subprocess.run(
        [sys.executable, "-c", MACHINE_SPEED, ",".join(map(str, cpus))], capture_output=True, text=True, timeout=120
    )
    try:
        return float(done.stdout)
    except ValueError:
        return None


def fast_host_cpus() -> tuple[int, ...]:
    """The CPUs `emulate up` pins the spec's largest host to (() = not pinned)."""
    spec = load_spec(SPEC)
    cpu_sets = host_cpu_sets(spec, sorted(os.sched_getaffinity(0)), str(SPEC))
    return max(zip(spec.hosts, cpu_sets, strict=True), key=lambda pair: pair[0].cpu)[1]


def recorded_profile(result: dict) -> ClusterProfile:
    """The profile a suite's runs were planned on: kept in the JSON (suites before 2026-12-04 19:00 kept it
    only in WORK/profile.json, which the next suite overwrites)."""
    if "profile_artifact" in result:
        return ClusterProfile.model_validate(result["profile_artifact"])
    return ClusterProfile.model_validate_json((WORK / "profile.json").read_text())


def warmup_of(result: dict) -> int:
    """The warm-up a suite's runs were measured with (runs recorded before --warmup existed: 1)."""
    return int(result.get("warmup", 1))


def build_model(target: Path) -> Path:
    """The bigger random Qwen2 of examples/emulate-model.json with the tiny tokenizer, saved once to `target`."""
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hetrl_cli.runtime.tinymodel import build_tokenizer

    tokenizer = build_tokenizer(0)
    cfg = json.loads(MODEL_CONFIG.read_text())
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    config = Qwen2Config(
        **cfg,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def workloads(model_dir: Path) -> dict[str, Workload]:
    """GRPO sync/async and PPO sync from the example yamls, pointed at the built model."""
    model = {"arch": "hf", "config_path": str(model_dir / "config.json"), "path": str(model_dir)}
    out = {}
    for name, file, extra in (
        ("grpo-sync", "emulate-grpo.yaml", {}),
        ("grpo-async", "emulate-grpo.yaml", {"mode": "async", "name": "emulate-grpo-async"}),
        ("ppo-sync", "emulate-ppo.yaml", {}),
    ):
        data = yaml.safe_load((REPO / "examples" / file).read_text())
        data.update(extra, actor=model)
        if data.get("algorithm") == "ppo":
            data["critic"] = model
        out[name] = Workload.model_validate(data)
    return out


def device_ids(profile: ClusterProfile) -> dict[str, str]:
    """fast/mid/slow → device id, by the hosts' order in hosts.txt (the spec's order)."""
    names = ("fast", "mid", "slow")
    hosts = [h.name for h in profile.hosts]
    by_host = {d.host: d.id for d in profile.devices}
    return {n: by_host[h] for n, h in zip(names, hosts, strict=True)}


def plans_for(profile: ClusterProfile, wl_name: str, wl: Workload, dev: dict[str, str], budget_s: float) -> dict:
    """Planner (ilp), the two baselines, and hand-made layouts, each a scored Plan."""
    out: dict[str, Plan] = {}
    for solver in ("ilp", *BASELINES):
        out[solver] = make_plan(profile, wl, solver=solver, budget_s=budget_s, name=f"{wl_name}:{solver}")
    for name in MANUAL:
        out[name] = manual_plan(profile, wl_name, wl, dev, name)
    return out


MANUAL: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    "fast-only": (("fast",), (1.0,)),
    "east-2:1": (("fast", "mid"), (2 / 3, 1 / 3)),
    "all-4:2:1": (("fast", "mid", "slow"), (4 / 7, 2 / 7, 1 / 7)),
}
"""The hand-made layouts: every task in one group on these hosts with these batch shares."""


def manual_plan(profile: ClusterProfile, wl_name: str, wl: Workload, dev: dict[str, str], name: str) -> Plan:
    hosts, shares = MANUAL[name]
    tasks = CostModel(profile, wl).required_tasks
    return scored_plan(profile, wl, [(tasks, tuple(dev[h] for h in hosts), shares)], f"{wl_name}:{name}")


def describe(plan: Plan) -> str:
    """Groups as `tasks@hosts[shares]`, short, for the tables."""
    parts = []
    for g in plan.groups:
        devs = "+".join(d.split("/")[0].split("@")[-1].split(":")[0].rsplit(".", 1)[-1] for d in g.devices)
        parts.append(f"{'+'.join(t[:4] for t in g.tasks)}@.{devs}")
    return " | ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-min", type=float, default=25.0, help="stop starting runs after this many minutes")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=WARMUP, help="steps left out of each median")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--plan-budget", type=float, default=20.0, help="planner budget per workload, seconds")
    ap.add_argument("--quick", action="store_true", help="dry run: grpo-sync only, 2 plans, 2 steps, 1 round")
    ap.add_argument("--markdown", action="store_true", help="print the docs/benchmarks.md tables of the JSON")
    ap.add_argument("--analyse-only", action="store_true", help="re-analyse the runs recorded in the JSON")
    ap.add_argument("--plan-calibrated", action="store_true",
                    help="fit on all recorded runs, re-plan each workload with that calibration (no runs)")  # fmt: skip
    ap.add_argument("--run-calibrated", action="store_true",
                    help="run the --plan-calibrated plans beside fast-only on the emulated cluster")  # fmt: skip
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(OUT.read_text())))
        return
    recorded = {  # modes on the recorded JSON and its run dirs: (the key each fills, how)
        "run_calibrated": (
            "calibrated_runs",
            lambda r, p: run_calibrated(r, p, args.plan_budget, args.rounds, args.steps),
        ),
        "plan_calibrated": ("calibrated_plans", lambda r, p: plan_calibrated(r, p, args.plan_budget)),
        "analyse_only": ("summary", lambda r, p: analyse(r, p) or r["summary"]),
    }
    for mode, (key, fill) in recorded.items():
        if getattr(args, mode):
            result = json.loads(OUT.read_text())
            profile = recorded_profile(result)
            result[key] = fill(result, profile)
            OUT.write_text(json.dumps(result, indent=2, default=str) + "\n")
            print(json.dumps(result[key].get("per_workload", result[key]), indent=1, default=str))
            return
    start = time.monotonic()
    deadline = start + args.budget_min * 60
    result: dict = {
        "command": "sudo .venv/bin/python bench/emulated_suite.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.node()}, {os.cpu_count()} cores",
        "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "spec": str(SPEC.relative_to(REPO)),
        "steps": args.steps,
        "warmup": args.warmup,
        "engine": "hf",
        "runs": [],
    }
    out = OUT.with_name("emulated_suite_quick.json") if args.quick else OUT

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    with emulated_cluster():
        WORK.mkdir(parents=True, exist_ok=True)
        options = ProfileOptions(  # full probe budgets: the hosts' rate ratios come out steadier (docs/benchmarks.md)
            known_hosts=STATE / "known_hosts", links_file=STATE / "links.yaml", name="emulate-suite", quick=False
        )
        profile = profile_hosts(STATE / "hosts.txt", options)
        (WORK / "profile.json").write_text(profile.model_dump_json(indent=2))
        result["profile_artifact"] = json.loads(profile.model_dump_json())  # the next suite overwrites the file
        dev = device_ids(profile)
        result["profile"] = {
            "devices": {n: {"id": d, **_device_facts(profile, d)} for n, d in dev.items()},
            "links": [
                {"a": lk.a, "b": lk.b, "bandwidth_Mbit_s": round(lk.bandwidth_Bps * 8 / 1e6, 1), "kind": lk.kind}
                for lk in profile.links
            ],
        }
        save()
        model_dir = build_model(WORK / "model")
        wls = workloads(model_dir)
        if args.quick:
            wls = {"grpo-sync": wls["grpo-sync"]}
        plans: dict[str, dict[str, Plan]] = {}
        for wl_name, wl in wls.items():
            plans[wl_name] = plans_for(profile, wl_name, wl, dev, args.plan_budget)
            if args.quick:
                plans[wl_name] = {k: plans[wl_name][k] for k in ("ilp", "verl")}
            result.setdefault("plans", {})[wl_name] = {
                k: {"describe": describe(p), "predicted_step_s": p.cost.iteration_s, "solver": p.solver.solver}
                for k, p in plans[wl_name].items()
            }
            print(json.dumps(result["plans"][wl_name], indent=1), file=sys.stderr, flush=True)
            save()
        steps = 2 if args.quick else args.steps
        rounds = 1 if args.quick else args.rounds
        runs_root = WORK / "runs" / time.strftime("%Y%m%d-%H%M%S")  # fresh: a run dir cannot be reused
        order = [(w, k) for k in next(iter(plans.values())) for w in plans]  # round-robin over plans and workloads
        probe_cpus = fast_host_cpus()
        for rnd in range(rounds):
            for wl_name, key in order:
                if time.monotonic() > deadline:
                    result["stopped_early"] = f"time budget reached in round {rnd}"
                    break
                run_dir = runs_root / f"{wl_name}-{key}-r{rnd}"
                speed = machine_speed(probe_cpus)
                t0 = time.monotonic()
                status = run_one(plans[wl_name][key], run_dir, steps)
                wall = time.monotonic() - t0
                print(f"round {rnd} {wl_name:10s} {key:10s} {wall:6.1f} s {status}", file=sys.stderr, flush=True)
                result["runs"].append(
                    {"workload": wl_name, "layout": key, "round": rnd, "run_dir": str(run_dir), "wall_s": wall,
                     "status": status, "machine_speed": speed}
                )  # fmt: skip
                save()
        result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        analyse(result, profile)
        result["bench_wall_s"] = round(time.monotonic() - start, 1)
        save()
        print(json.dumps(result.get("summary", {}), indent=1, default=str))


@contextlib.contextmanager
def emulated_cluster():
    """The suite's cluster up (unless it already is) for the block, and down after it, also a cluster found
    up: the suite owns this state dir and leaves nothing behind."""
    if not (STATE / "state.json").exists():
        cluster = emulate_up(SPEC, STATE)
        print("\n".join(cluster.summary()), file=sys.stderr)
    try:
        yield
    finally:
        emulate_down(STATE)


def run_one(plan: Plan, run_dir: Path, steps: int) -> str:
    """One plan for `steps` steps on the emulated cluster (up at STATE): its status; a failure is returned as
    a status so a suite goes on (a Ctrl-C is not)."""
    try:
        summary = run_plan(
            plan,
            RunOptions(
                steps=steps,
                run_dir=run_dir,
                engine="hf",
                hosts_file=STATE / "hosts.txt",
                known_hosts=STATE / "known_hosts",
                timeout_s=600,
                collective_timeout_s=300,
                tensorboard=False,
                echo=lambda _line: None,
            ),
        )
    except Exception as exc:
        if "interrupted" in str(exc):
            raise KeyboardInterrupt from exc
        return f"failed: {exc}"
    return summary.status


def run_calibrated(result: dict, profile: ClusterProfile, budget_s: float, rounds: int, steps: int) -> dict:
    """Measure the closed loop: each workload's plan made with the calibration fitted on all recorded runs,
    alternating with `fast-only` (the fastest of the six in the recorded run) so both see the same machine,
    `rounds` rounds; the median measured step of each."""
    dev = device_ids(profile)
    wls = workloads(WORK / "model")
    plans = {
        wl_name: {"ilp-calibrated": plan, "fast-only": manual_plan(profile, wl_name, wls[wl_name], dev, "fast-only")}
        for wl_name, plan in calibrated_plans(result, profile, budget_s).items()
    }
    runs_root = WORK / "runs" / time.strftime("%Y%m%d-%H%M%S-calibrated")
    measured: dict[str, dict[str, list[float]]] = {}
    with emulated_cluster():
        for rnd in range(rounds):
            for wl_name, pair in plans.items():
                for key, plan in pair.items():
                    run_dir = runs_root / f"{wl_name}-{key}-r{rnd}"
                    status = run_one(plan, run_dir, steps)
                    print(f"round {rnd} {wl_name:10s} {key:15s} {status}", file=sys.stderr, flush=True)
                    if status == "completed":
                        v = validate_run(run_dir, warmup_of(result), scored=plan, predictions="plan", write=False)
                        step = run_errors(v, v)["measured_step_s"]
                        measured.setdefault(wl_name, {}).setdefault(key, []).append(step)
    out: dict = {}
    for wl_name, pair in plans.items():
        for key, plan in pair.items():
            steps_s = measured.get(wl_name, {}).get(key, [])
            out.setdefault(wl_name, {})[key] = {
                "describe": describe(plan),
                "predicted_step_s": plan.cost.iteration_s,
                "measured_step_s": [round(x, 3) for x in steps_s],
                "median_s": statistics.median(steps_s) if steps_s else None,
            }
    return out


def fit_data(runs: list[dict]) -> dict[str, tuple]:
    """Recorded runs as fit_calibration takes them, (run id, plan, metrics, the rollout engine it ran: priced as
    it ran), by run dir; each read once."""
    return {r["run_dir"]: (Path(r["run_dir"]).name, *load_run(r["run_dir"]), run_engine(r["run_dir"])) for r in runs}


def calibrated_plans(result: dict, profile: ClusterProfile, budget_s: float) -> dict[str, Plan]:
    """Each workload planned (ilp) with the calibration fitted on every completed run of the recorded suite."""
    ok = [r for r in result["runs"] if r["status"] == "completed"]
    factors = fit_calibration(list(fit_data(ok).values()), profile, warmup_of(result)).factors()
    return {
        wl_name: make_plan(
            profile, wl, solver="ilp", budget_s=budget_s, name=f"{wl_name}:ilp-calibrated", calibration=factors
        )
        for wl_name, wl in workloads(WORK / "model").items()
    }


def _device_facts(profile: ClusterProfile, device_id: str) -> dict:
    d = next(x for x in profile.devices if x.id == device_id)
    return {"cores": d.cores, "gflops_fp32": round(d.measured_tflops.get("fp32", 0) * 1e3, 1)}


def link_kinds(plan: Plan, profile: ClusterProfile) -> tuple[str, ...]:
    """The link kinds a plan's tasks communicate over (TP, PP, DP terms the cost model charges)."""
    model = CostModel(profile, plan.workload)
    estimate = model.evaluate(*placement_from_plan(plan))
    kinds = {
        link_kind(est.links.get(term, ""))
        for est in estimate.tasks.values()
        for term in COMM_TERMS
        if est.terms.get(term)
    }
    return tuple(sorted(k for k in kinds if k))


def stratified(runs: list[dict], profile: ClusterProfile) -> list[str]:
    """Layouts ordered by the link kinds they use, so that alternating them gives each fold's fit every link
    kind the other fold is scored on (a factor a fold never exercised stays at its prior: that would measure
    the prior, not calibration)."""
    first = {}
    for r in runs:
        first.setdefault(r["layout"], r["run_dir"])
    kinds = {key: link_kinds(load_run(run_dir)[0], profile) for key, run_dir in first.items()}
    return sorted(first, key=lambda key: kinds[key])


def scored_run(run_dir: str, plan: Plan, profile: ClusterProfile, warmup: int, factors: dict | None, label: str):
    """A recorded run's measurements beside the cost model's prediction as it is now (uncalibrated where
    `factors` is None), with the rollout engine the run used, not written into the run dir."""
    scored = rescore(plan, profile, calibration=factors, engine=run_engine(run_dir))
    return validate_run(run_dir, warmup, scored=scored, predictions=label, write=False)


PROBE_RATES = ("forward_tokens_per_s", "decode_steps_per_s")
"""The profile's CPU probe rates whose part in the error the suite measures by analysing without each."""


def analyse(result: dict, profile: ClusterProfile, ablate: bool = True) -> None:
    """Per plan the median over rounds; cross-fitted calibration; errors before/after; speedups; Spearman.
    With `ablate`, also the per-task errors after calibration on the same runs with each of PROBE_RATES that
    the profile has left out of it (summary.without), to show what the rate does."""
    ok = [r for r in result["runs"] if r["status"] == "completed"]
    if not ok:
        return
    keys = stratified(ok, profile)
    fold_a = set(keys[0::2])
    result["folds"] = {"A": sorted(fold_a), "B": sorted(set(keys) - fold_a)}
    fits = {}
    warmup = warmup_of(result)
    data = fit_data(ok)
    for fold in ("A", "B"):
        train = [data[r["run_dir"]] for r in ok if (r["layout"] in fold_a) != (fold == "A")]
        if train:
            fits[fold] = fit_calibration(train, profile, warmup)
    rows = []
    for r in ok:
        fold = "A" if r["layout"] in fold_a else "B"
        plan = data[r["run_dir"]][1]
        # the cost model as it is now, uncalibrated (a plan.json holds what the model said when it was planned)
        before = scored_run(r["run_dir"], plan, profile, warmup, None, "current")
        after = before
        if fold in fits:
            after = scored_run(r["run_dir"], plan, profile, warmup, fits[fold].factors(), f"fold {fold}")
        rows.append({**{k: r[k] for k in ("workload", "layout", "round", "wall_s")}, "fold": fold,
                     **run_errors(before, after)})  # fmt: skip
    result["rows"] = rows
    # one row per (workload, plan): medians over rounds, for the ranking and the speedups
    merged = []
    for wl in dict.fromkeys(r["workload"] for r in rows):
        for key in dict.fromkeys(r["layout"] for r in rows if r["workload"] == wl):
            mine = [r for r in rows if r["workload"] == wl and r["layout"] == key]
            merged.append(
                {
                    "workload": wl,
                    "layout": key,
                    "rounds": len(mine),
                    "measured_step_s": statistics.median(r["measured_step_s"] for r in mine),
                    "measured_all_s": [round(r["measured_step_s"], 3) for r in mine],
                    "predicted_step_s_before": mine[0]["predicted_step_s_before"],
                    "predicted_step_s_after": mine[0]["predicted_step_s_after"],
                    "step_error_before": statistics.median(r["step_error_before"] for r in mine),
                    "step_error_after": statistics.median(r["step_error_after"] for r in mine),
                    "tasks": mine[0]["tasks"],
                    "weight_sync_measured_s": statistics.median(
                        (r["tasks"].get("weight_sync") or {}).get("measured_s") or 0.0 for r in mine
                    ),
                }
            )
    summary = summarise(rows)
    summary["per_workload"] = summarise(merged)["per_workload"]
    summary["repeat_floor"] = repeat_floor(rows)
    summary["round_drift"] = round_drift(rows)
    summary["in_sample"] = in_sample(fit_calibration(list(data.values()), profile, warmup))
    summary["leave_one_plan_out"] = leave_one_plan_out(ok, data, profile, warmup)
    summary["machine_speed"] = speed_vs_error(rows, ok)
    for wl, entry in summary["per_workload"].items():
        step = {r["layout"]: r["measured_step_s"] for r in merged if r["workload"] == wl}
        if "ilp" in step:
            entry["speedup_ilp_over"] = {b: step[b] / step["ilp"] for b in BASELINES if b in step}
            # the runtime broadcasts weights to every generation rank, also to colocated DP replicas that
            # already hold them (the cost model counts those as a local reshard): the speedup without it
            rest = {
                r["layout"]: r["measured_step_s"] - r["weight_sync_measured_s"] for r in merged if r["workload"] == wl
            }
            entry["speedup_ilp_over_without_weight_sync"] = {b: rest[b] / rest["ilp"] for b in BASELINES if b in rest}
        pred = {r["layout"]: r["predicted_step_s_before"] for r in merged if r["workload"] == wl}
        if "ilp" in pred:
            entry["predicted_speedup_ilp_over"] = {b: pred[b] / pred["ilp"] for b in BASELINES if b in pred}
        entry["spearman_check"] = spearman(
            [r["predicted_step_s_before"] for r in merged if r["workload"] == wl], list(step.values())
        )
    result["merged"] = merged
    result["summary"] = summary
    if ablate:
        summary["without"] = {
            field: analysed_without(result, profile, field)
            for field in PROBE_RATES
            if any(getattr(d, field) for d in profile.devices)
        }
    result["calibrations"] = {
        f: {k: v for k, v in json.loads(c.model_dump_json()).items() if k != "residuals"} for f, c in fits.items()
    }


def analysed_without(result: dict, profile: ClusterProfile, field: str) -> dict:
    """Per task (and all tasks) the errors after calibration of the same runs, analysed on `profile` with the
    device field `field` unset (the cost model then falls back to what it does without the measurement)."""
    devices = [d.model_copy(update={field: None}) for d in profile.devices]
    other = dict(result)  # analyse only reads the runs and sets its own keys: the recorded ones stay as they are
    analyse(other, profile.model_copy(update={"devices": devices}), ablate=False)
    s = other["summary"]
    return {"per_task": {t: e["after"] for t, e in s["per_task"].items()}, "all_tasks": s["all_tasks"]["after"]}


def plan_calibrated(result: dict, profile: ClusterProfile, budget_s: float) -> dict:
    """Close the loop: fit one calibration on all recorded runs, plan each workload with it (ilp), and set the
    plan beside the measured plans of the same layout (tasks and hosts; the shares may differ) and the
    fastest measured plan."""
    out = {}
    for wl_name, plan in calibrated_plans(result, profile, budget_s).items():
        layout = describe(plan)
        measured = {r["layout"]: r for r in result["merged"] if r["workload"] == wl_name}
        described = result["plans"][wl_name]
        same = {n: r["measured_step_s"] for n, r in measured.items() if described[n]["describe"] == layout}
        fastest = min(measured.values(), key=lambda r: r["measured_step_s"])
        out[wl_name] = {
            "describe": layout,
            "predicted_step_s_calibrated": plan.cost.iteration_s,
            "measured_same_layout_s": same,
            "fastest_measured": {"plan": fastest["layout"], "step_s": fastest["measured_step_s"]},
        }
    return out


def measured_by_round(rows: list[dict]) -> dict[tuple[str, str, str], dict[int, float]]:
    """Measured seconds per (workload, plan, task), by round."""
    out: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in rows:
        for task, v in r["tasks"].items():
            if v.get("measured_s"):
                out.setdefault((r["workload"], r["layout"], task), {})[r["round"]] = v["measured_s"]
    return out


def task_error_stats(errors: dict[str, list[float]]) -> dict:
    """Per task: median and p90 of |error|, and how many."""
    from hetrl_cli.calibration.validate import abs_error_stats

    out = {}
    for task, errs in sorted(errors.items()):
        med, p90 = abs_error_stats(errs)
        out[task] = {"median_abs_error": med, "p90_abs_error": p90, "n": len(errs)}
    return out


def repeat_floor(rows: list[dict]) -> dict:
    """Per task, the error a perfect deterministic model could reach on these runs: predicting each plan's
    mean over its rounds, |mean / measured - 1| per run (plans measured in one round only are left out).
    What calibration leaves above this is the model's; up to it, the box's run-to-run noise."""
    errors: dict[str, list[float]] = {}
    for (_wl, _layout, task), by_round in measured_by_round(rows).items():
        if len(by_round) > 1:
            mean = statistics.fmean(by_round.values())
            errors.setdefault(task, []).extend(mean / x - 1 for x in by_round.values())
    return task_error_stats(errors)


def round_drift(rows: list[dict]) -> dict | None:
    """How much slower the whole box ran in round 0 than in round 1: per (workload, plan, task) measured in
    both, round 0's seconds over round 1's (weight syncs left out: a few milliseconds); their median, and in
    how many round 0 was the slower. A shared machine's speed drifts over minutes; a fit over both rounds
    splits the difference."""
    ratios = [
        v[0] / v[1] for (_wl, _layout, task), v in measured_by_round(rows).items()
        if task != "weight_sync" and 0 in v and 1 in v
    ]  # fmt: skip
    if not ratios:
        return None
    return {"median_ratio": statistics.median(ratios), "round0_slower": sum(x > 1 for x in ratios), "n": len(ratios)}


def in_sample(fit) -> dict:
    """Per task, the error left after a fit on every run (its exact residuals): what no held-out split adds."""
    errors: dict[str, list[float]] = {}
    for r in fit.residuals:
        if r.error_after is not None:
            errors.setdefault(r.task, []).append(r.error_after)
    return task_error_stats(errors)


def leave_one_plan_out(ok: list[dict], data: dict[str, tuple], profile: ClusterProfile, warmup: int) -> dict:
    """Per task, the error on each plan's runs of a fit on every other plan's runs: held out like the two
    folds, but each fit sees five layouts rather than three."""
    errors: dict[str, list[float]] = {}
    for layout in dict.fromkeys(r["layout"] for r in ok):
        mine = [r for r in ok if r["layout"] == layout]
        rest = [data[r["run_dir"]] for r in ok if r["layout"] != layout]
        if not rest:
            continue
        factors = fit_calibration(rest, profile, warmup).factors()
        for r in mine:
            v = scored_run(r["run_dir"], data[r["run_dir"]][1], profile, warmup, factors, f"all but {layout}")
            for task, e in run_errors(v, v)["tasks"].items():
                if e.get("error_after") is not None:
                    errors.setdefault(task, []).append(e["error_after"])
    return task_error_stats(errors)


def speed_vs_error(rows: list[dict], runs: list[dict]) -> dict | None:
    """Does the error follow the machine's speed? Per run, the median over its tasks (weight sync left out)
    of measured / predicted after calibration, against the probe's speed just before it: Spearman's rho
    (negative when a faster machine made the runs shorter than predicted) and the speeds' range."""
    speed = {(r["workload"], r["layout"], r["round"]): r.get("machine_speed") for r in runs}
    pairs = []
    for row in rows:
        v = speed.get((row["workload"], row["layout"], row["round"]))
        ratios = [
            t["measured_s"] / t["after_s"] for name, t in row["tasks"].items()
            if name != "weight_sync" and t.get("measured_s") and t.get("after_s")
        ]  # fmt: skip
        if v and ratios:
            pairs.append((v, statistics.median(ratios)))
    if len(pairs) < 3:
        return None
    speeds = [v for v, _ in pairs]
    return {
        "n": len(pairs),
        "steps_per_s_min": min(speeds),
        "steps_per_s_median": statistics.median(speeds),
        "steps_per_s_max": max(speeds),
        "spearman_speed_vs_measured_over_predicted": spearman(speeds, [x for _, x in pairs]),
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def markdown(result: dict) -> str:
    """The tables docs/benchmarks.md quotes: plans and step times, per-task error, ranking."""
    s = result["summary"]
    lines = ["| workload | plan | layout (host .2 fast, .3 mid, .4 slow) | predicted s | measured s (per round) |"]
    lines.append("|---|---|---|---|---|")
    for m in result["merged"]:
        desc = result["plans"][m["workload"]][m["layout"]]["describe"]
        meas = ", ".join(f"{x:.2f}" for x in m["measured_all_s"])
        lines.append(
            f"| {m['workload']} | {m['layout']} | `{desc}` | {m['predicted_step_s_before']:.2f} | "
            f"{m['measured_step_s']:.2f} ({meas}) |"
        )
    lines += ["", "| workload | ilp vs verl | ilp vs streamrl | same, weight sync left out (verl, streamrl) | "
              "predicted ilp vs verl, streamrl |", "|---|---|---|---|---|"]  # fmt: skip
    for wl, e in s["per_workload"].items():
        sp, wo, pr = (
            e.get("speedup_ilp_over", {}),
            e.get("speedup_ilp_over_without_weight_sync", {}),
            e.get("predicted_speedup_ilp_over", {}),
        )
        f = lambda d, k: f"{d[k]:.2f}×" if k in d else "–"  # noqa: E731
        lines.append(
            f"| {wl} | {f(sp, 'verl')} | {f(sp, 'streamrl')} | {f(wo, 'verl')}, {f(wo, 'streamrl')} | "
            f"{f(pr, 'verl')}, {f(pr, 'streamrl')} |"
        )
    lines += ["", "| task | n | median before | median after | p90 before | p90 after | leave one plan out: "
              "median, p90 | fitted on all runs: median, p90 | repeat floor median, p90 |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    floor, fitted, lopo = s.get("repeat_floor", {}), s.get("in_sample", {}), s.get("leave_one_plan_out", {})
    for label, e in [*s["per_task"].items(), ("**all tasks**", s["all_tasks"])]:
        b, a = e["before"], e["after"]
        f, i, o = floor.get(label, {}), fitted.get(label, {}), lopo.get(label, {})
        lines.append(
            f"| {label} | {b['n']} | {_pct(b['median_abs_error'])} | {_pct(a['median_abs_error'])} | "
            f"{_pct(b['p90_abs_error'])} | {_pct(a['p90_abs_error'])} | "
            f"{_pct(o.get('median_abs_error'))}, {_pct(o.get('p90_abs_error'))} | "
            f"{_pct(i.get('median_abs_error'))}, {_pct(i.get('p90_abs_error'))} | "
            f"{_pct(f.get('median_abs_error'))}, {_pct(f.get('p90_abs_error'))} |"
        )
    for field, w in s.get("without", {}).items():
        cells = ", ".join(
            f"{t} {_pct(e['median_abs_error'])} / {_pct(e['p90_abs_error'])}" for t, e in w["per_task"].items()
        )
        lines += ["", f"Same runs analysed without the profile's `{field}`, after calibration, median / p90: "
                  f"{cells}; all tasks {_pct(w['all_tasks']['median_abs_error'])} / "
                  f"{_pct(w['all_tasks']['p90_abs_error'])}."]  # fmt: skip
    drift = s.get("round_drift")
    if drift:
        lines += ["", f"Round 0 / round 1 measured seconds, median over {drift['n']} (workload, plan, task): "
                  f"{drift['median_ratio']:.2f} (round 0 slower in {drift['round0_slower']})."]  # fmt: skip
    speed = s.get("machine_speed")
    if speed:
        lines += ["", f"Machine speed before each run (decode probe on the fast host's CPUs, {speed['n']} runs): "
                  f"{speed['steps_per_s_min']:.0f}–{speed['steps_per_s_max']:.0f} steps/s (median "
                  f"{speed['steps_per_s_median']:.0f}); Spearman ρ of speed vs a run's measured / predicted after "
                  f"calibration: {speed['spearman_speed_vs_measured_over_predicted']:.2f}."]  # fmt: skip
    lines += ["", "| workload | plans | Spearman ρ before | Spearman ρ after | step error median before → after | "
              "fastest measured | fastest predicted (before) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for wl, e in s["per_workload"].items():
        fastest_before = min(
            (m for m in result["merged"] if m["workload"] == wl), key=lambda m: m["predicted_step_s_before"]
        )["layout"]
        lines.append(
            f"| {wl} | {e['plans']} | {e['before']['spearman']:.2f} | {e['after']['spearman']:.2f} | "
            f"{_pct(e['before']['step_median_abs_error'])} → {_pct(e['after']['step_median_abs_error'])} | "
            f"{e['fastest_measured']} | {fastest_before} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
