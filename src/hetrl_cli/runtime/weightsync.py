"""The worker's weight syncs: one sync over its group (`sync_group`), and async mode's actor sync overlapped with
generation (generation on ranks of its own: `Worker.overlapped`).

One-step off-policy: the rollouts of step k+1 are sampled with the weights of step k-1's update while step k
trains (docs/run.md). So the weights of step k are needed only before the rollout of step k+2, and their sync
may run as soon as step k's update ends, while the generation ranks still sample step k+1:

    trainer     train k ──send W_k (isend, returns)── rollout exchange ── train k+1 ── send W_k+1 ...
    generation  sample k+1 (W_k-1) │ receive W_k on a thread ......│ exchange │ wait, load W_k │ sample k+2 (W_k)

The receive runs on a thread into host memory (one bucket on the device at a time); the engine loads the
staged buckets only between rollouts, never during one, so the staleness stays exactly one step. The trainer's
sends are non-blocking (comm.WeightChannel, `wait=False`) and drained before its next sync. The cost model
prices what this gets (costmodel/compose.py, ASYNC_LANES).
"""

from __future__ import annotations

import threading
from typing import Any

from hetrl_cli.runtime.engines import Bucket


class OverlappedSync:
    """One rank's part of the overlapped actor sync; the worker calls `begin_step` at the start of every step
    and `send` right after its update."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.thread: threading.Thread | None = None
        self.staged: list[Bucket] = []
        self.error: BaseException | None = None
        self.sent_checksum: str | None = None
        """The leader's checksum of the weights it last sent with `send` (--verify-weights): the engines hold
        them from the start of the next step on."""

    def begin_step(self, step: int, first: int, last: int, timer: Any) -> None:
        """Generation ranks: load the weights received during the last step (waiting for the rest), then start
        receiving this step's while this step's rollout is sampled. The leader: the weights the engines hold
        from now on are the ones it sent last."""
        w = self.worker
        if self.sent_checksum is not None:
            w.synced_checksum, self.sent_checksum = self.sent_checksum, None
        if w.generator is None:
            return
        if step > first:
            with timer.phase("weight_sync"):
                self.finish()
        if step < last:
            self.start()

    def send(self, step: int, last: int, timer: Any) -> None:
        """Training ranks, right after the update of `step`: the leader gathers the weights and puts them on the
        wire without waiting (the rest of the replica takes part in the gather)."""
        w = self.worker
        if w.generator is None and step < last:
            with timer.phase("weight_sync"):
                w.sync_actor(wait=False)

    def start(self) -> None:
        """Receive the trainer's next weights on a thread, staging each bucket in host memory."""
        w = self.worker
        self.staged, self.error = [], None
        w.duty.record("receive")
        self.thread = threading.Thread(target=self._receive, name="hetrl-weight-receive", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        import contextlib

        import torch

        w = self.worker
        cuda = str(w.device).startswith("cuda")
        try:  # a stream of its own: the receive does not queue behind the rollout's kernels
            with torch.cuda.stream(torch.cuda.Stream(w.device)) if cuda else contextlib.nullcontext():
                sync_group(w, "actor_train", "generation", None, None, self._stage)
            w.duty.record("received")
        except BaseException as exc:  # re-raised on the main thread by finish()
            self.error = exc

    def _stage(self, stream: Any) -> None:
        for bucket in stream:
            self.staged.append([(name, tensor.cpu()) for name, tensor in bucket])  # each bucket a fresh buffer

    def finish(self) -> None:
        """Wait for the receive to end, then load the staged weights into the engine (between rollouts)."""
        if self.thread is None:
            return
        self.thread.join()
        self.thread = None
        if self.error is not None:
            raise RuntimeError(f"the overlapped weight receive failed: {self.error}") from self.error
        staged, self.staged = self.staged, []
        self.worker.duty.load_buckets(staged)


def sync_specs(layout: Any, engine: str, critic_zero3: bool = False, actor_zero3: bool = False) -> dict[str, list[int]]:
    """The run's weight-sync groups: `sync:actor`, the actor leader and the generation ranks that load the weights
    (`Layout.sync_ranks` less `engine_followers`), and with a critic `sync:critic`, its leader and the
    critic_inference ranks that hold a copy of their own (`Layout.sync_ranks` less `critic_shared_ranks`, which
    run inference on the trained critic itself). `critic_zero3`/`actor_zero3`: the trainer's weights are zero3
    chunks. Each is split by host where other replicas' leaders feed their own hosts (`feed_specs`)."""
    followers = engine_followers(layout, engine)
    leader = layout.tasks["actor_train"].leader
    actor = [r for r in layout.sync_ranks("actor_train", "generation") if r == leader or r not in followers]
    specs = feed_specs("sync:actor", layout, "actor_train", actor, actor_zero3)
    if "critic_train" in layout.tasks:
        shared, critic_leader = critic_shared_ranks(layout, critic_zero3), layout.tasks["critic_train"].leader
        ranks = layout.sync_ranks("critic_train", "critic_inference")
        critic = [r for r in ranks if r == critic_leader or r not in shared]
        specs |= feed_specs("sync:critic", layout, "critic_train", critic, critic_zero3)
    return specs


def feed_specs(name: str, layout: Any, source: str, members: list[int], zero3: bool) -> dict[str, list[int]]:
    """`name` (replica 0's leader and the receivers it relays to) and `name@<leader>` for each other replica
    whose leader feeds the receivers on its own host (costmodel.weightsync.host_feeds): after the optimizer
    step every replica holds the same full weights, and each such leader gathers its own replica's, so no full
    copy crosses that host's boundary (a replica wholly on the host first). Not under zero3 (one gather over
    every replica's chunks feeds them all)."""
    from hetrl_cli.costmodel.weightsync import host_feeds
    from hetrl_cli.runtime.layout import split_device_id

    task, host = layout.tasks[source], lambda r: split_device_id(layout.devices[r])[0]
    if zero3:
        return {name: members}
    whole = sorted(task.replicas[1:], key=lambda rep: len({host(r) for r in rep.ranks}) > 1)  # gathers in a host
    feeds = host_feeds([task.replicas[0].grid[0][0], *(rep.grid[0][0] for rep in whole)],
                       [r for r in members if r != task.leader], host)  # fmt: skip
    specs = {name: sorted({task.leader, *feeds.pop(task.leader)})}
    return specs | {f"{name}@{lead}": sorted({lead, *fed}) for lead, fed in feeds.items()}


def gathers(w: Any, task: str) -> bool:
    """Whether rank `w` takes part in gathering `task`'s full weights for its sync: replica 0's ranks (and every
    rank under zero3: `in_first_replica`), and those of a replica whose leader feeds a group (`feed_specs`)."""
    if w.in_first_replica(task):
        return True
    rep = w.layout.tasks[task].replica_of(w.rank)
    return rep is not None and w.groups.size(f"sync:{task.removesuffix('_train')}@{rep.grid[0][0]}") > 0


def sync_membership(w: Any, source: str) -> tuple[str, int] | None:
    """(the sync group of `source` rank `w` is in, that group's sending leader); None when in none."""
    group = "sync:" + source.removesuffix("_train")
    for name in w.groups.members:
        if (name == group or name.startswith(group + "@")) and w.groups.has(name, w.rank):
            return name, (int(name.rpartition("@")[2]) if "@" in name else w.layout.tasks[source].leader)
    return None


def times_sync(w: Any) -> bool:
    """Whether rank `w`'s weight_sync seconds are sync work, not waiting for training to end (the step's
    weight_sync_s is the longest of these, as the slowest feed sets when generation can start): every sending
    leader (replica 0's of actor_train, each replica leader feeding its own host: `feed_specs`, and the critic's
    where its sync moves anything), a rank updating its engine from its own replica (in parallel with the others),
    and an overlapped-async generation rank's receive. Before, only the actor's replica-0 leader of the senders."""
    layout = w.layout
    if w.leads("actor_train") or (w.overlapped and w.generator is not None):
        return True
    if w.generator is not None and w.rank in layout.self_synced_ranks("actor_train", "generation"):
        return True
    critic = critic_sync_moves(layout, w.params_sharded("critic_train"))
    sources = ["actor_train", "critic_train"] if critic else ["actor_train"]
    return any((m := sync_membership(w, s)) is not None and m[1] == w.rank for s in sources if s in layout.tasks)


def critic_shared_ranks(layout: Any, zero3: bool) -> set[int]:
    """Ranks whose critic inference runs on the trained critic itself: their critic_inference replica is laid out
    exactly like their critic_train replica (same ranks by stage and TP index, same layer split); under zero3
    (critic_train's weights chunked over its replicas) only when every replica of both is, in order, so that the
    chunks' gathers are collective over the same ranks. The critic sync has nothing to send them."""
    tasks = layout.tasks
    if "critic_train" not in tasks or "critic_inference" not in tasks:
        return set()
    infer, train = tasks["critic_inference"], tasks["critic_train"]
    key = lambda rep: (rep.grid, rep.layer_split)  # noqa: E731
    if zero3:
        return set(infer.ranks) if [key(r) for r in infer.replicas] == [key(r) for r in train.replicas] else set()
    trained = {key(rep) for rep in train.replicas}
    return {r for rep in infer.replicas if key(rep) in trained for r in rep.ranks}


def critic_sync_moves(layout: Any, zero3: bool) -> bool:
    """Whether the critic sync has anything to do: some critic_inference rank holds a copy of its own (else every
    one runs on the trained critic, and even the leader's gather of the full weights is skipped)."""
    if "critic_train" not in layout.tasks or "critic_inference" not in layout.tasks:
        return False
    shared = critic_shared_ranks(layout, zero3)
    return any(r not in shared for r in layout.tasks["critic_inference"].ranks)


def engine_followers(layout: Any, engine: str) -> set[int]:
    """Generation ranks the weights need not reach: with an engine whose TP replica's leader alone loads them
    (vLLM: the leader hands each bucket to vLLM, whose TP workers take their slices from it), every other rank of
    each replica. With the hf engine every TP rank keeps its own slices, so none."""
    from hetrl_cli.runtime.engines import ENGINES

    spec = ENGINES.get(engine)
    if spec is None or not spec.leader_loads or "generation" not in layout.tasks:
        return set()
    return {r for rep in layout.tasks["generation"].replicas for r in rep.ranks if r != rep.grid[0][0]}


def sync_group(w: Any, source: str, target: str, trainer: Any, gathered: Any, load: Any, wait: bool = True) -> None:
    """One weight sync `source` -> `target` of worker `w` over `sync:<role>`: `gathered` is the leader's full
    weights, `load` takes an iterable of buckets of full weights into this rank's inference copy (None: nothing
    to load here; the buckets still pass through: a relay member forwards them). A rank with an engine but not
    in the group (a follower of its replica's leader: `sync_specs`) loads an empty stream, so its engine's duty
    still records the load (version, sleep/wake state) as every rank of its replica does."""
    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.engines import buckets
    from hetrl_cli.runtime.engines.duty import sync_bucket_bytes
    from hetrl_cli.runtime.precision import torch_dtype

    bucket_bytes = sync_bucket_bytes()
    member = sync_membership(w, source)  # a feeding replica's leader sends even where self-synced
    if member is None and w.rank in w.layout.self_synced_ranks(source, target):
        if load is not None:  # this rank's own replica holds the same trained weights
            load(buckets(gathered if gathered is not None else trainer.named_weights(), bucket_bytes))
    elif member is not None:
        group, leader = member
        named = gathered if w.rank == leader else None
        channel = w.channels.get(group)
        if channel is None:
            chain = [r for r in w.layout.sync_chain(source, target) if r != leader and w.groups.has(group, r)]
            chain = [leader, *chain]  # a feeding replica's leader first, then its host's receivers
            dtype = torch_dtype(w.workload.precision)
            channel = comm.WeightChannel(leader, w.groups.get(group), w.groups.size(group), chain, w.device, dtype,
                                         bucket_bytes)  # fmt: skip
            w.channels[group] = channel
        stream = channel.stream(named, wait=wait)
        if load is not None:
            load(stream)
        for _ in stream:  # whatever the loader left (none normally): every member moves every bucket
            pass
    elif load is not None:  # its replica's leader loads the weights for the replica: nothing reaches this rank
        load(iter(()))
