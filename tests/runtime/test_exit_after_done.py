"""A worker that dies at exit after every rank finished (gloo's teardown abort, SIGABRT) must not turn a
completed run into a failed one: the full suite saw
test_multihost's uneven run write both steps and every rank's `done` marker, then fail on rank 2's SIGABRT. The
abort's cause (Python's teardown ending a gloo thread that frees a tensor) is removed by comm.exit_process, which
the worker ends with; finished_everywhere stays as a second guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchload import bench_module
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


def test_exit_process_does_what_a_normal_exit_does_for_the_program(tmp_path: Path) -> None:
    """comm.exit_process skips only Python's teardown: non-daemon threads are joined, atexit handlers run (vLLM's
    engine shutdown is one), buffered output is flushed, and the process exits with the code."""
    script = f"""
import atexit, pathlib, threading, time
from hetrl_cli.runtime import comm
out = pathlib.Path({str(tmp_path)!r})
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("joined")
threading.Thread(target=late).start()
print("buffered, no newline", end="")
comm.exit_process(3)
print("never")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "buffered, no newline"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "joined"


@pytest.fixture(scope="module")
def exit_race():
    with bench_module("gloo_exit_race") as module:
        yield module


@pytest.mark.slow
def test_ranks_that_finished_exit_cleanly_through_exit_process(exit_race) -> None:
    """bench/gloo_exit_race.py: 3 gloo ranks end as a worker does (groups alive in a reference cycle, the closing
    barrier and teardown, `done`) with gloo threads still freeing Python-owned tensors. Exiting with sys.exit
    (the worker before comm.exit_process) a rank died of SIGABRT after every `done` in 13 of 16 runs on the
    shared 2-core box, through comm.exit_process in 0 of 16 (docs/run.md). Here none of 4 may."""
    summary = exit_race.race(runs=4, exit_how="controlled", inflight=200)
    assert summary["aborted"] == 0 and summary["clean"] == 4, summary["results"]


def test_a_killed_rank_is_named_over_the_peer_that_exited_with_an_error() -> None:
    """A rank whose peer was killed (SIGKILL) fails its collective and exits 1 (through comm.exit_process; before,
    its exit aborted), in the same second torchrun names the lower rank: the launcher names the killed rank. A
    peer's SIGTERM is torchrun stopping the rest after a real error, which stands."""
    from hetrl_cli.runtime.local import torchrun_failure

    from .test_rundir import _torchrun_report

    assert torchrun_failure(_torchrun_report([(1, -9)], (0, 1))) == (1, -9)
    logged = "E1205 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 22414) of binary: python\n"
    assert torchrun_failure(logged + _torchrun_report([(1, -9)], (0, 1))) == (1, -9)  # torchrun's log line first
    assert torchrun_failure(_torchrun_report([(1, -15)], (0, 1))) == (0, 1)
    assert torchrun_failure(_torchrun_report([(1, -6), (2, -15)], (0, 1))) == (0, 1)
