"""`hetrl emulate up SPEC` / `hetrl emulate down`: a ready typer sub-app (the lead adds it with
`app.add_typer(emulate_app, name="emulate")`). Parses, calls api.py, prints a summary on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

emulate_app = typer.Typer(
    help=(
        "A heterogeneous cluster on this machine (root): hosts as network namespaces with their own sshd, CPU "
        "shares by cgroups, slow links by tc. See docs/emulate.md.\n\n"
        "  hetrl emulate up examples/emulate-3host.yaml\n\n"
        "  hetrl profile /run/hetrl-emulate/hosts.txt --known-hosts /run/hetrl-emulate/known_hosts "
        "--links /run/hetrl-emulate/links.yaml -o profiles/emu.json\n\n"
        "  hetrl emulate down"
    ),
    no_args_is_help=True,
)

_STATE_DIR_HELP = "Where hosts.txt, keys and state.json go (default /run/hetrl-emulate)."


@emulate_app.command()
def up(
    spec: Annotated[Path, typer.Argument(help="Cluster spec YAML (hosts, regions, cpu shares, links).")],
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=_STATE_DIR_HELP)] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print what was made (hosts, links, files) on stdout.")
    ] = False,
) -> None:
    """Create the hosts, links and limits of SPEC; write STATE_DIR/hosts.txt to profile, plan and run against."""
    from hetrl_cli.emulate.api import DEFAULT_STATE_DIR, emulate_up

    cluster = emulate_up(spec, state_dir or DEFAULT_STATE_DIR)
    for line in cluster.summary():
        typer.echo(line, err=True)
    if json_out:
        typer.echo(json.dumps(cluster.as_json(), indent=2))


@emulate_app.command()
def down(
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=_STATE_DIR_HELP)] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"removed": [...]} on stdout.')] = False,
) -> None:
    """Remove everything `up` made (also anything named hetrl-emu-* left by a crash); safe to run twice."""
    from hetrl_cli.emulate.api import DEFAULT_STATE_DIR, emulate_down

    removed = emulate_down(state_dir or DEFAULT_STATE_DIR)
    for line in removed:
        typer.echo(f"removed {line}", err=True)
    typer.echo(f"emulated cluster down ({len(removed)} things removed)" if removed else "nothing to remove", err=True)
    if json_out:
        typer.echo(json.dumps({"removed": removed}))
