"""`show --format json`: the plan's key numbers and a derived per-host device map, for scripts and dashboards.

Plain numbers in SI units (seconds, bytes, per second), never formatted strings, except the one-line
`workload.summary`, `bottleneck` and `headline`, which are sentences meant to be shown as they are.
"""

from __future__ import annotations

from typing import Any

from hetrl_cli.render.compare import Comparison
from hetrl_cli.render.digest import PlanDigest, natural_key, task_order, workload_line


def plan_summary(d: PlanDigest) -> dict[str, Any]:
    """One plan: what it is, how fast, how sure the solver is, and where every device went."""
    plan, cost = d.plan, d.plan.cost
    return {
        "plan": plan.name,
        "created_at": plan.created_at,
        "profile": {"name": plan.profile_name, "fingerprint": plan.profile_fingerprint},
        "stale": _stale(d),
        "workload": {
            "algorithm": plan.workload.algorithm,
            "mode": plan.workload.mode,
            "actor": plan.workload.actor.arch,
            "samples_per_step": plan.workload.samples_per_step,
            "summary": workload_line(plan.workload),
        },
        "iteration_s": cost.iteration_s,
        "samples_per_s": cost.samples_per_s,
        "tokens_per_s": cost.tokens_per_s,
        "weight_sync_s": cost.weight_sync_s,
        "transfer_s": cost.transfer_s,
        "breakdown": cost.breakdown,
        "bottleneck": d.bottleneck,
        "warnings": list(plan.warnings),
        "objective": plan.objective,
        "price": plan.price.model_dump() if plan.price is not None else None,
        "solver": plan.solver.model_dump(),
        "devices": _device_counts(d),
        "groups": [_group(d, g.name) for g in plan.groups],
        "tasks": [_task(d, name) for name in task_order([t.task for t in plan.tasks])],
        "hosts": _hosts(d),
        "timeline": [e.model_dump() for e in cost.timeline],
    }


def comparison_summary(c: Comparison) -> dict[str, Any]:
    """Both summaries, every ratio (b / a) and the verdict."""
    return {
        "a": plan_summary(c.a),
        "b": plan_summary(c.b),
        "faster": c.faster,
        "speedup": c.speedup,
        "headline": c.headline(),
        "ratios": {r.metric: {"a": r.a, "b": r.b, "b_over_a": r.ratio} for r in c.rows},
        "tasks": {r.metric: {"a_s": r.a, "b_s": r.b, "b_over_a": r.ratio} for r in c.tasks},
    }


def _stale(d: PlanDigest) -> dict[str, Any] | None:
    if d.stale is None:
        return None
    s = d.stale
    return {
        "plan_fingerprint": s.plan_fingerprint,
        "profile_fingerprint": s.profile_fingerprint,
        "missing_devices": s.missing_devices,
        "unused_devices": s.unused_devices,
        "message": s.sentence(),
    }


def _device_counts(d: PlanDigest) -> dict[str, int]:
    hosts = {f.host for f in d.facts.values()}
    return {"used": len(d.used), "known": len(d.facts), "idle": len(set(d.facts) - d.used), "hosts": len(hosts)}


def _group(d: PlanDigest, name: str) -> dict[str, Any]:
    group = next(g for g in d.plan.groups if g.name == name)
    by_host: dict[str, int] = {}
    for device_id in group.devices:
        host = d.facts[device_id].host
        by_host[host] = by_host.get(host, 0) + 1
    return {
        "name": name,
        "letter": d.letters[name],
        "tasks": list(group.tasks),
        "devices": len(group.devices),
        "placement": d.group_devices[name],
        "by_host": by_host,
    }


def _task(d: PlanDigest, name: str) -> dict[str, Any]:
    t = d.plan.task(name)
    return {
        "task": t.task,
        "group": t.group,
        "tp": t.tp,
        "pp": t.pp,
        "dp": t.dp,
        "devices": len(t.devices),
        "batch_shares": [r.batch_share for r in t.replicas],
        "layer_splits": [r.layer_split for r in t.replicas],
        "offload": t.offload,
        "predicted": t.predicted.model_dump(),
    }


def _hosts(d: PlanDigest) -> list[dict[str, Any]]:
    """Every host with every device (never merged: scripts want the full map), in natural order."""
    tasks_on: dict[str, list[str]] = {}
    for t in d.plan.tasks:
        for device_id in t.devices:
            tasks_on.setdefault(device_id, []).append(t.task)
    peak = d.plan.peak_memory()
    missing = set(d.stale.missing_devices) if d.stale else set()
    hosts: dict[str, dict[str, Any]] = {}
    for f in sorted(d.facts.values(), key=lambda f: (natural_key(f.host), f.index)):
        host = hosts.setdefault(f.host, {"host": f.host, "region": f.region or None, "devices": []})
        host["devices"].append(
            {
                "id": f.id,
                "type": f.type or None,
                "state": "missing" if f.id in missing else "used" if f.id in d.used else "idle",
                "group": d.device_group.get(f.id) if f.id in d.used else None,
                "tasks": tasks_on.get(f.id, []),
                "peak_bytes": peak.get(f.id),
                "capacity_bytes": f.capacity_bytes,
            }
        )
    return list(hosts.values())
