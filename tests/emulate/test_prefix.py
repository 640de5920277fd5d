"""$HETRL_EMULATE_PREFIX: a second cluster (bench/emulated_suite.py) names its resources apart from the tests'."""

from __future__ import annotations

import os
import subprocess
import sys

SHOW = (
    "from hetrl_cli.emulate import cgroups, netns; "
    "print(cgroups.PREFIX, netns.BRIDGE, netns.netns_name('fast'), netns.veth_name(199))"
)


def _run(prefix: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HETRL_EMULATE_PREFIX"}
    if prefix is not None:
        env["HETRL_EMULATE_PREFIX"] = prefix
    return subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, env=env, timeout=60)


def test_default_prefix() -> None:
    done = _run(None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hetrl-emu-", "hetrl-emu-br", "hetrl-emu-fast", "hetrl-emu-v199"]


def test_prefix_from_environment_names_everything() -> None:
    done = _run("hetrl-emb-")
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert names == ["hetrl-emb-", "hetrl-emb-br", "hetrl-emb-fast", "hetrl-emb-v199"]
    assert not any(n.startswith("hetrl-emu-") for n in names)  # the default cluster's sweep leaves them alone
    assert max(len(n) for n in names[1:]) <= 15


def test_bad_prefix_is_refused() -> None:
    for bad in ("hetrl-emu", "x; rm -rf /", "hetrl-toolong-", "HETRL-A-"):
        done = _run(bad)
        assert done.returncode != 0
        assert "HETRL_EMULATE_PREFIX" in done.stderr
