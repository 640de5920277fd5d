"""The one composition formula: the compiled iteration equals the lanes' definition to the last digit."""

from __future__ import annotations

import random

import pytest

from hetrl_cli.costmodel import compose


@pytest.mark.parametrize("asynchronous", [False, True])
def test_compiled_iteration_is_the_lanes_sum_exactly(asynchronous: bool) -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        spans = [rng.random() * rng.choice([1e-3, 1.0, 300.0]) for _ in range(3)]
        boundary = [rng.random() * rng.choice([0.0, 1e-2, 5.0]) for _ in range(2)]
        sync = rng.random() * rng.choice([0.0, 1.0])
        lanes = compose.lane_values(spans, boundary, sync, asynchronous)
        assert compose.iteration_s(spans, boundary, sync, asynchronous) == max(lanes)


def test_sync_is_every_term_in_order_and_async_the_slower_lane() -> None:
    s, b, w = (1.0, 2.0, 3.0), (0.25, 0.5), 0.125
    assert compose.iteration_s(s, b, w, False) == ((1.0 + 2.0) + 3.0) + (0.25 + 0.5) + 0.125
    assert compose.iteration_s(s, b, w, True) == max(1.0 + 0.125, ((0.25 + 2.0) + 0.5) + 3.0)
    assert compose.iteration_s(s, (0.25,), w, False) == compose.iteration_s(s, (0.25, 0.0), w, False)


def _runtime_period(generation: float, training: float, sync: float, steps: int = 400) -> float:
    """The steady-state seconds a step of async mode as runtime/weightsync.py runs it, event by event: step k's
    update ends `training` after the step began; its weights go on the wire then (once the last step's sends are
    drained: one sync at a time) and arrive `sync` later; generation samples step k+1 with the weights of step
    k-1, so it waits for the last step's sync before it starts; the rollout exchange ends the step."""
    began, arrived = 0.0, 0.0  # the weights of the step before the first are there
    starts = []
    for _ in range(steps):
        starts.append(began)
        sampled = max(began, arrived) + generation
        sent = max(began + training, arrived)  # the trainer drains the last step's sends before it sends
        arrived = sent + sync
        began = max(sent, sampled)
    return (starts[-1] - starts[-201]) / 200  # an even count: the steps may alternate long, short (G = R = W)


def test_async_iteration_is_the_runtimes_steady_state() -> None:
    """By hand: G = 4, R = 0.5 + 1.5 + 0.5 + 1.5 = 4, W = 4. The sync of step k starts when its update ends
    (R into the step) and the rollout of step k+2 waits for it: with period P the rollout starts R + W - P into
    its step, so P = R + W - P + G, P = (G + W + R) / 2 = 6 (it was G + W = 8 when the receive came first)."""
    s, b, w = (4.0, 1.5, 1.5), (0.5, 0.5), 4.0
    assert compose.iteration_s(s, b, w, True) == 6.0 == _runtime_period(4.0, 4.0, 4.0)
    assert compose.lane_values(s, b, w, True) == [4.0, 4.0, 6.0, 4.0]
    # training long enough to hide the sync (R >= G + W): the old and the new figure agree
    assert compose.iteration_s((1.0, 3.0, 3.0), (0.0, 0.0), 2.0, True) == 6.0 == max(1.0 + 2.0, 6.0)
    # a sync longer than both lanes together: one at a time, so it sets the pace
    assert compose.iteration_s((1.0, 1.0, 1.0), (0.0, 0.0), 9.0, True) == 9.0 == _runtime_period(1.0, 2.0, 9.0)
    rng = random.Random(3)
    for _ in range(300):
        g, r, sync = (rng.choice([0.1, 1.0, 5.0]) * rng.random() for _ in range(3))
        assert compose.iteration_s((g, r, 0.0), (0.0, 0.0), sync, True) == pytest.approx(
            _runtime_period(g, r, sync), rel=1e-6
        )
        assert compose.iteration_s((g, r, 0.0), (0.0, 0.0), sync, True) <= max(g + sync, r)  # never the old's more
