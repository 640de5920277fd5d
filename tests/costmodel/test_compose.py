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
