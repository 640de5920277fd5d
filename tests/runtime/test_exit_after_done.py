"""A worker that dies at exit after every rank finished (gloo's teardown abort: a rank still closing its groups
when its peer has exited gets SIGABRT) must not turn a completed run into a failed one: the full suite saw
test_multihost's uneven run write both steps and every rank's `done` marker, then fail on rank 2's SIGABRT."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetrl_cli.errors import HetrlError
from hetrl_cli.runtime.api import RunOptions, _launch_and_summarize, finished_everywhere
from hetrl_cli.runtime.rundir import LaunchManifest, RunDir

from .plans import D0, D1, GRPO_TASKS, hand_plan, on, tiny_workload


def _run_dir(tmp_path: Path, world: int) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.logs.mkdir(parents=True)
    devices = [D0, D1][:world]
    manifest = LaunchManifest(run_id="run", devices=devices, steps=1, checkpoint_every=0, engine="hf",
                              collective_timeout_s=60.0)  # fmt: skip
    run.manifest.write_text(manifest.model_dump_json())
    return run


def _launch_that_dies_at_exit(run: RunDir, done: list[int]):
    def launch(echo) -> None:
        for rank in done:
            run.log(rank, "done").write_text("2026-12-05T00:00:00Z\n")
        raise HetrlError("rank 1 killed by signal 6 (SIGABRT)")

    return launch


def test_a_death_after_every_rank_is_done_completes(tmp_path: Path) -> None:
    run, lines = _run_dir(tmp_path, 2), []
    plan = hand_plan(tiny_workload(), on(D0, GRPO_TASKS))
    summary = _launch_and_summarize(plan, run, _launch_that_dies_at_exit(run, [0, 1]), "stopped",
                                    RunOptions(echo=lines.append))  # fmt: skip
    assert summary.status == "completed" and summary.error is None
    assert len(lines) == 1 and "every rank finished its steps" in lines[0] and "SIGABRT" in lines[0]


@pytest.mark.parametrize("done, error", [([0], False), ([0, 1], True)])
def test_a_rank_not_done_or_with_an_error_still_fails(tmp_path: Path, done: list[int], error: bool) -> None:
    run = _run_dir(tmp_path, 2)
    if error:
        run.log(1, "error").write_text("Traceback ...\n")
    plan = hand_plan(tiny_workload(), on(D0, GRPO_TASKS))
    with pytest.raises(HetrlError, match="SIGABRT"):
        _launch_and_summarize(plan, run, _launch_that_dies_at_exit(run, done), "stopped", RunOptions(echo=print))
    assert not finished_everywhere(run)
    assert '"status": "failed"' in run.summary.read_text().replace('":"', '": "')
