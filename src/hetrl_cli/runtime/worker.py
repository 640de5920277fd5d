"""The per-process worker: `python -m hetrl_cli.runtime.worker --run-dir DIR`, one process per plan device.

Started by accelerate/torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment).
It reads plan.json and launch.json from the run directory, holds the roles its device runs, and executes
the RL step exactly as the plan lays it out. One step, in order (every rank walks the same phases and skips
the ones it has no part in; see docs/run.md):

  1. generate     generation replicas sample their share of the step's sequences        (sync mode)
  2. rollouts     all-gather of the rollouts over the world group
  3. experience   reference / reward / critic inference and the actor's old log-probs on their shares,
                  all-gathered over the rest group; advantages computed from the whole batch
  4. train        actor (and critic) update on their shares, gradients summed over each DP group
  5. weight sync  actor leader -> generation ranks, critic leader -> critic-inference ranks
                  (with TP/PP the leader first gathers the full weights from its replica's ranks)
  6. report       per-rank timings and sums gathered to rank 0 -> metrics.jsonl; checkpoint every N steps

Async mode: generation ranks sample step t+1 (with the weights of step t-1's update, one step stale) while the
rest trains on step t; the rollouts are exchanged after training. With generation on ranks of its own the actor's
weights of step t are sent right after its update and received while step t+1 is sampled (runtime/weightsync.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.rl import ALGORITHMS, TRAIN_TASKS
from hetrl_cli.runtime import algorithms as alg
from hetrl_cli.runtime import comm, tracking
from hetrl_cli.runtime.checkpoint import CheckpointError
from hetrl_cli.runtime.engines.duty import duty_for
from hetrl_cli.runtime.layout import ZERO_KINDS, Layout, Position
from hetrl_cli.runtime.roles import (
    Actor,
    Critic,
    Generator,
    Reference,
    RewardModel,
    Rollout,
    RuleReward,
    pad_rows,
)
from hetrl_cli.runtime.rundir import LaunchManifest, RunDir, now_iso
from hetrl_cli.runtime.weightsync import OverlappedSync


class _Prefixed:
    """A text stream that prefixes every line with `[rank N]` and tees it to the rank's log file."""

    def __init__(self, stream: TextIO, prefix: str, log: TextIO) -> None:
        self.stream, self.prefix, self.log, self._at_start = stream, prefix, log, True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            out.append((self.prefix if self._at_start else "") + piece)
            self._at_start = piece.endswith("\n")
        joined = "".join(out)
        self.stream.write(joined)
        self.log.write(joined)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the torchrun agent) dies: no orphan workers."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Timer:
    """Seconds (and, given a meter, peak memory bytes) per phase of one step on this rank."""

    def __init__(self, meter: tracking.PeakMemory | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.meter = meter
        self.peak: dict[str, int] = {}
        self.entered: list[tuple[float, str]] = []
        """(time, phase) of every phase entry, in order (the engine event log merges its events with them)."""

    @contextmanager
    def phase(self, name: str):
        if self.meter:
            self.meter.reset()
        start = time.perf_counter()
        self.entered.append((start, name))
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if self.meter:
                self.peak[name] = max(self.peak.get(name, 0), self.meter.peak_bytes())


class Worker:
    """The roles of one rank and the RL step over them."""

    def __init__(self, run: RunDir, plan: Plan, manifest: LaunchManifest, rank: int) -> None:
        self.rundir, self.plan, self.manifest, self.rank = run, plan, manifest, rank
        self.workload = wl = plan.workload
        self.layout = Layout.from_plan(plan, manifest.devices)
        self.tasks = self.layout.tasks_of(rank)
        self.device = self._torch_device()
        self.memory = tracking.PeakMemory(self.device)
        self.tracker: tracking.MetricsTracker | None = None  # opened by run(), once the first step is known
        self.groups = comm.make_groups(self._group_specs(), manifest.collective_timeout_s)
        self._build_roles()
        self.offloads = self._offloads()
        from hetrl_cli.runtime.datasets import load_dataset

        self.records = load_dataset(wl.dataset, wl.seed)
        self.pending: list[Rollout] = []
        self.synced_checksum: str | None = None
        """Checksum of the actor weights last sent to generation (--verify-weights, on the leader)."""
        self.channels: dict[str, comm.WeightChannel] = {}
        self.overlapped = plan.workload.mode == "async" and self.layout.overlaps_generation()
        """Async with generation on ranks of its own: the actor's sync overlaps generation and the next training
        step (the leader sends right after its update; generation receives while it samples: weightsync.py)."""
        self.overlap = OverlappedSync(self)
        self.duty = duty_for(self.generator, self.tasks, self.offloads, wl.precision)
        """This rank's engine as the step drives it (sleep/wake when colocated, bucketed loads); None without one."""

    def leads(self, task: str) -> bool:
        """Whether this rank leads replica 0 of `task` (weight-sync source, checkpoint writer)."""
        return task in self.layout.tasks and self.layout.tasks[task].leader == self.rank

    def position(self, task: str) -> Position | None:
        return self.layout.tasks[task].position(self.rank) if task in self.layout.tasks else None

    def in_first_replica(self, task: str) -> bool:
        """Ranks of replica 0 of `task` take part in gathering its full weights (sync, checksum, checkpoint); under
        zero3 every rank of the task does (its gathers are collective over the replicas)."""
        pos = self.position(task)
        return pos is not None and (pos.replica == 0 or self.params_sharded(task))

    def params_sharded(self, task: str) -> bool:
        """ZeRO-3 chunks (runtime/zero3.py): the task's passes and gathers are collective over its replicas."""
        return self.sharded(task) and self.workload.sharding == "zero3"

    def parallel(self, task: str):
        """This rank's place in `task` with the process groups of its replica (parallel.Parallel)."""
        from hetrl_cli.runtime.parallel import Parallel

        return Parallel.of(self.layout.tasks[task], self.rank, self.groups)

    def dp(self, task: str) -> tuple[Any, int]:
        from hetrl_cli.runtime.parallel import dp_group

        return dp_group(self.layout.tasks[task], self.rank, self.groups)

    def sharded(self, task: str) -> bool:
        """Whether `task`'s optimizer state is ZeRO-sharded across its replicas (workload sharding, dp > 1)."""
        replicas = len(self.layout.tasks[task].replicas) if task in self.layout.tasks else 0
        return self.workload.sharding in ZERO_KINDS and task in TRAIN_TASKS and replicas > 1

    def zero(self, task: str):
        """This rank's sharding.Zero for a training task (kind "none" when not sharded)."""
        from hetrl_cli.runtime.sharding import Zero, zero_for

        if not self.sharded(task):
            return Zero()
        return zero_for(self.layout.tasks[task], self.rank, self.groups, self.workload.sharding)

    # setup -----------------------------------------------------------------------------------------------
    def _torch_device(self) -> str:
        """The plan device's GPU on this host under the CUDA backend, else the CPU (runtime/devices.py)."""
        from hetrl_cli.runtime.devices import worker_device

        return worker_device(self.manifest.backend, self.manifest.devices[self.rank])

    def _group_specs(self) -> dict[str, list[int]]:
        lay = self.layout
        specs: dict[str, list[int]] = {}
        for name, tl in lay.tasks.items():
            specs.update(tl.group_specs(zero=self.sharded(name)))
        specs["rest"] = lay.rest_ranks
        from hetrl_cli.runtime.weightsync import sync_specs

        zero3 = self.params_sharded("critic_train")  # vLLM's TP followers and a shared critic take no weights
        return specs | sync_specs(lay, self.manifest.engine, zero3, self.params_sharded("actor_train"))

    def _model_dir(self, role: str) -> Path:
        from hetrl_cli.runtime.tinymodel import resolve_model_dir

        spec = self.workload.model_for(role)  # type: ignore[arg-type]
        assert spec is not None
        return resolve_model_dir(spec.path, spec.arch, self.rundir.models, self.workload.seed)

    def _build_roles(self) -> None:
        from hetrl_cli.runtime.tinymodel import load_tokenizer

        wl, tasks, dev = self.workload, self.tasks, self.device
        actor_dir = self._model_dir("actor")
        self.tokenizer = load_tokenizer(actor_dir)
        pad = self.tokenizer.pad_token_id
        self.generator = self.actor = self.reference = self.critic = self.critic_infer = self.reward = None
        if "generation" in tasks:
            self.generator = Generator(self._engine(actor_dir), self.tokenizer, wl.max_response_tokens,
                                       wl.rl.temperature, wl.seed)  # fmt: skip
        if "actor_train" in tasks:
            self.actor = Actor(actor_dir, wl.rl, wl.algorithm, wl.optimizer, wl.ppo_epochs, pad, wl.micro_batch, dev,
                               self.parallel("actor_train"), self.zero("actor_train"), wl.recompute,
                               wl.precision)  # fmt: skip
        if "reference" in tasks:
            ref_dir = self._model_dir("reference")
            self.reference = Reference(ref_dir, pad, wl.micro_batch, dev, self.parallel("reference"), wl.precision)

        def critic(task: str) -> Critic:
            train = task == "critic_train"
            return Critic(self._model_dir("critic"), wl.rl, wl.optimizer, wl.ppo_epochs, pad, wl.micro_batch, wl.seed,
                          dev, self.parallel(task), self.zero(task) if train else None,
                          wl.recompute and train, wl.precision, frozen=not train)  # fmt: skip

        if "critic_train" in tasks:
            self.critic = critic("critic_train")
        if "critic_inference" in tasks:
            self.critic_infer = self.critic if self._critic_shared() else critic("critic_inference")
        if "reward" in tasks:
            if wl.reward is None:
                self.reward = RuleReward(wl.reward_rule, self.tokenizer)
            else:
                self.reward = RewardModel(self._model_dir("reward"), pad, wl.micro_batch, wl.seed, dev,
                                          self.parallel("reward"), wl.precision)  # fmt: skip

    def _offloads(self):
        """A sharding.Offload for each task of this rank whose placement says `offload`: what the cost model
        (costmodel/memory.py) keeps off the device between the task's phases. Training: the optimizer state
        (the weights stay: the trainer is their home); inference and generation: the weights (none for a rule
        reward, nor for critic inference that runs on the trained critic)."""
        from hetrl_cli.runtime.sharding import Offload

        wanted = {t.task for t in self.plan.tasks if t.offload} & set(self.tasks)
        out = {}
        for task in sorted(wanted):
            modules, optimizers = [], []
            if task == "actor_train":
                optimizers.append(self.actor.optimizer)
            elif task == "critic_train":
                optimizers.append(self.critic.optimizer)
            elif task == "generation":
                from hetrl_cli.runtime.engines import offloadable_model

                modules.append(offloadable_model(self.generator.engine))
            elif task == "critic_inference":
                if self.critic_infer is not self.critic:
                    modules.append(self.critic_infer.model)
            else:  # reference, reward (a rule reward holds no model)
                role = self.reference if task == "reference" else self.reward
                if getattr(role, "model", None) is not None:
                    modules.append(role.model)
            out[task] = Offload(task, self.device, tuple(modules), tuple(optimizers))
        return out

    @contextmanager
    def resident(self, task: str):
        """An offloaded task's state on the device for the block, back in host memory after it."""
        off = self.offloads.get(task)
        if off is None:
            yield
            return
        off.to_device()
        try:
            yield
        finally:
            off.to_host()

    def _critic_shared(self) -> bool:
        """Critic inference reuses the trained critic when this rank's inference replica is laid out exactly like
        its training replica (same ranks, same layer split; weightsync.critic_shared_ranks, which the critic sync
        leaves out); every rank of the replica decides the same way."""
        from hetrl_cli.runtime.weightsync import critic_shared_ranks

        return self.rank in critic_shared_ranks(self.layout, self.params_sharded("critic_train"))

    def _engine(self, model_dir: Path):
        """The launch's engine (runtime/engines builds it), on this rank's device and generation position."""
        from hetrl_cli.runtime.engines import EngineBuild, build_engine
        from hetrl_cli.runtime.engines.budget import engine_budget

        wl = self.workload
        memory_bytes, kv_cache_bytes = engine_budget(self.plan, self.manifest.devices[self.rank])
        at = EngineBuild(
            model_dir=model_dir,
            device=self.device,
            parallel=self.parallel("generation"),
            seed=wl.seed,
            max_model_len=wl.max_prompt_tokens + wl.max_response_tokens,
            dtype=wl.precision,
            memory_bytes=memory_bytes,
            kv_cache_bytes=kv_cache_bytes,
            keep_loaded=self.manifest.verify_weights,  # vLLM's host copy of each load, for the checksum
        )
        return build_engine(self.manifest.engine, at)

    # the run ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        first = self.restore()
        for off in self.offloads.values():  # between its phases an offloaded task's state lives on the host
            off.to_host()
        if self.offloads:
            moved = ", ".join(sorted(self.offloads))
            print(f"offload: {moved} state kept in host memory between phases (device {self.device})", flush=True)
        if self.rank == 0:
            self.tracker = tracking.open_tracker(self.rundir.root, self.manifest.tensorboard, first_step=first)
        last = self.manifest.steps
        asynchronous = self.workload.mode == "async"
        self.sync_weights()  # generation starts from the trainer's weights (a resumed run's included)
        if asynchronous and first <= last:
            # the next rollout (step first+1's, inside the loop) comes before any weight load: no sleep between
            self.pending = self.share_rollouts(self.generate(first, awake_after=first < last))
        for step in range(first, last + 1):
            timer = Timer(self.memory)
            started = time.perf_counter()
            if self.overlapped:  # load the weights received during the last step, receive this step's meanwhile
                self.overlap.begin_step(step, first, last, timer)
            if asynchronous:
                rollouts = self.pending
                mine_next = self.generate(step + 1, timer) if step < last else []
            else:
                rollouts = self.share_rollouts(self.generate(step, timer), timer)
            report = self.train_on(step, rollouts, timer)
            if self.overlapped:  # the training side: the leader's sends run on during the exchange and next step
                self.overlap.send(step, last, timer)
            if asynchronous and step < last:
                self.pending = self.share_rollouts(mine_next, timer)
            with timer.phase("weight_sync"):
                if self.overlapped:
                    self.sync_critic()
                else:
                    self.sync_weights()
            self.report(step, rollouts, report, timer, time.perf_counter() - started)
            self.maybe_checkpoint(step)
        for channel in self.channels.values():
            channel.drain()

    def prompts(self, step: int) -> list[tuple[int, tuple[int, ...]]]:
        """(sequence index, prompt ids) of every sequence of the step: prompt i repeated G times."""
        from hetrl_cli.runtime.datasets import encode_prompts, step_records

        wl = self.workload
        records = step_records(self.records, step, wl.prompts_per_step, wl.seed)
        encoded = encode_prompts(self.tokenizer, records, wl.dataset.chat_template)
        out = []
        for i, ids in enumerate(encoded):
            ids = tuple(ids[-wl.max_prompt_tokens :])
            out.extend((i * wl.responses_per_prompt + j, ids) for j in range(wl.responses_per_prompt))
        return out

    def generate(self, step: int, timer: Timer | None = None, awake_after: bool = False) -> list[Rollout]:
        """Phase 1: this rank's generation share of `step` (nothing on non-generation ranks)."""
        if self.generator is None:
            return []
        lo, hi = self.layout.tasks["generation"].range_of(self.rank)
        timer = timer or Timer()
        with timer.phase("generation"), self.resident("generation"), self.duty.generating(not awake_after, step):
            mine = self.generator.generate(step, self.prompts(step)[lo:hi])
        pos = self.position("generation")
        return mine if pos is not None and pos.tp_rank == 0 else []  # TP peers hold the same rollouts

    def share_rollouts(self, mine: list[Rollout], timer: Timer | None = None) -> list[Rollout]:
        """Phase 2: every rank gets every rollout of the step, ordered by sequence index."""
        from hetrl_cli.runtime.wire import all_gather_rollouts

        with (timer or Timer()).phase("rollout_transfer"):
            return all_gather_rollouts(mine, self.groups.world, self.layout.world_size, self.device)

    def train_on(self, step: int, rollouts: list[Rollout], timer: Timer) -> dict[str, Any]:
        """Phases 3-4 on the rest ranks: experience, advantages, actor/critic updates."""
        if self.rank not in self.layout.rest_ranks:
            return {}
        exp = self.experience(step, rollouts, timer)
        return self.update(rollouts, exp, timer)

    def _share(self, task: str, rollouts: list[Rollout]) -> tuple[int, list[Rollout]]:
        lo, hi = self.layout.tasks[task].range_of(self.rank)
        return lo, rollouts[lo:hi]

    def experience(self, step: int, rollouts: list[Rollout], timer: Timer) -> dict[str, list[Any]]:
        """Phase 3: each inference task on its share, then an all-gather over the rest group."""
        from hetrl_cli.runtime.datasets import step_records
        from hetrl_cli.runtime.wire import all_gather_experience

        mine: dict[str, dict[int, Any]] = {}

        def record(field: str, start: int, values: list[Any]) -> None:
            mine.setdefault(field, {}).update({start + i: v for i, v in enumerate(values)})

        if self.reference is not None:
            with timer.phase("reference"), self.resident("reference"):
                record("ref_logp", *self._apply("reference", rollouts, self.reference.logprobs))
        if self.reward is not None:
            records = step_records(self.records, step, self.workload.prompts_per_step, self.workload.seed)
            group = self.workload.responses_per_prompt
            with timer.phase("reward"), self.resident("reward"):
                start, share = self._share("reward", rollouts)
                record("score", start, self.reward.scores(share, [records[r.index // group] for r in share]))
        if self.critic_infer is not None:
            with timer.phase("critic_inference"), self.resident("critic_inference"):
                record("values", *self._apply("critic_inference", rollouts, self.critic_infer.values))
        if self.actor is not None and not self.actor.reuses_old_logprobs:
            with timer.phase("actor_train"):  # the old log-probs are part of the actor_train task
                record("old_logp", *self._apply("actor_train", rollouts, self.actor.logprobs))
        with timer.phase("experience_transfer"):  # tensors in bounded buckets (runtime/wire.py)
            return all_gather_experience(mine, self.groups.get("rest"), self.groups.size("rest"), len(rollouts),
                                         self.device)  # fmt: skip

    def _apply(self, task: str, rollouts: list[Rollout], fn) -> tuple[int, list[Any]]:
        start, share = self._share(task, rollouts)
        zero3 = self.params_sharded("critic_train" if task == "critic_inference" else task)
        return start, fn(share) if share or zero3 else []  # zero3: an empty share still joins the gathers

    def update(self, rollouts: list[Rollout], exp: dict[str, list[Any]], timer: Timer) -> dict[str, Any]:
        """Phase 4: advantages over the whole batch (identical on every rest rank), then the DP updates."""
        import torch

        wl = self.workload
        steps = max(len(r.response_ids) for r in rollouts)
        mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
        scores = torch.tensor(exp["score"], dtype=torch.float32)
        ref = pad_rows(exp["ref_logp"], steps)
        # one GRPO update per batch: the update's own forward gives the old log-probs (Actor.reuses_old_logprobs)
        old = pad_rows(exp["old_logp"], steps) if "old_logp" in exp else None
        total_tokens = float(mask.sum())
        spec = ALGORITHMS[wl.algorithm]
        values = pad_rows(exp["values"], steps) if spec.critic else None
        advantages, returns = alg.ADVANTAGES[spec.advantage](scores, old, ref, values, mask, wl)
        report: dict[str, Any] = {}
        if self.rank == self.layout.rest_ranks[0]:
            lengths = [len(r.response_ids) for r in rollouts]
            report["stats"] = {
                "reward_mean": float(scores.mean()),
                "reward_std": float(scores.std()) if len(scores) > 1 else 0.0,
                "response_length_mean": sum(lengths) / len(lengths),
                "response_tokens": sum(lengths),
            }
            if old is not None:  # else merge_reports takes it from the update's KL sum (the same k3 of the same logp)
                report["stats"]["kl_ref_k3"] = float(alg.masked_mean(alg.kl_k3(old, ref), mask))
        if self.actor is not None:
            lo, hi = self.layout.tasks["actor_train"].range_of(self.rank)
            with timer.phase("actor_train"), self.resident("actor_train"):
                sums = self.actor.train_step(rollouts[lo:hi], advantages[lo:hi], None if old is None else old[lo:hi],
                                             ref[lo:hi], total_tokens, self.dp("actor_train"))  # fmt: skip
            if self.actor.shard.par.pos.output:  # one report per replica: its last stage, TP index 0
                report["actor"] = sums
        if self.critic is not None:
            assert returns is not None and values is not None
            lo, hi = self.layout.tasks["critic_train"].range_of(self.rank)
            with timer.phase("critic_train"), self.resident("critic_train"):
                sums = self.critic.train_step(rollouts[lo:hi], returns[lo:hi], values[lo:hi], total_tokens,
                                              self.dp("critic_train"))  # fmt: skip
            if self.critic.shard.par.pos.output:
                report["critic"] = sums
        return report

    def sync_weights(self) -> None:
        """Phase 5: send the trained weights to the ranks that run inference with them (actor, then critic)."""
        self.sync_actor()
        self.sync_critic()

    def sync_actor(self, wait: bool = True) -> None:
        """The leader of actor_train gathers the full weights from the ranks of its replica (TP shards, PP
        stages), then sends them in bounded buckets over sync:actor in the workload's precision; every generation
        rank loads each bucket into its engine as it arrives, keeping its own TP slices. A generation engine on a
        rank that holds a whole training replica itself (the leader's, or any one-rank replica colocated with
        one-rank generation) is updated in place from its own tensors, bucket by bucket, with no transfer.
        `wait=False`: the leader returns with its sends on the wire (overlapped async)."""
        from hetrl_cli.runtime.weightsync import gathers  # replica 0 and the replicas feeding their own hosts

        gathered = None
        if self.actor is not None and gathers(self, "actor_train"):
            gathered = self.actor.named_weights()
            if self.manifest.verify_weights and self.leads("actor_train"):
                from hetrl_cli.runtime.engines import checksum_named
                from hetrl_cli.runtime.precision import torch_dtype

                dtype = torch_dtype(self.workload.precision)  # every engine holds the weights in it
                checksum = checksum_named((n, t.to(dtype)) for n, t in gathered)  # what they hold once loaded
                if wait:
                    self.synced_checksum = checksum
                else:  # overlapped async: the engines hold them from the next step on (weightsync.py)
                    self.overlap.sent_checksum = checksum
        load = self.duty.load_buckets if self.duty is not None else None
        self._sync("actor_train", "generation", self.actor, gathered, load, wait)

    def sync_critic(self) -> None:
        """PPO: the critic_train leader's weights to the critic_inference ranks with a copy of their own (blocking;
        none where every one runs on the trained critic: weightsync.critic_sync_moves)."""
        from hetrl_cli.runtime.weightsync import critic_sync_moves, gathers

        if not critic_sync_moves(self.layout, self.params_sharded("critic_train")):
            return
        critic_named = None
        if self.critic is not None and gathers(self, "critic_train"):
            critic_named = self.critic.named_weights()
        separate = self.critic_infer is not None and self.critic_infer is not self.critic
        load = (lambda named_buckets: [self.critic_infer.load_weights(b) for b in named_buckets]) if separate else None
        self._sync("critic_train", "critic_inference", self.critic, critic_named, load)

    def _sync(self, source: str, target: str, trainer: Any, gathered: Any, load: Any, wait: bool = True) -> None:
        """One weight sync `source` -> `target` (runtime/weightsync.py)."""
        from hetrl_cli.runtime.weightsync import sync_group

        sync_group(self, source, target, trainer, gathered, load, wait)

    # reporting and checkpoints ---------------------------------------------------------------------------
    def times_weight_sync(self) -> bool:
        """Whether this rank's weight_sync seconds are sync work (weightsync.times_sync: every sending leader, a
        rank updating its engine from its own replica, an overlapped receive); the step's is the longest."""
        from hetrl_cli.runtime.weightsync import times_sync

        return times_sync(self)

    def report(self, step: int, rollouts: list[Rollout], report: dict[str, Any], timer: Timer, step_s: float) -> None:
        """Phase 6: gather every rank's timings and sums to rank 0, which appends one metrics line."""
        report["seconds"] = dict(timer.seconds)
        if not self.times_weight_sync():
            report["seconds"].pop("weight_sync", None)  # elsewhere the sync time is mostly waiting for training
        report["rank"] = self.rank
        report["memory"] = [self.memory.measure, timer.peak]
        if self.duty is not None:  # the order the engine really slept, woke and loaded in (engines/duty.py)
            with open(self.rundir.log(self.rank, "events"), "a", encoding="utf-8") as events:
                events.write(json.dumps(self.duty.step_record(step, timer.entered)) + "\n")
        if self.manifest.verify_weights and self.generator is not None:
            report["engine_checksum"] = self.generator.engine.weights_checksum()
        if self.synced_checksum is not None:
            report["actor_checksum"] = self.synced_checksum  # the weights the engines were last sent
        gathered = comm.gather_to_zero(report)
        if gathered is None:
            return
        line = merge_reports(self.layout, step, gathered, step_s, self.workload.mode)
        self.rundir.append_metrics(line)
        if self.tracker is not None:
            self.tracker.log(line)
        secs = line["seconds"]
        print(
            f"step {step}/{self.manifest.steps} reward {line['reward_mean']:.3f}±{line['reward_std']:.3f} "
            f"kl {line['kl_ref_k3']:.4f} len {line['response_length_mean']:.1f} "
            f"| {step_s:.2f}s: gen {secs.get('generation', 0):.2f} train {secs.get('actor_train', 0):.2f} "
            f"sync {line['weight_sync_s']:.3f}",
            flush=True,
        )

    def trainers(self) -> dict[str, Any]:
        """The trained roles this rank holds a part of, by checkpoint role name."""
        return {name: role for name, role in (("actor", self.actor), ("critic", self.critic)) if role is not None}

    def maybe_checkpoint(self, step: int) -> None:
        """A sharded checkpoint every N steps and after the last (runtime/checkpoint.py; collective)."""
        from hetrl_cli.runtime.checkpoint import save_checkpoint, training_identity

        every, last = self.manifest.checkpoint_every, self.manifest.checkpoint_last
        if not ((every and step % every == 0) or (last and step == self.manifest.steps)):
            return
        meta = {"run_id": self.manifest.run_id, "plan": self.plan.name, "training": training_identity(self.workload)}
        save_checkpoint(self.rundir, step, self.trainers(), meta, self.rank, self.layout.world_size)

    def restore(self) -> int:
        """The first step to run: 1, or the step after the checkpoint the launcher chose when resuming."""
        from hetrl_cli.runtime.checkpoint import load_checkpoint

        if not self.manifest.resume:
            return 1
        if self.manifest.resume_from is None:
            raise CheckpointError(f"{self.rundir.manifest}: --resume without a checkpoint named; rerun hetrl run")
        path = self.rundir.checkpoints / self.manifest.resume_from
        step = load_checkpoint(path, self.trainers())
        if self.rank == 0:
            self.rundir.truncate_metrics(step)
            print(f"resuming after step {step} from {path}", flush=True)
        return step + 1


def merge_reports(layout: Layout, step: int, reports: list[dict[str, Any]], step_s: float, mode: str) -> dict[str, Any]:
    """One metrics line from every rank's report: a task's time is its slowest replica's."""
    seconds: dict[str, float] = {}
    for rep in reports:
        for name, value in rep["seconds"].items():
            seconds[name] = max(seconds.get(name, 0.0), value)
    line: dict[str, Any] = {"step": step, "time": now_iso(), "mode": mode, "step_s": step_s}
    for rep in reports:
        line.update(rep.get("stats", {}))
    line.update(tracking.memory_fields(layout.devices, reports))
    actor = [rep["actor"] for rep in reports if "actor" in rep]
    tokens = sum(a["tokens"] for a in actor) or 1.0
    line["pg_loss"] = sum(a["pg_loss_sum"] for a in actor) / tokens
    line["kl"] = sum(a["kl_sum"] for a in actor) / tokens
    line["clip_frac"] = sum(a["clipped_sum"] for a in actor) / tokens
    line["grad_norm"] = actor[0]["grad_norm"] if actor else 0.0
    line.setdefault("kl_ref_k3", line["kl"])  # old log-probs taken from the update: its k3 sum is the same quantity
    critic = [rep["critic"] for rep in reports if "critic" in rep]
    if critic:
        line["vf_loss"] = sum(c["vf_loss_sum"] for c in critic) / (sum(c["vf_tokens"] for c in critic) or 1.0)
    line["weight_sync_s"] = seconds.pop("weight_sync", 0.0)
    line["seconds"] = seconds
    # each device's own phase seconds: which replica of a task is its straggler (the max above hides it)
    line["device_seconds"] = {layout.devices[rep["rank"]]: rep["seconds"] for rep in reports}
    line["tokens_per_s"] = line.get("response_tokens", 0) / step_s if step_s > 0 else 0.0
    if seconds.get("generation"):
        line["generation_tokens_per_s"] = line.get("response_tokens", 0) / seconds["generation"]
    if any("actor_checksum" in rep for rep in reports):
        line["actor_checksum"] = next(rep["actor_checksum"] for rep in reports if "actor_checksum" in rep)
        line["engine_checksums"] = sorted({rep["engine_checksum"] for rep in reports if "engine_checksum" in rep})
    return line


def _setup_process(run: RunDir, rank: int) -> None:
    """Prefixed, teed output; a pid file the launcher can stop; quiet HF progress bars; one thread per core."""
    run.logs.mkdir(parents=True, exist_ok=True)
    log = open(run.log(rank, "log"), "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (lives as long as the process)
    sys.stdout = _Prefixed(sys.stdout, f"[rank {rank}] ", log)  # type: ignore[assignment]
    sys.stderr = _Prefixed(sys.stderr, f"[rank {rank}] ", log)  # type: ignore[assignment]
    run.log(rank, "pid").write_text(f"{os.getpid()}\n")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _die_with_parent()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetrl-worker", description="One hetrl RL worker process.")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    _setup_process(run, rank)
    try:
        import torch

        from hetrl_cli.profiling.probe import usable_cores

        # threads from the cores this process may use (a cgroup quota included): more threads than a 0.25-core
        # quota spin in OpenMP barriers and run many times slower than one
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        torch.set_num_threads(max(1, int(usable_cores() // local)))
        manifest = load_artifact_manifest(run)
        plan = load_artifact(run.plan, Plan)
        if len(manifest.devices) != world:
            raise RuntimeError(f"launched with WORLD_SIZE={world} but the plan has {len(manifest.devices)} devices")
        prepare_models(run, plan)  # before torch.distributed: transformers saves only on rank 0 once it is up
        from hetrl_cli.runtime.devices import worker_device

        worker_device(manifest.backend, manifest.devices[rank])  # NCCL wants the rank's GPU set before it starts
        comm.init_world(manifest.backend, manifest.collective_timeout_s)
        Worker(run, plan, manifest, rank).run()
        comm.leave_world()
        run.log(rank, "done").write_text(now_iso() + "\n")
        return 0
    except CheckpointError as exc:  # a cause the user can act on (ENOSPC, a corrupt checkpoint): one line
        run.log(rank, "error").write_text(f"{exc}\n")
        print(f"worker failed: {exc}", file=sys.stderr, flush=True)
        return 1
    except BaseException as exc:
        run.log(rank, "error").write_text(traceback.format_exc())
        print(f"worker failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1
    finally:
        _shutdown()


def prepare_models(run: RunDir, plan: Plan) -> None:
    """Build (or find) every built-in model the workload names, on this host, before the process groups exist."""
    from hetrl_cli.runtime.tinymodel import resolve_model_dir

    for role in ("actor", "reference", "critic", "reward"):
        spec = plan.workload.model_for(role)  # type: ignore[arg-type]
        if spec is not None:
            resolve_model_dir(spec.path, spec.arch, run.models, plan.workload.seed)


def load_artifact_manifest(run: RunDir) -> LaunchManifest:
    return LaunchManifest.model_validate_json(run.manifest.read_text(encoding="utf-8"))


def _shutdown() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


if __name__ == "__main__":
    comm.exit_process(main())  # not sys.exit: Python's teardown races gloo's threads (comm.exit_process)
