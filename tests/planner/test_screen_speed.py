"""The screen's CPU savings (issue 24, item 2: the hybrid's 2 s on a loaded box) change none of its numbers: its
tables are kept up to date per class mask and equal a rebuild, the whole-class plans work out no partial-row
proxy, and the branch and bound's fit test is the plain one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.hybrid import Hybrid
from hetrl_cli.planner.screen import SMALL_LEVEL, Screen, _code, _fitting, _mask
from hetrl_cli.planner.search import Budget
from hetrl_cli.planner.space import groupings
from hetrl_cli.planner.tables import Tables

from .conftest import cluster, workload


def _screen(algorithm: str = "ppo", mode: str = "sync") -> Screen:
    """Three classes of two one-GPU hosts each (7 masks, 26 rows), tables built."""
    profile = cluster(
        "three-classes",
        [
            {"gpu": "A100 80GB", "gpus_per_node": 1, "nodes": 2, "region": "r1"},
            {"gpu": "L4", "gpus_per_node": 1, "nodes": 2, "region": "r1"},
            {"gpu": "H100 SXM", "gpus_per_node": 1, "nodes": 2, "region": "r2"},
        ],
    )
    w = workload(algorithm, mode)
    search = Hybrid(Tables(CostModel(profile, w), profile, w), 0)
    screen = Screen(search, groupings(search.tables.tasks), Budget(None, None))
    assert screen.build_tables()
    return screen


def _rebuilt(screen: Screen, subset) -> list:
    """The table as the screen worked it out before (every row again after each exact entry)."""
    out = []
    for row in screen.rows:
        if (subset, row) in screen.exact:
            phases = screen.exact[(subset, row)]
        elif (proxy := screen.proxy(subset, row)) is not None:
            phases = tuple(x * screen._correction(subset, row) for x in proxy)
        else:
            phases = None
        if phases is not None:
            out.append((row, phases))
    return out


def test_tables_kept_by_class_mask_equal_a_rebuild_and_rework_only_that_mask():
    screen = _screen()
    subsets = sorted({s for g in screen.groupings for s in g})
    for s in subsets:
        screen.table(s)
    corrections = []
    correction = screen._correction

    def counted(subset, row):
        corrections.append(row)
        return correction(subset, row)

    screen._correction = counted
    made = 0
    for gi in range(0, len(screen.groupings), 3):
        for _, rows in screen.best_plans(gi, set())[:1]:
            for subset, row in zip(screen.groupings[gi], rows, strict=True):
                if (subset, row) in screen.exact:
                    continue
                screen.make_exact(subset, row)
                made += 1
                corrections.clear()
                for s in subsets:  # what changed: the rows over the exact entry's classes, nothing else
                    screen.table(s)
                assert corrections and {_mask(r) for r in corrections} == {_mask(row)}
                for s in subsets:
                    assert screen.table(s) == _rebuilt(screen, s)
    assert made >= 5


@pytest.mark.parametrize(("algorithm", "mode"), [("grpo", "sync"), ("ppo", "async")])
def test_whole_class_plans_work_out_no_partial_row(algorithm, mode):
    screen = _screen(algorithm, mode)
    best = screen._class_plans({}, {})
    assert best < float("inf")
    assert screen.proxies and all(screen._whole(row) for _, row in screen.proxies)
    for subset in {s for g in screen.groupings for s in g}:  # the same rows as the whole table's
        assert screen.whole_table(subset) == [(r, ph) for r, ph in screen.table(subset) if screen._whole(r)]


@pytest.mark.parametrize("rows", [SMALL_LEVEL // 2, SMALL_LEVEL * 5])
def test_fit_test_is_the_plain_one(rows):
    """Both paths (Python for short levels, numpy for long ones) list the rows that fit, in order."""
    rng = random.Random(rows)
    capacity = (3, 5, 2, 7)
    width = max(capacity).bit_length() + 1
    guard = sum(1 << (c * width + width - 1) for c in range(len(capacity)))
    level = [tuple(rng.randint(0, n) for n in capacity) for _ in range(rows)]
    ints = [_code(r, width) for r in level]
    codes = np.array(ints, dtype=np.int64)
    for _ in range(50):
        left = tuple(rng.randint(0, n) for n in capacity)
        end = rng.randint(0, rows)
        plain = [i for i in range(end) if all(a <= b for a, b in zip(level[i], left, strict=True))]
        assert _fitting(_code(left, width), guard, codes, ints, end) == plain
