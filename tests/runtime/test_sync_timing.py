"""Which ranks time a step's weight sync (runtime/weightsync.times_sync; the step's weight_sync_s is the longest).

The sync ends when its slowest feed has delivered: replica 0's leader of actor_train is one sender, but each
other replica leader that feeds its own host (feed_specs) gathers its replica and sends in parallel, and the
critic's leader sends the critic after the actor. Before, only the actor's replica-0 leader (and ranks updating
their engine in place) timed the sync, so a slower feeding replica or the critic's sync was not in weight_sync_s;
the cost model prices the slowest feed (WeightSync.parts: the longest relay tree; gather_s: the slowest gather).
"""

from __future__ import annotations

from types import SimpleNamespace

from hetrl_cli.runtime.comm import Groups
from hetrl_cli.runtime.layout import Layout
from hetrl_cli.runtime.weightsync import sync_specs, times_sync

from .plans import hand_plan, on, replica, tiny_workload

A0, A1, B0, B1 = "a0/0", "a0/1", "b0/0", "b0/1"


def _timing(plan, engine: str = "hf") -> set[str]:
    """The devices whose ranks time the weight sync."""
    layout = Layout.from_plan(plan)
    groups = Groups(world=None, members=sync_specs(layout, engine, False))
    gen = set(layout.tasks["generation"].ranks)
    timed = set()
    for rank, device in enumerate(layout.devices):
        w = SimpleNamespace(rank=rank, layout=layout, groups=groups, overlapped=False,
                            generator=object() if rank in gen else None)  # fmt: skip
        w.leads = lambda task, r=rank: task in layout.tasks and layout.tasks[task].leader == r
        w.params_sharded = lambda task: False
        if times_sync(w):
            timed.add(device)
    return timed


def test_a_replica_leader_feeding_its_own_host_times_its_feed() -> None:
    workload = tiny_workload(actor={"arch": "tiny"}, precision="bf16")
    train = [replica([[A0, A1]], 0.5), replica([[B0, B1]], 0.5)]
    gen = [(A0, 0.25), (A1, 0.25), (B0, 0.25), (B1, 0.25)]
    plan = hand_plan(workload, on(B0, ["reference", "reward"]) | {"actor_train": train, "generation": gen})
    assert _timing(plan) == {A0, B0}  # before: {A0}, b0's feed (gather + relay) went unreported


def test_the_critic_leader_times_the_critic_sync() -> None:
    workload = tiny_workload(algorithm="ppo", precision="bf16")
    placement = on(A0, ["generation", "actor_train"]) | on(A1, ["reference", "reward"])
    plan = hand_plan(workload, placement | on(B0, ["critic_train"]) | on(B1, ["critic_inference"]))
    assert _timing(plan) == {A0, B0}  # before: {A0}; the critic's sync (its leader on b0) was not timed
    shared = hand_plan(workload, placement | on(B0, ["critic_train", "critic_inference"]))
    assert _timing(shared) == {A0}  # critic inference on the trained critic: no critic sync to time
