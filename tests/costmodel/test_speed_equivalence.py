"""The optimised cost model predicts exactly what the reference recorded before optimisation did.

Seeded random placements (tests/costmodel/speed_cases.py) on profiles/paper-multi-region-hybrid.json: a few
hundred task() calls (alone, with colocated names or placements, given shares/splits, offload) and whole-plan
evaluate() calls over four workloads (one calibrated). Floats must agree within 1e-12 relative; strings,
memory bytes, shares and splits exactly."""

from __future__ import annotations

import json
import math

import pytest
from tests.costmodel import speed_cases

REL = 1e-12


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(speed_cases.DATA.read_text())


@pytest.fixture(scope="module")
def current() -> dict:
    return speed_cases.compute_all()


def _same(a, b, where: str) -> None:
    if isinstance(a, float | int) and isinstance(b, float | int) and float in (type(a), type(b)):
        assert math.isclose(a, b, rel_tol=REL, abs_tol=0.0) or a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("workload", sorted(speed_cases.workloads()))
def test_task_predictions_unchanged(reference: dict, current: dict, workload: str) -> None:
    ref, now = reference[workload]["tasks"], current[workload]["tasks"]
    assert len(ref) == len(now) == speed_cases.N_TASKS
    for i, (a, b) in enumerate(zip(now, ref, strict=True)):
        _same(a, json.loads(json.dumps(b)), f"{workload} task case {i}")


@pytest.mark.parametrize("workload", sorted(speed_cases.workloads()))
def test_plan_evaluations_unchanged(reference: dict, current: dict, workload: str) -> None:
    ref, now = reference[workload]["plans"], current[workload]["plans"]
    assert len(ref) == len(now) == speed_cases.N_PLANS
    for i, (a, b) in enumerate(zip(now, ref, strict=True)):
        _same(json.loads(json.dumps(a)), b, f"{workload} plan case {i}")


def test_cached_calls_agree_with_first_calls() -> None:
    """A second pass over the same cases (all cache hits) returns the same numbers as the first."""
    prof = speed_cases.profile()
    w, cal = speed_cases.workloads()["ppo-8b"]
    cm = speed_cases.CostModel(prof, w, cal)
    cases = speed_cases.task_cases(7, speed_cases.PPO_TASKS, 60, prof)
    first = [speed_cases.record_task(cm.task(p, g)) for p, g in cases]
    again = [speed_cases.record_task(cm.task(p, g)) for p, g in cases]
    fresh = speed_cases.CostModel(prof, w, cal)
    reordered = [speed_cases.record_task(fresh.task(p, g)) for p, g in reversed(cases)][::-1]
    assert first == again == reordered


def test_shared_class_estimates_equal_fresh_ones() -> None:
    """Class-level estimates are shared between group contexts that differ only in what cannot change them
    (costmodel.tasks.class_inputs): one placement scored next to many different mates on one warm model must equal
    the same call on a fresh model, where nothing is shared."""
    import random

    prof = speed_cases.profile()
    for name in ("ppo-8b", "grpo-4b-async"):
        w, cal = speed_cases.workloads()[name]
        tasks = speed_cases.PPO_TASKS if w.algorithm == "ppo" else speed_cases.GRPO_TASKS
        rng = random.Random(5)
        warm = speed_cases.CostModel(prof, w, cal)
        base = speed_cases.task_cases(21, tasks, 12, prof)
        for placement, _ in base:
            others = [t for t in tasks if t != placement.task]
            contexts = [None, *(tuple(rng.sample(others, k)) for k in range(1, len(others) + 1))]
            contexts += [(t,) for t in others]
            for group in contexts:
                shared = speed_cases.record_task(warm.task(placement, group))
                fresh = speed_cases.record_task(speed_cases.CostModel(prof, w, cal).task(placement, group))
                assert shared == fresh, f"{name}: {placement.task} next to {group}"
        seen = {
            (c["cost"]["total_s"], c["violation"]) for c in (speed_cases.record_task(warm.task(p)) for p, _ in base)
        }
        assert len(seen) > 3  # the cases differ: the comparison is not between identical trivial estimates
