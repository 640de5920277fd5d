"""The ready-to-wire typer sub-app: commands, help, and errors passed through as HetrlError (the main app
turns them into one line and an exit code)."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from hetrl_cli.emulate.cli import emulate_app
from hetrl_cli.errors import BadInput


def wired() -> typer.Typer:
    """As the lead wires it: `app.add_typer(emulate_app, name="emulate")`."""
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    app.add_typer(emulate_app, name="emulate")
    return app


def test_help_lists_up_and_down() -> None:
    result = CliRunner().invoke(wired(), ["emulate", "--help"])
    assert result.exit_code == 0
    assert "up" in result.output and "down" in result.output and "docs/emulate.md" in result.output


def test_up_with_a_bad_spec_raises_bad_input_before_touching_anything(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [{name: x, region: r, cpu: 1, colour: blue}]\n")
    result = CliRunner().invoke(wired(), ["emulate", "up", str(bad), "--state-dir", str(tmp_path / "s")])
    assert isinstance(result.exception, BadInput)
    assert str(result.exception) == f"{bad}: field 'hosts.0.colour': Extra inputs are not permitted"
    assert not (tmp_path / "s").exists()


def test_up_json_is_what_was_made_as_plain_data(tmp_path: Path) -> None:
    import json

    from hetrl_cli.emulate.api import EmulatedCluster, EmulatedHost, EmulatedLink

    cluster = EmulatedCluster(
        state_dir=tmp_path,
        hosts=[EmulatedHost("fast", "east", "10.213.0.2", "hetrl-emu-fast", 1.0, None, 4242, (0,))],
        links=[EmulatedLink("east", "west", 6.25e6, 0.02)],
        hosts_file=tmp_path / "hosts.txt",
        known_hosts=tmp_path / "known_hosts",
        identity=tmp_path / "id",
        links_file=tmp_path / "links.yaml",
        links_configured_file=tmp_path / "links-configured.yaml",
    )
    data = json.loads(json.dumps(cluster.as_json()))
    assert data["hosts"][0]["address"] == "10.213.0.2" and data["hosts"][0]["cpus"] == [0]
    assert data["hosts_file"] == str(tmp_path / "hosts.txt")
    assert data["links"][0]["bandwidth_Bps"] == 6.25e6


def test_down_json_lists_what_it_removed(tmp_path: Path) -> None:
    import json

    result = CliRunner().invoke(wired(), ["emulate", "down", "--state-dir", str(tmp_path / "none"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"removed": []}
