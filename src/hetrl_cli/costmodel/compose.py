"""Iteration composition: how task times, transfers and the weight sync add up to one RL step.

The one definition (docs/costmodel.md, 'Composition'). The cost model's `evaluate` (and so `simulate`), the
planner's tables, hybrid and screen compute the iteration with `iteration_s`; the ILP writes one row per lane
(T ≥ Σ of the lane's terms) from `lanes`, so no solver carries a copy of the formula.

An iteration is the slowest of its *lanes*; a lane is a sum of named terms:
    span:k       phase k's span: the slowest group's summed task time in the phase (PHASES in artifacts/rl.py);
                 tasks of a group share devices (they add up), groups run side by side (max)
    boundary:b   the data hand-overs across boundary b (after phases 1 and 2); they funnel through the
                 single controller, so they add up
    weight_sync  the weight syncs (the actor's, then the critic's)
SYNC (on-policy, strict phase order): one lane of every term.
    iteration = Σ_k span_k + Σ_b boundary_b + weight_sync
ASYNC (one-step off-policy; only when the generation group holds generation alone, else as sync): generation
of step t+1 (G = span_1, with the weights of step t-1) overlaps the rest of step t (R = boundary_1 + span_2 +
boundary_2 + span_3), and the weight sync of step t (W) starts when step t's update ends and runs while step t+1
is still sampled; the next rollout waits for it (runtime/weightsync.py). In the steady state, with P the
iteration: the sync of the last step ends R + W after the last iteration began, so the rollout starts
max(0, R + W - P) into this one and P = max(R, max(0, R + W - P) + G); one sync at a time, P >= W. Hence
    iteration = max(G, R, (G + W + R) / 2, W)
(the third lane: the sync straddles the iteration boundary, half of it behind each lane). It is never more
than the old max(G + W, R), which priced the receive before the rollout, and equals it when R >= G + W.

A lane adds its terms in the order written, each inner tuple first: the order of floating-point additions
is part of the definition, so every user gets the same seconds to the last digit.

Floors: a phase span may have a floor, seconds the phase takes on no device. The planner passes the
rule-based reward's driver time as phase 2's floor (`Tables.floor`, docs/planner.md); the cost model's
`evaluate` passes none, because it leaves the rule-based reward out of the iteration (it overlaps phase 2
on the driver and is ~1e-4 of a step: docs/costmodel.md, 'Not modelled'). The two agree whenever a device
task of phase 2 takes longer than the reward's driver time, as the reference always does in the shipped
workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from hetrl_cli.artifacts.rl import TaskName
from hetrl_cli.costmodel.types import GroupPlacement

SPANS = ("span:1", "span:2", "span:3")
"""The phase spans, in PHASES order."""
BOUNDARIES = ("boundary:1", "boundary:2")
"""The transfers after phase 1 (rollouts) and after phase 2 (experience)."""
WEIGHT_SYNC = "weight_sync"
TERMS = (*SPANS, *BOUNDARIES, WEIGHT_SYNC)

Lane = tuple[tuple[str, ...], ...]
"""Terms summed in order, each inner tuple first."""
SYNC_LANES: tuple[Lane, ...] = ((SPANS, BOUNDARIES, (WEIGHT_SYNC,)),)
_TRAINING = (BOUNDARIES[0], SPANS[1], BOUNDARIES[1], SPANS[2])
ASYNC_LANES: tuple[Lane, ...] = (
    ((SPANS[0],),),
    (_TRAINING,),
    ((SPANS[0], WEIGHT_SYNC), _TRAINING),
    ((WEIGHT_SYNC,),),
)
SCALES = {False: (1.0,), True: (1.0, 1.0, 0.5, 1.0)}
"""Each lane's factor (its sum is multiplied by it; 1.0 lanes are not multiplied at all)."""
_INDEX = {term: i for i, term in enumerate(TERMS)}
_BY_INDEX = {
    mode: tuple(tuple(tuple(_INDEX[t] for t in part) for part in lane) for lane in lanes)
    for mode, lanes in ((False, SYNC_LANES), (True, ASYNC_LANES))
}
"""The lanes as positions in (span:1, span:2, span:3, boundary:1, boundary:2, weight_sync): the screen's
branch and bound composes millions of times, so no dict per call."""


def lanes(asynchronous: bool) -> tuple[Lane, ...]:
    """The lanes of an iteration (module docstring); `asynchronous`: the async overlap applies."""
    return ASYNC_LANES if asynchronous else SYNC_LANES


def scales(asynchronous: bool) -> tuple[float, ...]:
    """Each lane's factor, in `lanes(asynchronous)` order: a row is T >= factor x the lane's sum."""
    return SCALES[asynchronous]


def overlaps(mode: str, task_sets: Iterable[Sequence[TaskName]]) -> bool:
    """Whether the async overlap applies: an async workload whose generation group holds generation alone."""
    return mode == "async" and any(tuple(tasks) == ("generation",) for tasks in task_sets)


def is_async_split(groups: Sequence[GroupPlacement]) -> bool:
    """Whether generation has a group to itself (the condition for the async overlap)."""
    return any(tuple(g.tasks) == ("generation",) for g in groups)


def span(group_s: Iterable[float], floor: float | None = None) -> float:
    """A phase's span from the phase seconds of the groups holding a task of it, at least `floor` if given."""
    if floor is None:
        return max(group_s, default=0.0)
    slowest = max(group_s, default=floor)
    return slowest if slowest > floor else floor


def spans(phases: Sequence[dict[str, float]], floor: Sequence[float] | None = None) -> list[float]:
    """Per phase, the slowest group's summed task time (at least the phase's floor, if given)."""
    return [span(p.values(), None if floor is None else floor[k]) for k, p in enumerate(phases)]


def lane_values(
    span_s: Sequence[float], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> list[float]:
    """Each lane's seconds, in `lanes(asynchronous)` order; missing boundaries count 0."""
    if len(boundary_s) < len(BOUNDARIES):
        boundary_s = (*boundary_s, *[0.0] * (len(BOUNDARIES) - len(boundary_s)))
    values = (*span_s, *boundary_s, weight_sync_s)
    out = []
    for lane, scale in zip(_BY_INDEX[asynchronous], SCALES[asynchronous], strict=True):
        total = 0.0
        for part in lane:
            subtotal = 0.0
            for i in part:
                subtotal += values[i]
            total += subtotal
        out.append(total if scale == 1.0 else total * scale)
    return out


def _compiled(
    lanes_: tuple[Lane, ...], scales_: tuple[float, ...]
) -> Callable[[Sequence[float], Sequence[float], float], float]:
    """`max` over the lanes as one Python expression of (spans s, boundaries b, weight sync w), written out
    from the lanes once at import: the planner's screen composes millions of times, and the loops of
    `lane_values` cost 5x as much per call. Same additions in the same order (0.0 + x is x), so the same
    seconds to the last digit; tests/costmodel/test_compose.py checks it against `lane_values`."""
    name = {**{t: f"s[{k}]" for k, t in enumerate(SPANS)}, **{t: f"b[{k}]" for k, t in enumerate(BOUNDARIES)},
            WEIGHT_SYNC: "w"}  # fmt: skip

    def chain(items: Sequence[str]) -> str:
        expr = items[0]
        for item in items[1:]:
            expr = f"({expr} + {item})"
        return expr

    exprs = [chain([chain([name[t] for t in part]) for part in lane]) for lane in lanes_]
    exprs = [e if k == 1.0 else f"({e} * {k!r})" for e, k in zip(exprs, scales_, strict=True)]
    body = exprs[0] if len(exprs) == 1 else f"max({', '.join(exprs)})"
    return eval(compile(f"lambda s, b, w: {body}", "<compose lanes>", "eval"))  # only this module's term names


_ITERATION = {False: _compiled(SYNC_LANES, SCALES[False]), True: _compiled(ASYNC_LANES, SCALES[True])}


def iteration_s(
    span_s: Sequence[float], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> float:
    """Iteration seconds: the slowest lane."""
    if len(boundary_s) < len(BOUNDARIES):
        boundary_s = (*boundary_s, *[0.0] * (len(BOUNDARIES) - len(boundary_s)))
    return _ITERATION[asynchronous](span_s, boundary_s, weight_sync_s)


def compose_iteration(
    phases: Sequence[dict[str, float]], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> float:
    """Iteration seconds from phase times (per group), boundary transfers and the weight sync (no floor)."""
    return iteration_s(spans(phases), boundary_s, weight_sync_s, asynchronous)


def critical_groups(
    phases: Sequence[dict[str, float]], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> list[str | None]:
    """Per phase, the group on the critical path: the slowest group of each phase in the slowest lane (the
    first on ties); None where the phase's span is in no such lane (async: the other lane)."""
    on_path, _ = critical_terms(phases, boundary_s, weight_sync_s, asynchronous)
    return [max(p, key=p.__getitem__) if p and SPANS[k] in on_path else None for k, p in enumerate(phases)]


def critical_terms(
    phases: Sequence[dict[str, float]], boundary_s: Sequence[float], weight_sync_s: float, asynchronous: bool
) -> tuple[set[str], float]:
    """The terms of the slowest lane (the first on ties) and its factor: the critical path is those terms, each
    counted `factor` times (half of each for async's straddling sync), so it sums to the iteration."""
    values = lane_values(spans(phases), boundary_s, weight_sync_s, asynchronous)
    k = values.index(max(values))
    return {term for part in lanes(asynchronous)[k] for term in part}, scales(asynchronous)[k]
