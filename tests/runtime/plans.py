"""Hand-written plans for the runtime tests: a workload plus, per task, its (device, batch share) replicas."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from hetrl_cli.artifacts.plan import Plan, PlanCost, Replica, SolverStats, TaskCost, TaskGroup, TaskPlan
from hetrl_cli.artifacts.workload import ModelSpec, RLSpec, Workload

Placement = dict[str, list[tuple[str, float]] | list[Replica]]
"""Per task: (device, batch share) pairs (TP = PP = 1), or shaped replicas (see `replica`)."""


def tiny_workload(**overrides) -> Workload:
    """The tiny model on the toy task, sized so a step takes well under a second on one CPU core."""
    fields = {
        "name": "tiny-test",
        "algorithm": "grpo",
        "actor": ModelSpec(arch="tiny"),
        "prompts_per_step": 4,
        "responses_per_prompt": 4,
        "max_prompt_tokens": 32,
        "max_response_tokens": 12,
        "micro_batch": 16,
        "precision": "fp32",
        "dataset": {"kind": "toy"},
        "reward_rule": "toy",
        "rl": RLSpec(lr=3e-3, critic_lr=3e-3, kl_coef=0.001),
    }
    fields.update(overrides)
    if fields["algorithm"] == "ppo" and "critic" not in overrides:
        fields["critic"] = ModelSpec(arch="tiny")
    return Workload(**fields)


def replica(stages: list[list[str]], share: float = 1.0, split: list[int] | None = None) -> Replica:
    """One shaped replica: `stages[p]` is the TP group of stage p; `split` layers per stage (default 2 / stage)."""
    return Replica(stages=stages, batch_share=share, layer_split=split or [2 // len(stages) or 1] * len(stages))


def _replicas(entries: list[tuple[str, float]] | list[Replica]) -> list[Replica]:
    return [e if isinstance(e, Replica) else replica([[e[0]]], e[1]) for e in entries]


def hand_plan(workload: Workload, placement: Placement, name: str = "hand") -> Plan:
    """A Plan that places each task on the given devices; tasks on the same device set share a group."""
    shaped = {task: _replicas(entries) for task, entries in placement.items()}
    groups: dict[tuple[str, ...], list[str]] = {}
    for task, replicas in shaped.items():
        groups.setdefault(tuple(sorted({d for r in replicas for d in r.devices})), []).append(task)
    group_name = {devices: f"g{i}" for i, devices in enumerate(groups)}
    tasks = []
    for task, replicas in shaped.items():
        devices = tuple(sorted({d for r in replicas for d in r.devices}))
        tasks.append(
            TaskPlan(
                task=task,
                group=group_name[devices],
                tp=len(replicas[0].stages[0]),
                pp=len(replicas[0].stages),
                dp=len(replicas),
                replicas=replicas,
                predicted=TaskCost(compute_s=0.1, total_s=0.1),
            )
        )
    return Plan(
        name=name,
        created_at="2026-12-02T00:00:00Z",
        profile_name="localhost-2cpu",
        profile_fingerprint="sha256:test",
        workload=workload,
        groups=[TaskGroup(name=group_name[d], tasks=t, devices=list(d)) for d, t in groups.items()],
        tasks=tasks,
        cost=PlanCost(iteration_s=1.0, samples_per_s=16.0, tokens_per_s=192.0, weight_sync_s=0.01),
        solver=SolverStats(solver="manual", status="heuristic"),
    )


def on(device: str, tasks, share: float = 1.0) -> Placement:
    return {t: [(device, share)] for t in tasks}


GRPO_TASKS = ("generation", "reference", "reward", "actor_train")
PPO_TASKS = ("generation", "reference", "reward", "critic_inference", "actor_train", "critic_train")
D0, D1 = "localhost/0", "localhost/1"


def colocated(workload: Workload, d0: str = D0, d1: str = D1) -> Plan:
    """Every task on both devices, uneven shares (0.25 / 0.75)."""
    return hand_plan(workload, {t: [(d0, 0.25), (d1, 0.75)] for t in workload.tasks}, name="colocated")


def disaggregated(workload: Workload, d0: str = D0, d1: str = D1) -> Plan:
    """Generation alone on device d0, everything else on device d1 (pass devices of two hosts for multi-host)."""
    placement = on(d0, ["generation"]) | on(d1, [t for t in workload.tasks if t != "generation"])
    return hand_plan(workload, placement, name="disaggregated")


def interrupt_after_first_step(argv: list[str], run_dir: Path, deadline_s: float, cwd: Path | None = None):
    """Start `hetrl run` (argv), press Ctrl-C once its first step is logged; -> (exit code, stderr)."""
    from interrupt import default_sigint

    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    try:
        deadline = time.monotonic() + deadline_s
        while not (run_dir / "metrics.jsonl").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not get to step 1"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stderr


def run_processes(run_dir: Path) -> list[int]:
    """Pids of any process whose command line names this run directory (workers, launcher)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmdline:
            found.append(int(proc.name))
    return found


def two_host_plan(sshd_hosts, workload: Workload, folder: Path) -> tuple[str, str]:
    """hosts.txt for the first two sshd hosts and plan.json of `workload` disaggregated over them, in `folder`;
    -> the two devices (generation's, the rest's)."""
    from hetrl_cli.artifacts.io import save_artifact

    a, b = sshd_hosts.addresses[:2]
    (folder / "hosts.txt").write_text(sshd_hosts.hosts_line(a) + sshd_hosts.hosts_line(b))
    d0, d1 = f"{a}:{sshd_hosts.port}/0", f"{b}:{sshd_hosts.port}/0"
    save_artifact(disaggregated(workload, d0, d1), folder / "plan.json")
    return d0, d1


def run_two_hosts(sshd_hosts, folder: Path) -> subprocess.CompletedProcess[str]:
    """`hetrl run` of `folder`'s two_host_plan (hf engine, run dir `run`), to the end."""
    import sys

    hetrl = str(Path(sys.executable).with_name("hetrl"))
    argv = [hetrl, "run", "plan.json", "--hosts", "hosts.txt", "--known-hosts", str(sshd_hosts.known_hosts),
            "--engine", "hf", "--run-dir", "run"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, cwd=folder, timeout=120)
