"""`hetrl plan --exclude HOST`: the lost host's devices and links leave the profile before planning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.errors import BadInput
from hetrl_cli.planner.exclude import exclude_hosts

from .conftest import TINY, cluster, workload


def test_exclude_drops_the_hosts_devices_and_links() -> None:
    full = cluster("three", TINY["1p2"])
    rest = exclude_hosts(full, ["l4-1"])
    assert rest.name == "three-without-l4-1"
    assert [h.name for h in rest.hosts] == ["a100-0", "l4-0"]
    assert [d.id for d in rest.devices] == ["a100-0/0", "l4-0/0"]
    assert [(lk.a, lk.b) for lk in rest.links] == [("a100-0", "l4-0")]
    assert rest.fingerprint == rest.compute_fingerprint() != full.fingerprint
    with pytest.raises(BadInput, match=r"^--exclude l4-9: profile 'three' has no such host \(hosts: a100-0, l4-0"):
        exclude_hosts(full, ["l4-9"])
    with pytest.raises(BadInput, match="no device of profile 'three' is left"):
        exclude_hosts(full, ["a100-0", "l4-0", "l4-1"])


def test_hetrl_plan_exclude_plans_without_the_host(hetrl, tmp_path: Path) -> None:
    save_artifact(cluster("pairs", TINY["2x2"]), tmp_path / "pairs.json")
    save_artifact(workload("grpo", "sync"), tmp_path / "workload.json")
    args = ["plan", "pairs.json", "-w", "workload.json", "--solver", "hybrid", "--budget", "5s", "--max-evals", "64"]
    result = hetrl(*args, "--exclude", "l4-0", "-o", "rest.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads((tmp_path / "rest.json").read_text())
    used = {d for group in plan["groups"] for d in group["devices"]}
    assert used == {"a100-0/0", "a100-0/1"}  # the L4 host's devices are gone
    assert plan["profile_name"] == "pairs-without-l4-0"
    bad = hetrl(*args, "--exclude", "nowhere", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--exclude nowhere" in bad.stderr, bad.stderr
