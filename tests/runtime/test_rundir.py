"""Run directory: atomic checkpoints, resumable metrics, the measured-vs-predicted summary."""

from __future__ import annotations

import json
from pathlib import Path

from hetrl_cli.runtime.rundir import RunDir, summarize

from .plans import disaggregated, tiny_workload


def test_checkpoints_appear_only_when_complete_and_old_ones_are_pruned(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.latest_checkpoint() is None
    for step in (5, 10, 15):
        (run.staging(step) / "actor.pt").write_bytes(b"weights")
        run.finalize_checkpoint(step, {"step": step})
    (run.staging(20) / "actor.pt").write_bytes(b"half")  # a run killed while writing step 20
    step, path = run.latest_checkpoint()
    assert (step, path.name) == (15, "step-000015")
    assert sorted(p.name for p in run.checkpoints.glob("step-*")) == ["step-000010", "step-000015"]


def test_metrics_survive_a_torn_line_and_truncate_for_resume(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in (1, 2, 3):
        run.append_metrics({"step": step, "reward_mean": step / 10})
    with open(run.metrics, "a") as fh:
        fh.write('{"step": 4, "rew')
    assert [m["step"] for m in run.read_metrics()] == [1, 2, 3]
    run.truncate_metrics(2)
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [1, 2]


def test_summary_compares_medians_with_the_plan() -> None:
    plan = disaggregated(tiny_workload())
    metrics = [
        {"step": s, "step_s": t, "weight_sync_s": 0.02, "seconds": {"generation": g, "actor_train": 0.05}}
        for s, t, g in [(1, 9.0, 5.0), (2, 0.5, 0.2), (3, 0.4, 0.1), (4, 0.6, 0.3)]
    ]
    summary = summarize(plan, "r1", metrics, "completed", "2026-12-02T00:00:00Z")
    assert summary.steps == 4
    assert summary.iteration.measured_s == 0.5  # the first step is warm-up
    by_task = {t.task: t for t in summary.tasks}
    assert by_task["generation"].measured_s == 0.2
    assert by_task["generation"].error == (0.1 - 0.2) / 0.2
    assert by_task["weight_sync"].predicted_s == 0.01
    assert "reference" not in by_task  # never measured


def _torchrun_report(failures: list[tuple[int, int]], root: tuple[int, int]) -> str:
    """torchrun's ChildFailedError text (torch/distributed/elastic/multiprocessing/errors: the failure template)."""

    def block(idx: int, rank: int, code: int) -> str:
        lines = [f"[{idx}]:", "  time      : 2026-12-05_14:10:02", "  host      : box",
                 f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {4000 + rank})",
                 "  error_file: <N/A>", "  traceback : x"]  # fmt: skip
        return "\n".join(lines)

    others = "\n".join(block(i + 1, r, c) for i, (r, c) in enumerate(failures))
    return (f"====\nrun FAILED\n----\nFailures:\n{others}\n----\nRoot Cause (first observed failure):\n"
            f"{block(0, *root)}\n====")  # fmt: skip


def test_the_reported_failure_is_the_kill_not_the_peers_abort() -> None:
    """SIGKILL of rank 1 aborts rank 0 (gloo, SIGABRT) in the same second: torchrun names rank 0 its root cause
    (the lowest rank among equal second stamps); the launcher names the killed rank. A real root cause stands."""
    from hetrl_cli.runtime.local import torchrun_failure

    assert torchrun_failure(_torchrun_report([(1, -9)], (0, -6))) == (1, -9)
    assert torchrun_failure(_torchrun_report([(1, -6)], (0, -9))) == (0, -9)
    assert torchrun_failure(_torchrun_report([(1, -6)], (0, 1))) == (0, 1)  # an error exit is its own cause
    assert torchrun_failure(_torchrun_report([(1, -6)], (0, -6))) == (0, -6)  # aborts only: torchrun's choice
    assert torchrun_failure("no report") is None
