"""Seeded random placements on a paper profile and what the cost model predicts for them.

The reference values in data/speed_reference.json were recorded with the cost model *before* it was
optimised for speed; test_speed_equivalence.py re-scores the same cases and requires every number to match
(bit-for-bit or within 1e-12 relative). Regenerate only when a formula changes on purpose:

    .venv/bin/python -m tests.costmodel.speed_cases --write
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import Workload, paper_workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.costmodel.types import GroupPlacement, TaskPlacement

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "speed_reference.json"
PROFILE = ROOT / "profiles" / "paper-multi-region-hybrid.json"
PPO_TASKS = ("generation", "reference", "reward", "critic_inference", "actor_train", "critic_train")
GRPO_TASKS = ("generation", "reference", "reward", "actor_train")
CALIBRATION = {
    "device_class": {"NVIDIA L40S": {"compute": 0.8, "memory": 0.9}, "NVIDIA L4": {"compute": 0.7}},
    "link_class": {"wan": {"bandwidth": 0.6, "latency": 1.3}, "nvlink": {"bandwidth": 0.8}},
    "task_overhead_s": {"generation": 0.5, "actor_train": 0.25, "weight_sync": 0.1},
}


def workloads() -> dict[str, tuple[Workload, dict | None]]:
    def wl(model: str, algorithm: str, mode: str = "sync", **kw) -> Workload:
        return paper_workload(model, algorithm, mode, name=f"speed-{model}-{algorithm}", **kw)

    return {
        "ppo-8b": (wl("8b", "ppo"), None),
        "ppo-8b-zero3-recompute": (wl("8b", "ppo", sharding="zero3", recompute=True, ppo_epochs=2), None),
        "ppo-8b-calibrated": (wl("8b", "ppo", sharding="zero1"), CALIBRATION),
        "grpo-4b-async": (wl("4b", "grpo", mode="async", micro_batch=4), None),
    }


def profile() -> ClusterProfile:
    return load_artifact(str(PROFILE), ClusterProfile)


def _random_devices(rng: random.Random, prof: ClusterProfile, tp: int) -> list[list[str]]:
    """Chunks of devices on one host each, sizes multiples of tp."""
    by_host: dict[str, list[str]] = {}
    for d in prof.devices:
        by_host.setdefault(d.host, []).append(d.id)
    hosts = rng.sample(sorted(by_host), rng.choice((1, 1, 2, 2, 3, 4)))
    chunks = []
    for h in hosts:
        k = tp * rng.randint(1, 8 // tp)
        start = rng.randrange(0, 8 - k + 1)
        chunks.append(by_host[h][start : start + k])
    return chunks


def _placement(rng: random.Random, prof: ClusterProfile, task: str, chunks=None, tp=None) -> TaskPlacement:
    if tp is None and chunks is not None:
        tp = rng.choice([t for t in (1, 2, 4, 8) if all(len(c) % t == 0 for c in chunks)])
    tp = tp or rng.choice((1, 1, 2, 2, 4, 8))
    if chunks is None:
        chunks = _random_devices(rng, prof, tp)
    if rng.random() < 0.08:  # a TP group across hosts (mixed classes inside a stage)
        flat = [d for c in chunks for d in c]
        rng.shuffle(flat)
        chunks = [flat]
    groups = [tuple(c[i : i + tp]) for c in chunks for i in range(0, len(c), tp)]
    groups = [g for g in groups if len(g) == tp]
    n = len(groups)
    pps = [p for p in range(1, min(n, 12) + 1) if n % p == 0]
    pp = rng.choice(pps)
    dp = n // pp
    if rng.random() < 0.3 and pp > 1 and dp > 1:
        replicas = tuple(tuple(groups[r + s * dp] for s in range(pp)) for r in range(dp))
    else:
        replicas = tuple(tuple(groups[r * pp + s] for s in range(pp)) for r in range(dp))
    shares = splits = None
    if rng.random() < 0.15:
        raw = [rng.uniform(0.5, 2.0) for _ in range(dp)]
        shares = tuple(x / sum(raw) for x in raw)
        if abs(sum(shares) - 1) > 1e-6:
            shares = None
    if rng.random() < 0.1:
        layers = 36
        if pp <= layers:
            cuts = sorted(rng.sample(range(1, layers), pp - 1))
            split = tuple(b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True))
            splits = tuple(split for _ in range(dp))
    return TaskPlacement(task, replicas, shares, splits, offload=rng.random() < 0.2)


def task_cases(seed: int, tasks: tuple[str, ...], n: int, prof: ClusterProfile) -> list[tuple]:
    """(placement, group_tasks) pairs: alone, with colocated task names, or with colocated placements."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = rng.choice(tasks)
        tp = rng.choice((1, 1, 2, 2, 4, 8))
        chunks = _random_devices(rng, prof, tp)
        p = _placement(rng, prof, task, chunks, tp)
        mode = rng.random()
        others = [t for t in tasks if t != task]
        if mode < 0.4:
            group = None
        elif mode < 0.7:
            group = tuple(rng.sample(others, rng.randint(1, len(others))))
        else:
            group = tuple(_placement(rng, prof, t, chunks) for t in rng.sample(others, rng.randint(1, 2)))
        out.append((p, group))
    return out


def plan_cases(seed: int, tasks: tuple[str, ...], n: int, prof: ClusterProfile) -> list[tuple]:
    """(groups, placements) of whole plans: tasks split into 1-3 groups on disjoint device sets."""
    rng = random.Random(seed)
    ids = [d.id for d in prof.devices]
    out = []
    for _ in range(n):
        k = rng.randint(1, 3)
        order = list(tasks)
        rng.shuffle(order)
        assign = [order[i::k] for i in range(k)]
        assign = [a for a in assign if a]
        hosts = sorted({d.split("/")[0] for d in ids})
        rng.shuffle(hosts)
        per = max(1, len(hosts) // len(assign))
        groups, placements = [], []
        for i, ts in enumerate(assign):
            hs = hosts[i * per : (i + 1) * per] if i < len(assign) - 1 else hosts[i * per :]
            chunks = [[d for d in ids if d.split("/")[0] == h] for h in hs]
            devs = tuple(d for c in chunks for d in c)
            ts = tuple(t for t in tasks if t in ts)
            groups.append(GroupPlacement(f"g{i}", ts, devs))
            for t in ts:
                placements.append(_placement(rng, prof, t, chunks))
        out.append((groups, placements))
    return out


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def record_task(est) -> dict:
    c = est.cost
    return {
        "cost": {k: _num(getattr(c, k)) for k in ("compute_s", "memory_s", "comm_s", "bubble_s", "other_s", "total_s")},
        "terms": {k: _num(v) for k, v in est.terms.items()},
        "links": dict(est.links),
        "memory": dict(est.memory_bytes),
        "violation": est.violation,
        "shares": list(est.placement.batch_shares) if est.placement.batch_shares else None,
        "splits": [list(s) for s in est.placement.layer_splits] if est.placement.layer_splits else None,
    }


def record_plan(pe) -> dict:
    return {
        "iteration_s": _num(pe.iteration_s),
        "weight_sync_s": _num(pe.weight_sync_s),
        "transfer_s": _num(pe.transfer_s),
        "breakdown": {k: _num(v) for k, v in pe.breakdown.items()},
        "bottleneck": pe.bottleneck,
        "violations": list(pe.violations),
        "memory": dict(pe.memory_per_device),
        "timeline": [[e.name, e.group, _num(e.start_s), _num(e.end_s)] for e in pe.timeline],
        "tasks": {t: [_num(e.cost.total_s), e.violation] for t, e in pe.tasks.items()},
    }


N_TASKS = 120
N_PLANS = 25


def compute_all(model_cls=CostModel) -> dict:
    prof = profile()
    out: dict = {}
    for i, (name, (w, cal)) in enumerate(workloads().items()):
        tasks = PPO_TASKS if w.algorithm == "ppo" else GRPO_TASKS
        cm = model_cls(prof, w, cal)
        out[name] = {
            "tasks": [record_task(cm.task(p, g)) for p, g in task_cases(1000 + i, tasks, N_TASKS, prof)],
            "plans": [record_plan(cm.evaluate(g, p)) for g, p in plan_cases(2000 + i, tasks, N_PLANS, prof)],
        }
    return out


if __name__ == "__main__":
    if "--write" in sys.argv:
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(compute_all(), separators=(",", ":"), sort_keys=True) + "\n")
        print(f"wrote {DATA}")
