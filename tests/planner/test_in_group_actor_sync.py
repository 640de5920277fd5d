"""The planner charges the actor's weight sync inside a group as evaluate() does: where generation shares
actor_train's group in layouts the runtime relays weights between (costmodel WeightSync.actor_relay: not every
generation device a one-rank replica on a one-rank training replica), the group option's sync is the relay on its
layouts, not a reshard in HBM on its devices; the ILP's same-group table (build_space), the hybrid's tables
(Tables.terms) and the screen's exact rows read that one figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import paper_workload
from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.tables import Tables

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("hosts", [("a100-0", "a100-1"), ("a100-0",)])
def test_a_relayed_actor_sync_in_one_group_is_what_evaluate_charges(hosts) -> None:
    profile = load_artifact(str(ROOT / "profiles" / "paper-single-region.json"), ClusterProfile)
    w = paper_workload("8b", "grpo", "sync")
    cm = CostModel(profile, w)
    tables = Tables(cm, profile, w)
    grouping = (tuple(tables.tasks),)  # every task in one group, verl-like
    devices = tuple(sorted(d.id for d in profile.devices if d.id.split("/")[0] in hosts))
    option = tables.group_option(grouping[0], devices)
    assert option is not None
    by_task = {p.task: p for p in option.placements}
    relay = cm.syncs.actor_relay(by_task["actor_train"], by_task["generation"])
    assert relay is not None  # the layouts chosen (TP > 1) make the runtime relay the weights
    estimate = cm.evaluate(tables.groups(grouping, [option]), tables.placements([option]))
    assert estimate.feasible
    in_group = tables.same_group_weight_sync(devices, option.placements)
    assert tables.terms(grouping, [option])[0] == pytest.approx(estimate.weight_sync_s, rel=1e-12)
    assert in_group == pytest.approx(estimate.weight_sync_s, rel=1e-12)
    assert tables.score(grouping, [option]) == pytest.approx(estimate.iteration_s, rel=1e-9)
    reshard = tables.same_group_weight_sync(devices)  # what it was charged before: a reshard in HBM
    assert in_group > reshard


def test_a_replica_leader_on_each_host_feeds_its_own_host_in_the_planner_too() -> None:
    """Two hosts, one actor_train replica on each (the group option's layouts): the second replica's leader feeds
    its own host's generation (WeightSync.feeders, runtime/weightsync.feed_specs), so the sync crosses no host;
    the ILP's same-group table, the hybrid's terms and evaluate() charge that, below the relay from replica 0's
    leader over the LAN (what all three charged before)."""
    profile = load_artifact(str(ROOT / "profiles" / "paper-single-region.json"), ClusterProfile)
    w = paper_workload("8b", "grpo", "sync")
    cm = CostModel(profile, w)
    tables = Tables(cm, profile, w)
    grouping = (tuple(tables.tasks),)
    devices = tuple(sorted(d.id for d in profile.devices if d.id.split("/")[0] in ("a100-0", "a100-1")))
    option = tables.group_option(grouping[0], devices)
    assert option is not None
    by_task = {p.task: p for p in option.placements}
    train = by_task["actor_train"]
    relay = cm.syncs.actor_relay(train, by_task["generation"])
    assert relay is not None and len(relay) == 3
    receivers, in_place, feeders = relay
    assert {d.split("/")[0] for d in feeders} == {"a100-1"}
    estimate = cm.evaluate(tables.groups(grouping, [option]), tables.placements([option]))
    in_group = tables.same_group_weight_sync(devices, option.placements)
    assert in_group == pytest.approx(estimate.weight_sync_s, rel=1e-12)
    assert tables.terms(grouping, [option])[0] == pytest.approx(estimate.weight_sync_s, rel=1e-12)
    from_leader = cm.weight_sync_s(train.devices, receivers, "actor", tuple(d for d in in_place if d not in feeders))
    assert in_group < from_leader
    _, remote_s, label, _, _ = cm.weight_sync_parts(train.devices, receivers, "actor", in_place, feeders)
    assert label == cm.cluster.links.intra("a100-0").label or remote_s == 0  # no copy over the LAN
