"""`hetrl run --hosts` across two hosts behind a real sshd (127.0.0.2 and 127.0.0.3, both loopback here, sharing
this machine's disk): preflight over SSH, one accelerate launch per host, real gloo across the two launches.

Each run costs ~15-20 s on 2 cores (two accelerate launches, imports, the tiny model), so steps are few.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact

from .plans import colocated, disaggregated, hand_plan, interrupt_after_first_step, on, tiny_workload

pytestmark = pytest.mark.slow
HETRL = str(Path(sys.executable).with_name("hetrl"))


def pgrep(run_dir: Path) -> list[str]:
    """Processes whose command line names the run directory (launchers, workers), as `pgrep -af` lists them."""
    done = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True, timeout=10)
    return [line for line in done.stdout.splitlines() if line.split()[0] != str(os.getpid())]


@pytest.fixture
def two_hosts(sshd_hosts, tmp_path: Path):
    """(hosts.txt, known_hosts, device of host .2, device of host .3)."""
    a, b = sshd_hosts.addresses[:2]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(sshd_hosts.hosts_line(a) + sshd_hosts.hosts_line(b))
    return hosts, sshd_hosts.known_hosts, f"{a}:{sshd_hosts.port}/0", f"{b}:{sshd_hosts.port}/0"


def run_args(plan_file: Path, hosts: Path, known: Path, run_dir: Path, *extra: str) -> list[str]:
    return [HETRL, "run", str(plan_file), "--hosts", str(hosts), "--known-hosts", str(known), "--engine", "hf",
            "--run-dir", str(run_dir), *extra]  # fmt: skip


@pytest.mark.parametrize("layout", ["disaggregated", "colocated"])
def test_grpo_across_two_hosts(two_hosts, tmp_path: Path, layout: str) -> None:
    """Disaggregated: generation on .2, everything else on .3. Colocated: every task DP over both (0.25/0.75)."""
    hosts, known, d0, d1 = two_hosts
    build = disaggregated if layout == "disaggregated" else colocated
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(build(tiny_workload(), d0, d1), plan_file)
    started = time.monotonic()
    result = subprocess.run(run_args(plan_file, hosts, known, run_dir, "--steps", "2", "--verify-weights"),
                            capture_output=True, text=True, timeout=150, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"{layout}: {time.monotonic() - started:.1f}s")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["response_tokens"] > 0 and 0.0 <= m["reward_mean"] <= 1.0 for m in lines)
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in lines)  # weight sync crossed hosts
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["devices"] == [d0, d1]
    host_a, host_b = d0.rsplit("/", 1)[0], d1.rsplit("/", 1)[0]
    assert f"[{host_a}] [rank 0] step 2/2 reward" in result.stderr
    assert f"2 worker(s) on 2 hosts ({host_a} x1, {host_b} x1)" in result.stderr
    assert pgrep(run_dir) == []


def test_uneven_device_counts_run_through_torchrun(two_hosts, tmp_path: Path) -> None:
    """1 device on .2 (generation), 2 on .3 (training DP 0.5/0.5): accelerate cannot launch uneven counts per host,
    so those hosts run torchrun directly; ranks still follow the manifest."""
    hosts, known, d0, d1 = two_hosts
    d2 = d1[:-1] + "1"
    placement = on(d0, ["generation"]) | {t: [(d1, 0.5), (d2, 0.5)] for t in ("reference", "reward", "actor_train")}
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(hand_plan(tiny_workload(), placement, name="uneven"), plan_file)
    result = subprocess.run(run_args(plan_file, hosts, known, run_dir, "--steps", "2"), capture_output=True,
                            text=True, timeout=150, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads((run_dir / "launch.json").read_text())["devices"] == [d0, d1, d2]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert pgrep(run_dir) == []


def test_preflight_names_the_host_without_hetrl(sshd_hosts, two_hosts, tmp_path: Path) -> None:
    hosts, known, d0, d1 = two_hosts
    good, bad = hosts.read_text().splitlines()
    hosts.write_text(good + "\n" + bad.replace(f"python={sshd_hosts.python}", "python=/usr/bin/python3") + "\n")
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(disaggregated(tiny_workload(), d0, d1), plan_file)
    result = subprocess.run(run_args(plan_file, hosts, known, run_dir, "--steps", "2"), capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr
    host_b = d1.rsplit("/", 1)[0]
    assert "preflight failed on 1 of 2 hosts; nothing launched" in result.stderr
    assert f"{host_b}: hetrl is not installed for /usr/bin/python3" in result.stderr
    assert f"{d0.rsplit('/', 1)[0]}:" not in result.stderr.split("nothing launched", 1)[1]
    assert not run_dir.exists()
    assert pgrep(run_dir) == []


def test_plan_host_missing_from_hosts_file(two_hosts, tmp_path: Path) -> None:
    hosts, known, d0, d1 = two_hosts
    hosts.write_text(hosts.read_text().splitlines()[0] + "\n")
    plan_file = tmp_path / "plan.json"
    save_artifact(disaggregated(tiny_workload(), d0, d1), plan_file)
    result = subprocess.run(run_args(plan_file, hosts, known, tmp_path / "run"), capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 2
    assert f"uses host(s) {d1.rsplit('/', 1)[0]} not listed in {hosts}" in result.stderr


def test_killed_worker_stops_every_host(two_hosts, tmp_path: Path) -> None:
    hosts, known, d0, d1 = two_hosts
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(disaggregated(tiny_workload(), d0, d1), plan_file)
    proc = subprocess.Popen(run_args(plan_file, hosts, known, run_dir, "--steps", "1000"), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not get to step 2"
            time.sleep(0.2)
        killed_at = time.monotonic()
        os.kill(int((run_dir / "logs" / "rank-1.pid").read_text()), signal.SIGKILL)  # the trainer, on host .3
        _, stderr = proc.communicate(timeout=30)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"killed worker -> launcher exit in {elapsed:.1f}s")
    assert elapsed < 30
    assert proc.returncode == 1, stderr[-3000:]
    host_b = d1.rsplit("/", 1)[0]
    assert stderr.splitlines()[-1].startswith(
        f"hetrl: error: run run: host {host_b}: rank 1 (device {d1}) killed by signal 9"
    ), stderr[-3000:]
    assert f"last lines from {host_b}:" in stderr
    assert pgrep(run_dir) == []
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def sshd_sessions(address: str, port: int) -> set[int]:
    """Pids of the sshd processes serving connections to address:port (what a dropped link takes away)."""
    listing = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                             text=True, timeout=10, check=True).stdout  # fmt: skip
    return {int(pid) for line in listing.splitlines() if f"{address}:{port} " in line
            for pid in re.findall(r"pid=(\d+)", line)}  # fmt: skip


def test_dropped_host_stops_every_host(sshd_hosts, two_hosts, tmp_path: Path) -> None:
    """The SSH connection to host .3 dies mid-run (its sshd session killed): the launcher names the dropped host,
    reconnects to stop what is left there, and no process of the run survives on either host."""
    hosts, known, d0, d1 = two_hosts
    host_b = d1.rsplit("/", 1)[0]
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(disaggregated(tiny_workload(), d0, d1), plan_file)
    proc = subprocess.Popen(run_args(plan_file, hosts, known, run_dir, "--steps", "1000"), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        metrics = run_dir / "metrics.jsonl"
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not get to step 2"
            time.sleep(0.2)
        sessions = sshd_sessions(sshd_hosts.addresses[1], sshd_hosts.port)
        assert sessions, "no SSH connection to the second host found"
        dropped_at = time.monotonic()
        for pid in sessions:
            os.kill(pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
        elapsed = time.monotonic() - dropped_at
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"dropped host -> launcher exit in {elapsed:.1f}s")
    assert elapsed < 30
    assert proc.returncode == 1, stderr[-3000:]
    assert stderr.splitlines()[-1].endswith(f"host {host_b}: its launch dropped: the SSH connection was lost")
    assert pgrep(run_dir) == []
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_ctrl_c_stops_every_host(two_hosts, tmp_path: Path) -> None:
    hosts, known, d0, d1 = two_hosts
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(colocated(tiny_workload(), d0, d1), plan_file)
    returncode, stderr = interrupt_after_first_step(
        run_args(plan_file, hosts, known, run_dir, "--steps", "1000"), run_dir, 120, cwd=tmp_path
    )
    assert returncode == 130, stderr[-3000:]
    assert stderr.splitlines()[-1] == "hetrl: error: run run: interrupted (Ctrl-C); every worker stopped on every host"
    assert pgrep(run_dir) == []
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
