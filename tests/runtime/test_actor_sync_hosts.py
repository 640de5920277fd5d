"""A real `hetrl run --hosts` over two hosts (real sshd on loopback) where actor_train's second replica feeds its own
host (runtime/weightsync.feed_specs): actor_train DP 2, one rank on each host; generation one TP 2 replica over
both (hf: every TP rank loads the full weights, so the rank on the second host is a receiver). Before, replica 0's
leader relayed one full copy over the host link each step; now the second host's replica leader gathers its own
replica's weights and loads them in place. --verify-weights: the engine holds exactly the trained weights."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.runtime.layout import Layout
from hetrl_cli.runtime.weightsync import sync_specs

from .plans import hand_plan, on, replica, tiny_workload
from .test_multihost import run_args, two_hosts  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


def test_a_replica_on_the_second_host_feeds_it_and_the_engine_holds_the_trained_weights(two_hosts, tmp_path: Path):  # noqa: F811
    hosts, known, d0, d1 = two_hosts
    placement = on(d0, ["reference", "reward"]) | {
        "actor_train": [(d0, 0.5), (d1, 0.5)],
        "generation": [replica([[d0, d1]])],
    }
    plan = hand_plan(tiny_workload(), placement, name="fed")
    specs = sync_specs(Layout.from_plan(plan), "hf", False)
    assert specs == {"sync:actor": [0], "sync:actor@1": [1]}  # before: {"sync:actor": [0, 1]}, a copy over the link
    plan_file, run_dir = tmp_path / "plan.json", tmp_path / "run"
    save_artifact(plan, plan_file)
    result = subprocess.run(run_args(plan_file, hosts, known, run_dir, "--steps", "2", "--verify-weights"),
                            capture_output=True, text=True, timeout=150, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in lines)  # replica 0's weights, bit for bit
