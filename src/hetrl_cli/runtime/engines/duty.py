"""The worker's side of the engine contract: when a rank's engine sleeps and wakes, and how the trainer's weights
reach it (bucketed, in the workload's precision).

Colocated generation (the rank also runs other tasks, actor_train among them): the engine sleeps at level 2 as
soon as its rollout is done (weights and caches freed: the trainer's weights replace them at the next sync, as
the cost model's memory model assumes, costmodel/memory.py) and wakes just before the next rollout, so one
step on such a rank reads

    wake < generate < sleep < (experience, train) < load_weights < wake < generate ...

Every engine event is recorded with the time it happened; the worker writes them, with its phase entries, to
logs/rank-N.events (one JSON line per step) so a run shows the order it really ran in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hetrl_cli.runtime.engines import DEFAULT_BUCKET_BYTES, Bucket, RolloutEngine, buckets

if TYPE_CHECKING:
    from torch import Tensor

SLEEP_LEVEL = 2
"""Colocated engines discard their weights while asleep: the trainer sends them anyway after training."""


class EngineDuty:
    """One rank's engine as the worker drives it (every call also records an event)."""

    def __init__(
        self, engine: RolloutEngine, colocated: bool, dtype: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> None:
        self.engine = engine
        self.colocated = colocated and engine.can_sleep
        """Whether the engine sleeps between rollouts (it shares its device with other tasks and can free it)."""
        self.dtype = dtype
        """The workload's torch dtype: the weights reach the engine in it."""
        self.bucket_bytes = bucket_bytes
        self.events: list[tuple[float, str]] = []
        self.needs_load = False
        """Asleep at level 2 with no weights loaded since: waking now would generate with discarded weights."""
        self.memory: dict[str, int] = {}
        """The engine's memory_report just before and after its last sleep."""
        self.version = -1
        """The engine's weights: 0 = the first ones it was loaded with (the run's start or resume), +1 a load;
        in a fresh run version v holds the weights of step v's update."""
        self.rollouts: list[tuple[int, int]] = []
        """(step, weights version) of every rollout sampled since the last step record."""

    def record(self, what: str) -> None:
        self.events.append((time.perf_counter(), what))

    @contextmanager
    def generating(self, sleep_after: bool = True, step: int | None = None):
        """Wake the engine (if asleep) for the block; colocated, put it back to sleep after unless `sleep_after`
        is False (another rollout follows before the next weight load: async's first two steps). `step`: the
        step whose rollout this is (recorded with the weights version it is sampled with)."""
        if self.needs_load:
            raise RuntimeError("the engine discarded its weights (sleep level 2) and none were loaded since")
        if getattr(self.engine, "asleep", 0):
            self.engine.wake()
            self.record("wake")
        self.record("generate")
        if step is not None:
            self.rollouts.append((step, self.version))
        yield self.engine
        if self.colocated and sleep_after:
            awake = self.engine.memory_report()
            self.engine.sleep(SLEEP_LEVEL)
            self.needs_load = SLEEP_LEVEL == 2
            self.record("sleep")
            asleep = self.engine.memory_report()
            self.memory = {
                "weights_bytes_awake": awake.weights_bytes,
                "weights_bytes_asleep": asleep.weights_bytes,
                "process_bytes_awake": awake.process_bytes,
                "process_bytes_asleep": asleep.process_bytes,
            }

    def load(self, named: Iterable[tuple[str, Tensor]]) -> None:
        """The trainer's full weights into the engine, cast to the workload's precision one tensor at a time and
        handed over in buckets (never all at once)."""
        self.engine.load_weights(buckets(self._cast(named), self.bucket_bytes))
        self.needs_load = False
        self.version += 1
        self.record("load_weights")

    def load_buckets(self, named_buckets: Iterable[Bucket]) -> None:
        """Buckets (a sync channel's, as they arrive; or the rank's own trainer's) into the engine, each cast to
        the workload's precision (a no-op for a channel's: they travel in it)."""
        self.engine.load_weights(list(self._cast(bucket)) for bucket in named_buckets)
        self.needs_load = False
        self.version += 1
        self.record("load_weights")

    def _cast(self, named: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in named:
            yield name, tensor.detach().to(self.dtype)

    def step_record(self, step: int, phases: list[tuple[float, str]]) -> dict[str, Any]:
        """One events line: this step's engine events and the worker's phase entries (`phases`: (time, name)) in
        time order, the rollouts sampled ([step, weights version]) and the memory around the last sleep; the
        events are then cleared (swapped out at once: async's receive thread records events too)."""
        events, self.events = self.events, []
        rollouts, self.rollouts = self.rollouts, []
        merged = sorted([*events, *phases])
        line = {"step": step, "events": [what for _, what in merged], "memory": self.memory}
        line["engine"] = self.engine.describe()  # which engine ran, and vLLM's TP shape as its workers report it
        return line | {"rollouts": [list(r) for r in rollouts]}


def sync_bucket_bytes() -> int:
    """Weight-sync bucket size: HETRL_SYNC_BUCKET_MB (MiB) when set, else engines.DEFAULT_BUCKET_BYTES."""
    import os

    value = os.environ.get("HETRL_SYNC_BUCKET_MB", "").strip()
    try:
        mib = float(value) if value else 0.0
    except ValueError:
        raise RuntimeError(
            f"HETRL_SYNC_BUCKET_MB={value!r} is not a number of MiB; unset it or give one, e.g. 256"
        ) from None
    return int(mib * 2**20) if mib > 0 else DEFAULT_BUCKET_BYTES


def duty_for(generator: Any, tasks: Any, offloads: Any, precision: str) -> EngineDuty | None:
    """A rank's engine driver (None without generation): it sleeps between rollouts when generation shares the rank
    with other tasks (not when offloaded: the offload moves it already); weights arrive in the workload's
    precision in buckets of HETRL_SYNC_BUCKET_MB (default 256 MiB)."""
    from hetrl_cli.runtime.precision import torch_dtype

    if generator is None:
        return None
    colocated = generator.engine.replica_colocated(len(set(tasks)) > 1 and "generation" not in offloads)
    return EngineDuty(generator.engine, colocated, torch_dtype(precision), sync_bucket_bytes())
