"""The cost model's caches, said once: a table of results of one pure computation, by key.

A CostModel's profile, workload and calibration never change, so nothing it computes goes stale; the planner
calls `CostModel.task()` tens of thousands of times over few distinct shapes, and each level of an estimate
(device layout, stage, split, replica, class-level estimate, whole task) repeats far more often than it
differs. One `Memo` per level keeps what it computed, for the model's lifetime.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
_MISSING = object()


class Memo(dict, Generic[T]):
    """`memo(*args)`: make(*args), computed once per distinct arguments. `memo.keyed(key, *args)`: the same
    where the result depends on less than the arguments (or on something derived from them): `key` says what
    it depends on. A stored result is shared: callers must not mutate it.

    It is a dict (key → result), so the few lookups hot enough for a Python call to show (tens of thousands
    per search) read it first: `hit = memo.get(key)`, then `memo.keyed(key, ...)` only when it is None."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[..., T]) -> None:
        super().__init__()
        self.make = make

    def __call__(self, *args: Hashable) -> T:
        value = self.get(args, _MISSING)
        if value is _MISSING:  # most calls miss at some levels: no KeyError raised and caught per miss
            value = self[args] = self.make(*args)
        return value

    def keyed(self, key: Hashable, *args: object) -> T:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = self[key] = self.make(*args)
        return value
