"""`--format markdown` (well-formed GFM tables) and `--format json` (valid JSON only on stdout)."""

from __future__ import annotations

import json

import pytest

from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.render.plan import show_plan


def markdown_tables(text: str) -> list[list[str]]:
    """Consecutive `|` lines outside code blocks, one list per table."""
    tables, current, in_code = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables + ([current] if current else [])


def cells(line: str) -> int:
    """Cells in a pipe-table row, ignoring escaped pipes."""
    return line.replace("\\|", "").strip().strip("|").count("|") + 1


@pytest.mark.parametrize("name", ["ppo_plan", "baseline_plan", "grpo_plan"])
def test_markdown_tables_are_well_formed(request: pytest.FixtureRequest, name: str, capsys) -> None:
    show_plan(request.getfixturevalue(name), fmt="markdown", profile=request.getfixturevalue("cluster"))
    out = capsys.readouterr().out
    tables = markdown_tables(out)
    assert len(tables) == 6  # summary, groups, tasks, task times, device map, memory
    for table in tables:
        width = cells(table[0])
        assert all(set(c.strip()) <= set("-:") for c in table[1].strip("|").split("|")), table[1]
        assert all(cells(row) == width for row in table), table


def test_markdown_has_every_section(ppo_plan: Plan, cluster: ClusterProfile, capsys) -> None:
    show_plan(ppo_plan, fmt="markdown", profile=cluster)
    out = capsys.readouterr().out
    for heading in (
        "## Plan `lab-ilp`",
        "### Groups",
        "### Tasks",
        "### Predicted time per task",
        "### Device map",
        "### Iteration timeline",
        "### Peak memory",
        "**Bottleneck:**",
    ):
        assert heading in out, heading
    assert "| A | rollout | generation | 8 | 4×A100 (a100-0), 4×L4 (l4-0) |" in out
    assert "| a100-0 | us-east-1 | 8×A100 | A A A A B B B · |" in out
    assert out.count("```") == 2


def test_markdown_stale_is_a_blockquote(ppo_plan: Plan, cluster: ClusterProfile, capsys) -> None:
    other = cluster.model_copy(update={"devices": cluster.devices[:-1]}).with_fingerprint()
    show_plan(ppo_plan, fmt="markdown", profile=other)
    assert "> **⚠ STALE PLAN** `lab-ilp`:" in capsys.readouterr().out


def test_json_is_only_json_with_the_key_numbers(ppo_plan: Plan, cluster: ClusterProfile, capsys) -> None:
    show_plan(ppo_plan, fmt="json", profile=cluster)
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert err == ""
    assert (data["plan"], data["iteration_s"], data["weight_sync_s"]) == ("lab-ilp", 15.8, 0.8)
    assert data["samples_per_s"] == pytest.approx(1024 / 15.8)
    assert data["stale"] is None
    assert data["solver"]["status"] == "optimal" and data["solver"]["evaluations"] == 3120
    assert data["devices"] == {"used": 19, "known": 20, "idle": 1, "hosts": 3}
    assert data["groups"][0]["placement"] == "4×A100 (a100-0), 4×L4 (l4-0)"
    assert data["groups"][0]["by_host"] == {"a100-0": 4, "l4-0": 4}
    assert data["tasks"][0]["batch_shares"] == [0.31, 0.31, 0.19, 0.19]


def test_json_per_host_map(ppo_plan: Plan, cluster: ClusterProfile, capsys) -> None:
    show_plan(ppo_plan, fmt="json", profile=cluster)
    hosts = {h["host"]: h for h in json.loads(capsys.readouterr().out)["hosts"]}
    assert list(hosts) == ["a100-0", "a100-1", "l4-0"]
    a0 = hosts["a100-0"]
    assert a0["region"] == "us-east-1"
    assert [d["group"] for d in a0["devices"]] == ["rollout"] * 4 + ["infer"] * 3 + [None]
    assert a0["devices"][7]["state"] == "idle"
    assert a0["devices"][4]["tasks"] == ["reference", "critic_inference"]
    assert hosts["l4-0"]["devices"][0] | {"tasks": []} == {
        "id": "l4-0/0",
        "type": "L4",
        "state": "used",
        "group": "rollout",
        "tasks": [],
        "peak_bytes": 21_500_000_000,
        "capacity_bytes": 24 * 2**30,
    }


def test_json_stale(ppo_plan: Plan, cluster: ClusterProfile, capsys) -> None:
    other = cluster.model_copy(update={"devices": cluster.devices[:-1]}).with_fingerprint()
    show_plan(ppo_plan, fmt="json", profile=other)
    out, err = capsys.readouterr()
    stale = json.loads(out)["stale"]
    assert stale["missing_devices"] == ["l4-0/3"] and stale["plan_fingerprint"] == cluster.fingerprint
    assert err.startswith("hetrl: warning: plan lab-ilp is STALE: plan made for profile") and err.count("\n") == 1
