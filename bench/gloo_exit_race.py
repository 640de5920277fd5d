"""Reproducer of the gloo exit abort: how often a rank that finished dies of SIGABRT at process exit.

Each run starts 3 CPU ranks (gloo, env:// against a store this process hosts, as torchrun's agent does) that
do what a worker does at the end of a run: collectives on the world and on subgroups (comm.make_groups), the
per-step report (comm.gather_to_zero), the closing barrier and group teardown (comm.leave_world), the `done`
marker, and then the exit:
- `--exit sys`: `sys.exit` and Python's interpreter teardown (the worker's exit before comm.exit_process);
- `--exit controlled`: `comm.exit_process` (threads joined, atexit handlers, streams flushed, os._exit).
Before the barrier each rank also starts `--inflight` small all-reduces and drops their tensors and handles at
once, as a finished collective's tensors are dropped while a gloo thread still holds its work: each such work
leaves a gloo thread a Python-owned tensor to free, which widens the window that a worker hits rarely.

    .venv/bin/python bench/gloo_exit_race.py --runs 20 --exit sys        # N runs, how many had a SIGABRT
    .venv/bin/python bench/gloo_exit_race.py --runs 20 --exit controlled
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORLD = 3
GROUPS = {"rest": [1, 2], "dp:actor_train:0": [1, 2], "sync:actor": [0, 1], "mp:x": [0, 2]}
"""Subgroups like an uneven plan's (generation on rank 0, training DP over ranks 1 and 2)."""
SPARE = 3
"""Every-rank groups the `--inflight` all-reduces go round (the world's barrier does not wait for their work)."""


@dataclass
class RunResult:
    returncodes: list[int]
    done: list[bool]
    seconds: float

    @property
    def aborted(self) -> bool:
        return -signal.SIGABRT in self.returncodes


def rank_body(exit_how: str, inflight: int, out: Path) -> None:
    """One rank: the worker's end of a run, then its exit."""
    import faulthandler

    import torch
    import torch.distributed as dist

    from hetrl_cli.runtime import comm

    faulthandler.enable()
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    comm.init_world("gloo", 60.0)
    groups = comm.make_groups(GROUPS | {f"spare:{i}": list(range(WORLD)) for i in range(SPARE)}, 60.0)
    cycle: dict = {"groups": groups}
    cycle["self"] = cycle  # the Worker holds its groups in reference cycles: they live into Python's teardown
    for _ in range(2):  # two steps: rollouts all-gathered, gradients all-reduced, reports gathered
        parts = [torch.empty(256) for _ in range(WORLD)]
        dist.all_gather(parts, torch.full((256,), float(rank)))
        if groups.has("dp:actor_train:0", rank):
            dist.all_reduce(torch.ones(4096), group=groups.get("dp:actor_train:0"))
        comm.gather_to_zero({"rank": rank})
    for i in range(inflight):  # each spare group has gloo threads of its own; the barrier waits for none of them
        dist.all_reduce(torch.ones(64), group=groups.get(f"spare:{i % SPARE}"), async_op=True)  # nothing kept
    comm.leave_world()
    (out / f"rank-{rank}.done").write_text("done\n")
    if exit_how == "controlled":
        comm.exit_process(0)
    sys.exit(0)


def one_run(exit_how: str, inflight: int, timeout_s: float = 120.0) -> RunResult:
    """3 ranks once; their return codes (negative: killed by that signal) and which wrote `done`."""
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, WORLD + 1, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="gloo-exit-") as tmp:
        out = Path(tmp)
        started = time.perf_counter()
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                       GLOO_SOCKET_IFNAME="lo")  # fmt: skip
            argv = [sys.executable, __file__, "--rank-body", exit_how, str(inflight), str(out)]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        codes = []
        for proc in procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            codes.append(proc.returncode)
        for proc in procs:
            if proc.stderr is not None:
                proc.stderr.close()
        done = [(out / f"rank-{r}.done").exists() for r in range(WORLD)]
    del store
    return RunResult(codes, done, time.perf_counter() - started)


def race(runs: int, exit_how: str, inflight: int) -> dict:
    """`runs` runs; how many had a rank die of SIGABRT, and how many of those after every rank wrote `done`."""
    results = [one_run(exit_how, inflight) for _ in range(runs)]
    aborted = [r for r in results if r.aborted]
    return {
        "exit": exit_how,
        "inflight": inflight,
        "runs": runs,
        "aborted": len(aborted),
        "aborted_after_done": sum(all(r.done) for r in aborted),
        "clean": sum(r.returncodes == [0] * WORLD and all(r.done) for r in results),
        "results": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--rank-body"]:
        rank_body(args[1], int(args[2]), Path(args[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--exit", choices=["sys", "controlled"], default="sys", dest="exit_how")
    parser.add_argument("--inflight", type=int, default=200)
    opts = parser.parse_args(args)
    summary = race(opts.runs, opts.exit_how, opts.inflight)
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))


if __name__ == "__main__":
    main()
