"""Async mode's weight sync overlapped with generation (runtime/weightsync.py): the trainer sends step k's weights
right after its update, the generation rank receives them on a thread while it samples step k+1 with the weights
of step k-1, and loads them only between rollouts, so the staleness stays exactly one step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact

from .plans import disaggregated, tiny_workload

pytestmark = pytest.mark.slow


def _lines(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "logs" / f"rank-{rank}.events").read_text().splitlines()]


def _last(events: list[str], what: str) -> int:
    return len(events) - 1 - events[::-1].index(what)


def test_async_generation_receives_the_next_weights_while_it_samples(hetrl, tmp_path: Path) -> None:
    steps = 4
    plan = disaggregated(tiny_workload(mode="async", max_response_tokens=96))  # sampling outlasts training
    save_artifact(plan, tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = hetrl("run", tmp_path / "plan.json", "--steps", str(steps), "--run-dir", run_dir, "--engine", "hf",
                   "--verify-weights", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the engines hold the weights the leader says they hold, at every report: the load waits for the rollout
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in metrics)
    assert len({m["actor_checksum"] for m in metrics}) == steps  # and they changed every step
    lines = _lines(run_dir, 0)  # rank 0 runs generation alone
    # one step stale, exactly: step s's rollout is sampled with the weights of step s-2's update (version 0 is
    # the start's, for steps 1 and 2)
    rollouts = [tuple(r) for line in lines for r in line["rollouts"]]
    assert rollouts == [(1, 0), (2, 0), (3, 1), (4, 2)]
    for line in lines:
        events = line["events"]
        if line["step"] < steps:  # the receive of this step's weights is posted before this step's rollout...
            assert events.index("receive") < _last(events, "generate"), events
        if 1 < line["step"] < steps:  # ...and the last step's weights are loaded before it, never during one
            assert events.index("load_weights") < events.index("generation"), events
        if line["step"] > 1:
            assert events.count("load_weights") == 1, events
    received = [e for line in lines for e in line["events"] if e == "received"]
    assert len(received) == steps - 1  # every step but the last sent its weights, on the thread
    # the overlap itself: the weights arrived while the rank still sampled (before its rollout exchange); on the
    # code before, the receive began only after the exchange and held the next rollout back
    overlapped = [
        line["step"]
        for line in lines[:-1]
        if _last(line["events"], "received") < _last(line["events"], "rollout_transfer")
    ]
    assert overlapped, [line["events"] for line in lines]
