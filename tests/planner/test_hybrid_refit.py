"""The hybrid's move toward a fit (`Hybrid.refit`) and the screen's rank of a grouping whose scored plans all
failed to fit, on held-out u19 (docs/benchmarks.md, "Held-out uneven settings (seed 1)"): the ILP's optimum puts
reference and both 14B trainers on the H200 host and the 4-A100 host together, and every plan the screen scored
for that grouping gave the trainers fewer large-memory GPUs (each task fits there alone, not next to its mates)."""

from __future__ import annotations

import math

from hetrl_cli.costmodel.model import CostModel
from hetrl_cli.planner.hybrid import Hybrid
from hetrl_cli.planner.search import Budget
from hetrl_cli.planner.space import groupings
from hetrl_cli.planner.tables import Tables

from .test_heldout import U19, U19_WORKLOAD, setting

OPTIMUM = (("generation",), ("reference", "actor_train", "critic_train"), ("reward",), ("critic_inference",))


def u19_hybrid() -> Hybrid:
    profile, workload = setting(U19, U19_WORKLOAD)
    return Hybrid(Tables(CostModel(profile, workload), profile, workload), seed=0)


def test_refit_moves_a_genome_whose_group_does_not_fit_to_one_that_fits():
    """The screen's best unscored plan of the optimum's grouping: trainers on H200 + 3 RTX 4090 + 6 V100 (no fit
    next to each other); refit trades the trainers' slowest blocks for the fastest ones other groups hold."""
    hybrid = u19_hybrid()
    seed = [1, 2, 0, 3, 1, 3, 3, 1]  # blocks: H200, A100x4, A100x2, A100x2, 4090x3, 4090x3, 4090x6, V100x6
    assert hybrid._score(OPTIMUM, seed).options is None
    child = hybrid.refit(OPTIMUM, seed)
    assert child is not None and sorted(child) == sorted(seed)  # trades keep every group's block count
    assert child[:2] == [1, 1]  # the trainers hold the H200 and the 4-A100 host, as in the ILP's optimum
    assert hybrid.refit(OPTIMUM, [1, 1, 0, 3, 2, 2, 3, 3]) is None  # the ILP's optimum: every group fits


def test_the_screen_ranks_a_grouping_whose_scored_plans_failed_by_its_best_plan():
    """Before, a grouping whose scored plans all failed to fit had key inf and ranked last of 52 (the hybrid then
    reached it past 1024 evaluations, never); now its best plan's value ranks it."""
    hybrid = u19_hybrid()
    all_groupings = groupings(hybrid.tables.tasks)
    screened = hybrid.screen(all_groupings, Budget(None, 256))
    optimum = next(gi for gi, g in enumerate(all_groupings) if sorted(map(sorted, g)) == sorted(map(sorted, OPTIMUM)))
    assert optimum in screened
    assert math.isfinite(screened[optimum].key)
