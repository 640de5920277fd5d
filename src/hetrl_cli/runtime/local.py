"""Launch the workers of a single-host plan: `accelerate launch` as a subprocess, watched until it ends.

The command is an argument list (nothing from a plan reaches a shell). Output streams back line by line
(workers prefix their own lines with `[rank N]`). On a worker failure, the launcher's timeout or Ctrl-C, every
process of the run is stopped: the accelerate process group first (torchrun then stops its workers), then
any worker still alive by the pid it wrote to logs/rank-N.pid (torchrun starts each worker in its own session,
so a process-group kill of the launcher alone would miss them). Workers also die with their parent
(PR_SET_PDEATHSIG), a last line of defence when the launcher itself is killed.

Everything the run opens listens on loopback (the rendezvous store through runtime/storebind, gloo through
GLOO_SOCKET_IFNAME=lo), and the workers start with umask 077: the run's files are the user's alone.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hetrl_cli.errors import HetrlError
from hetrl_cli.runtime.rundir import PRIVATE_UMASK, RunDir

STOP_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping a run."""
FAILURE_GRACE_S = 10.0
"""After a rank reports an error, how long torchrun gets to tear the others down before we do."""
TAIL_LINES = 15


def free_port() -> int:
    """A TCP port free on loopback right now (the rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


LOOPBACK = "127.0.0.1"
"""Where a one-host run listens: its rendezvous store, and gloo through GLOO_SOCKET_IFNAME=lo."""


def worker_command(python: str, nproc: int, port: int, run_dir: Path) -> list[str]:
    """The launch command: accelerate's CPU multi-process recipe (PLATFORM.md), or the bare worker for one rank;
    either under runtime/storebind, so the rendezvous store it starts listens on loopback only."""
    bound = [python, "-m", "hetrl_cli.runtime.storebind", LOOPBACK]
    worker = ["hetrl_cli.runtime.worker", "--run-dir", str(run_dir)]
    if nproc == 1:
        return [*bound, *worker]
    return [
        *bound, "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", str(nproc), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(port), "--monitor_interval", "0.2",
        "-m", *worker,
    ]  # fmt: skip


def worker_env(nproc: int, port: int, interface: str = "lo") -> dict[str, str]:
    """Environment of the launch: CPU mode for accelerate, gloo on loopback, unbuffered output."""
    env = dict(os.environ)
    env.update(
        ACCELERATE_USE_CPU="true",
        GLOO_SOCKET_IFNAME=interface,
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if nproc == 1:  # no torchrun: the worker reads the rendezvous variables itself
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))  # fmt: skip
    return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_run_worker(pid: int, run: RunDir) -> bool:
    """Whether `pid` is still a worker of this run (pids get reused: check its command line)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "hetrl_cli.runtime.worker" in cmdline and str(run.root) in cmdline


def worker_pids(run: RunDir) -> list[int]:
    """Pids of this run's workers that are still alive."""
    pids = []
    for path in sorted(run.logs.glob("rank-*.pid")):
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        if _alive(pid) and _is_run_worker(pid, run):
            pids.append(pid)
    return pids


def stop_run(proc: subprocess.Popen, run: RunDir) -> None:
    """SIGTERM the launch's process group, SIGKILL what is left after the grace period, then the workers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [proc.pid, *worker_pids(run)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and (proc.poll() is None or worker_pids(run)):
            time.sleep(0.1)
        if proc.poll() is not None and not worker_pids(run):
            return


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def torchrun_failure(output: str) -> tuple[int, int] | None:
    """(rank, exit code) of the failure that caused the others in torchrun's report: its root cause, unless that
    is an abort (SIGABRT: what gloo did at exit to a rank whose peer vanished) and another rank was killed by
    another signal (SIGKILL from outside, the OOM killer), or an error exit (a rank whose collective failed when
    its peer vanished; since comm.exit_process it exits 1 instead of aborting) and another rank was killed by a
    signal other than torchrun's own SIGTERM to the rest. torchrun stamps a signalled rank with the second it
    noticed it and names the lowest rank among equal stamps, so a peer's exit in the same second hid the cause."""
    root = _ROOT_CAUSE.search(output)
    if root is None:
        return None
    rank, code = int(root.group(1)), int(root.group(2))
    if code == -signal.SIGABRT or code > 0:
        passed = (-signal.SIGABRT,) if code < 0 else (-signal.SIGABRT, -signal.SIGTERM)
        report = output[output.rfind("Failures:") :]  # not torchrun's log lines ("exitcode: 1) local_rank: 0")
        for failure in _FAILURE.finditer(report):
            other = int(failure.group(2))
            if other < 0 and other not in passed:
                return int(failure.group(1)), other
    return rank, code


def exit_how(code: int) -> str:
    """How a worker ended, for the one-line failure message: subprocess and torchrun report death by a signal as
    the negative signal number, which reads as a signal, not as an exit code."""
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def failing_rank(output: str, run: RunDir) -> tuple[int | None, str]:
    """(rank, how) of the first failure: torchrun's root cause (`torchrun_failure`), else the earliest rank error
    file."""
    failure = torchrun_failure(output)
    if failure:
        return failure[0], exit_how(failure[1])
    errors = sorted(run.logs.glob("rank-*.error"), key=lambda p: p.stat().st_mtime)
    if errors:
        return int(errors[0].name.split("-")[1].split(".")[0]), "raised an error"
    return None, "unknown"


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]


def launch_local(
    run: RunDir, nproc: int, python: str, timeout_s: float, echo: Callable[[str], None], devices: list[str]
) -> None:
    """Run the workers to completion; raise HetrlError naming the failing rank (and its device) otherwise."""
    port = free_port()
    proc = subprocess.Popen(
        worker_command(python, nproc, port, run.root),
        env=worker_env(nproc, port),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        umask=PRIVATE_UMASK,  # the run's files are the user's alone, whatever the caller's umask
        text=True,
        bufsize=1,
    )
    output: collections.deque[str] = collections.deque(maxlen=400)
    reader = threading.Thread(target=_pump, args=(proc, output, echo), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    failed_at: float | None = None
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if now > deadline:
                stop_run(proc, run)
                raise HetrlError(f"run {run.root.name}: timed out after {timeout_s:.0f} s (--timeout); workers stopped")
            if failed_at is None and any(run.logs.glob("rank-*.error")):
                failed_at = now
            if failed_at is not None and now - failed_at > FAILURE_GRACE_S:
                stop_run(proc, run)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        stop_run(proc, run)
        raise
    finally:
        reader.join(timeout=5)
        if worker_pids(run):
            stop_run(proc, run)
    if proc.returncode == 0 and not any(run.logs.glob("rank-*.error")):
        return
    rank, how = failing_rank("\n".join(output), run)
    if rank is None:
        raise HetrlError(f"run {run.root.name}: workers failed (exit code {proc.returncode}); see {run.logs}")
    lines = tail(run.log(rank, "log"))
    echo(f"last lines of rank {rank}:" if lines else f"rank {rank} printed nothing before it ended")
    for line in lines:
        echo(f"  | {line}")
    device = devices[rank] if rank < len(devices) else "?"
    cause = worker_cause(run, rank)
    raise HetrlError(
        f"run {run.root.name}: rank {rank} (device {device}) {how}{cause}; full log {run.log(rank, 'log')}"
    )


def worker_cause(run: RunDir, rank: int) -> str:
    """': <cause>' when the rank's error file holds one line (a failure the worker named, such as a checkpoint
    that could not be written), else '' (a traceback: its last lines are printed above)."""
    try:
        lines = run.log(rank, "error").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return f": {lines[0][:500]}" if len(lines) == 1 and not lines[0].startswith("Traceback") else ""


def _pump(proc: subprocess.Popen, output: collections.deque[str], echo: Callable[[str], None]) -> None:
    assert proc.stdout is not None
    quiet = AgentReport(echo)
    for line in proc.stdout:
        line = line.rstrip("\n")
        output.append(line)
        quiet.line(line)
    quiet.flush()


class AgentReport:
    """Passes the launch's lines on, except torchrun's own report of a failed worker (its ChildFailedError
    traceback and summary): the launcher names the failing rank, its cause and last lines itself, and keeps
    the report for `failing_rank`. Any other traceback of the agent is passed on whole."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self.held: list[str] = []
        self.dropping = self.root_cause = False

    def line(self, line: str) -> None:
        if self.dropping:  # to the rule that closes the summary, after its root cause
            if line.startswith("Root Cause"):
                self.root_cause = True
            elif line.startswith("=====") and self.root_cause:
                self.dropping = self.root_cause = False
            return
        if self.held or line.startswith("Traceback (most recent call last):"):
            self.held.append(line)
            if "ChildFailedError" in line:
                self.held, self.dropping = [], True
            elif line.startswith("[rank "):  # a worker's line: this was not the agent's report
                self.flush()
            return
        self.echo(line)

    def flush(self) -> None:
        for held in self.held:
            self.echo(held)
        self.held = []
