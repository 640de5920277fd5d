"""Iteration composition: how task times, transfers and the weight sync add up to one RL step.

Pure functions over plain numbers, so the ILP can mirror them exactly (docs/costmodel.md, 'Composition').

SYNC (on-policy, strict phase order):
    iteration = Σ_k span_k + Σ_b transfer_b + weight_sync
    span_k    = max over groups g of Σ_{tasks of g in phase k} t_task       (PHASES in types.py)
    transfer_b= Σ over the (src, dst) group pairs handing data across boundary b (after phases 1 and 2);
                the hand-overs funnel through the single controller, so they add up
ASYNC (one-step off-policy; only when the generation group holds generation alone):
    iteration = max(span_1 + weight_sync, transfer_1 + span_2 + transfer_2 + span_3)
    generation of step t+1 overlaps the rest of step t; otherwise async falls back to sync.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetrl_cli.costmodel.types import GroupPlacement


def spans(phases: Sequence[dict[str, float]]) -> list[float]:
    """Per phase, the slowest group's summed task time."""
    return [max(p.values(), default=0.0) for p in phases]


def is_async_split(groups: Sequence[GroupPlacement]) -> bool:
    """Whether generation has a group to itself (the condition for the async overlap)."""
    return any(g.tasks == ("generation",) or list(g.tasks) == ["generation"] for g in groups)


def compose_iteration(
    phases: Sequence[dict[str, float]], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> float:
    """Iteration seconds from phase times (per group), boundary transfers and the weight sync."""
    s = spans(phases)
    b = list(boundary_s) + [0.0] * (2 - len(boundary_s))
    if asynchronous:
        return max(s[0] + weight_sync_s, b[0] + s[1] + b[1] + s[2])
    return sum(s) + sum(b) + weight_sync_s


def critical_groups(
    phases: Sequence[dict[str, float]], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> list[str | None]:
    """Per phase, the group on the critical path (None where the phase is off it, e.g. async lanes)."""
    argmax = [max(p, key=p.__getitem__) if p else None for p in phases]
    if not asynchronous:
        return argmax
    s = spans(phases)
    b = list(boundary_s) + [0.0] * (2 - len(boundary_s))
    if s[0] + weight_sync_s >= b[0] + s[1] + b[1] + s[2]:
        return [argmax[0], None, None]
    return [None, argmax[1], argmax[2]]
