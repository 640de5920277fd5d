"""Who should feed an in-group actor sync on the multi-region paper profiles: priced on verl's plans.

verl's PP 4 x TP 8 actor_train replicas span regions, so the relay from replica 0's leader carries the weights
over the WAN every step. Three ways to feed generation's receivers, each priced with the cost model
(costmodel/weightsync.py): replica 0's leader relays to all; each replica leader feeds its own host (what the
runtime does: runtime/weightsync.feed_specs); each replica leader feeds its own region. A feeder first gathers
its own replica (`replica_gather_s`), so a sync is the slowest gather + relay of a feeder.

    .venv/bin/python bench/sync_feeds.py
"""

from __future__ import annotations

import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def feeds_table(scenario: str, model: str, algorithm: str) -> str | None:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.artifacts.workload import paper_workload
    from hetrl_cli.costmodel.memory import weight_bytes_per_param
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import TaskPlacement
    from hetrl_cli.costmodel.weightsync import host_feeds
    from hetrl_cli.planner.api import make_plan

    profile = load_artifact(str(ROOT / "profiles" / f"paper-{scenario}.json"), ClusterProfile)
    workload = paper_workload(model, algorithm, "sync")
    plan = make_plan(profile, workload, solver="verl", budget_s=30, seed=0)
    cm = CostModel(profile, workload)
    syncs = cm.syncs
    by_task = {
        t.task: TaskPlacement(t.task, tuple(tuple(tuple(s) for s in r.stages) for r in t.replicas)) for t in plan.tasks
    }
    train = by_task["actor_train"]
    relay = syncs.actor_relay(train, by_task["generation"])
    if relay is None:
        return None
    nbytes = cm.step.arch["actor_train"].param_count("lm") * weight_bytes_per_param(workload)
    replicas = {rep[0][0]: rep for rep in train.replicas}
    gathers = {lead: syncs.replica_gather_s("actor", rep) for lead, rep in replicas.items()}
    leader = train.replicas[0][0][0]
    receivers = [d for d in relay[0] if d != leader]

    def priced(feeds: dict[str, list[str]]) -> float:
        out = 0.0
        for feeder, fed in feeds.items():
            others = [d for d in fed if d != feeder]
            out = max(out, gathers[feeder] + (syncs.broadcast_tree_s([feeder], others, nbytes)[0] if others else 0.0))
        return out

    region = lambda d: cm.links.region(cm.cluster.host_of(d))  # noqa: E731
    alone = priced({leader: receivers})
    by_host = priced(host_feeds(list(replicas), receivers, cm.cluster.host_of))
    by_region = priced(host_feeds(list(replicas), receivers, region))
    shapes = sorted({f"PP {len(rep)} x TP {len(rep[0])}" for rep in train.replicas})
    gathered = ", ".join(f"{g:.1f}" for g in gathers.values())
    head = f"| {scenario} | {model} {algorithm} | {len(replicas)} x {', '.join(shapes)} | {gathered} |"
    return f"{head} {alone:.1f} | {by_host:.1f} | {by_region:.1f} |"


def main() -> None:
    print("| profile | workload | actor_train replicas | gathers (s) | replica 0 relays | host feeds (runtime) | "
          "region feeds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for scenario, model, algorithm in itertools.product(
        ("multi-region-hybrid", "multi-country", "multi-continent"), ("4b", "8b", "14b"), ("grpo", "ppo")
    ):
        row = feeds_table(scenario, model, algorithm)
        if row is not None:
            print(row, flush=True)


if __name__ == "__main__":
    main()
