"""The cost model's caches, said once: a table of results of one pure computation, by key.

A CostModel's profile, workload and calibration never change, so nothing it computes goes stale; the planner
calls `CostModel.task()` tens of thousands of times over few distinct shapes, and each level of an estimate
(device layout, stage, split, replica, class-level estimate, whole task) repeats far more often than it
differs. One `Memo` per level keeps what it computed, for the model's lifetime.

A memo made from its owner's bound method (`self._stages = Memo(self._make_stage)`) keeps the method's
function and only a weak reference to the owner: a strong one (the bound method) would make owner → memo →
method → owner a reference cycle, and then a dropped CostModel with every table it filled (hundreds of
thousands of objects after a planner search) would wait for the cyclic garbage collector, which frees it
inside whatever runs next (the next `make_plan`'s timed budget). Without the cycle it is freed when dropped.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
_MISSING = object()


class Memo(dict, Generic[T]):
    """`memo(*args)`: make(*args), computed once per distinct arguments. `memo.keyed(key, *args)`: the same
    where the result depends on less than the arguments (or on something derived from them): `key` says what
    it depends on. A stored result is shared: callers must not mutate it.

    It is a dict (key → result), so the few lookups hot enough for a Python call to show (tens of thousands
    per search) read it first: `hit = memo.get(key)`, then `memo.keyed(key, ...)` only when it is None.

    `make` a bound method: the memo holds its function and a weak reference to its object (no reference
    cycle when the object holds the memo); the object must outlive the memo's use, as its own attribute does,
    and be truthy (no falsy `__len__`/`__bool__`: the miss path tests it with `or`, one check the fewest steps)."""

    __slots__ = ("make", "owner")

    def __init__(self, make: Callable[..., T]) -> None:
        super().__init__()
        if isinstance(make, types.MethodType):
            self.make: Callable[..., T] = make.__func__
            self.owner: weakref.ref | None = weakref.ref(make.__self__)
        else:
            self.make = make
            self.owner = None

    def __call__(self, *args: Hashable) -> T:
        value = self.get(args, _MISSING)
        if value is _MISSING:  # most calls miss at some levels: no KeyError raised and caught per miss
            owner = self.owner  # the miss path inlined: no extra call per miss
            value = self[args] = self.make(*args) if owner is None else self.make(owner() or _freed(self), *args)
        return value

    def keyed(self, key: Hashable, *args: object) -> T:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            owner = self.owner
            value = self[key] = self.make(*args) if owner is None else self.make(owner() or _freed(self), *args)
        return value


def _freed(memo: Memo) -> None:
    """A memo called after its owner was freed: say so (else the function would get None as its self)."""
    raise ReferenceError(f"Memo of {memo.make.__qualname__}: its object was freed before this call")
