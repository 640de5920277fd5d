"""planner/space.py's `groupings` leaves nothing to the cyclic collector: its set partitions came from a recursive
closure, which refers to itself through its cell (function -> closure cell -> function), so every call left a cycle
that only gc.collect() freed (as the cost model's memos did before 5000a1e; tests/planner/test_plan_frees_memory.py)."""

from __future__ import annotations

import gc

from hetrl_cli.artifacts.rl import ALGORITHMS
from hetrl_cli.planner.space import groupings


def _bell(n: int) -> int:
    """The number of set partitions of n items (the Bell triangle's last entry)."""
    row = [1]
    for _ in range(n - 1):
        nxt = [row[-1]]
        for value in row:
            nxt.append(nxt[-1] + value)
        row = nxt
    return row[-1]


def test_groupings_leaves_no_garbage_to_the_collector() -> None:
    tasks = ALGORITHMS["ppo"].tasks
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        found = groupings(tasks)
        gc.set_debug(gc.DEBUG_SAVEALL)
        assert gc.collect() == 0, [type(o).__qualname__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert len(found) == len(set(found)) == _bell(len(tasks))  # every partition, each once
