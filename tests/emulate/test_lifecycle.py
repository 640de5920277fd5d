"""up and down around the edges: root only, one cluster at a time, rollback of a failed up, down after a
crash, down after the state dir is lost, down twice, memory limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.emulate import api, sshd
from hetrl_cli.emulate.api import emulate_down, emulate_up
from hetrl_cli.errors import BadInput, HetrlError

from .conftest import EXAMPLE, leftovers, remote_affinity, ssh, sshd_pids


def emulated(test: Callable[..., None]) -> Callable[..., None]:
    """slow + root, skipped with the reason where namespaces cannot be made."""
    return pytest.mark.slow(pytest.mark.root(pytest.mark.usefixtures("need_emulation")(test)))


TWO_HOSTS = """
subnet: 10.213.0.0/24
hosts:
  - {name: big, region: a, cpu: 1.0, memory: 256MiB}
  - {name: small, region: b, cpu: 0.5}
links:
  - {a: a, b: b, bandwidth: 100Mbit/s}
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "two.yaml"
    path.write_text(TWO_HOSTS)
    return path


def assert_clean(state_dir: Path) -> None:
    assert leftovers() == []
    assert sshd_pids(state_dir) == []
    assert not state_dir.exists()


def test_not_root_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    message = (
        "hetrl emulate needs root (it creates network namespaces, tc qdiscs and cgroups): run it as root or with sudo"
    )
    with pytest.raises(HetrlError) as err:
        emulate_up(EXAMPLE, tmp_path / "state")
    assert str(err.value) == message and err.value.exit_code == 1
    with pytest.raises(HetrlError, match="needs root"):
        emulate_down(tmp_path / "state")
    assert not (tmp_path / "state").exists()


def test_bad_spec_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [{name: x, region: r, cpu: 99}]\n")
    with pytest.raises(BadInput, match=r"bad.yaml: field 'hosts.0.cpu': 99 cores, but this machine has \d+$"):
        emulate_up(bad, tmp_path / "state")
    assert not (tmp_path / "state").exists()


@emulated
def test_up_twice_is_refused_and_down_is_idempotent(spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cluster = emulate_up(spec, state)
    try:
        with pytest.raises(HetrlError) as again:
            emulate_up(spec, state)
        assert str(again.value) == (
            f"an emulated cluster is already up (state {state}/state.json): "
            f"run `hetrl emulate down --state-dir {state}` first"
        )
        with pytest.raises(HetrlError, match=r"is on this machine \(hetrl-emu-.*run `hetrl emulate down` first$"):
            emulate_up(spec, tmp_path / "other")
        # memory limit: the big host's sshd sits in a memory cgroup with the limit
        big = next(h for h in cluster.hosts if h.name == "big")
        memory_line = next(
            line for line in Path(f"/proc/{big.sshd_pid}/cgroup").read_text().splitlines() if ":memory:" in line
        )
        group = Path("/sys/fs/cgroup/memory") / memory_line.split(":", 2)[2].lstrip("/")
        assert group.name == "hetrl-emu-big"
        assert int((group / "memory.limit_in_bytes").read_text()) == 256 << 20
        assert ssh(cluster, "small", "hostname").stdout == "small\n"
        # CPUs: with 2 or more here each host is pinned to one of its own (pin_cpus: auto), and what it runs
        # inherits that; with one CPU neither is pinned
        cpus = sorted(os.sched_getaffinity(0))
        expected = {"big": (cpus[-1],), "small": (cpus[-2],)} if len(cpus) > 1 else {"big": (), "small": ()}
        assert {h.name: h.cpus for h in cluster.hosts} == expected
        for h in cluster.hosts:
            assert sorted(os.sched_getaffinity(h.sshd_pid)) == list(h.cpus or cpus)
            assert remote_affinity(cluster, h.name) == str(list(h.cpus or cpus)), h.name
    finally:
        removed = emulate_down(state)
    assert "netns hetrl-emu-big" in removed and "bridge hetrl-emu-br" in removed
    assert any(r.startswith("sshd pid") for r in removed)
    assert_clean(state)
    assert emulate_down(state) == []
    assert emulate_down(tmp_path / "never-used") == []


@emulated
def test_a_failure_mid_up_rolls_back_everything(spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second host's sshd fails to start: the first host's netns, sshd and cgroups are removed again."""
    real_start = sshd.start

    def start_then_fail(host: str, *args: object, **kwargs: object) -> object:
        if host == "small":
            raise HetrlError("sshd of host small: injected failure")
        return real_start(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sshd, "start", start_then_fail)
    state = tmp_path / "state"
    with pytest.raises(HetrlError, match=r"^sshd of host small: injected failure$"):
        emulate_up(spec, state)
    assert_clean(state)
    assert emulate_down(state) == []


CRASH = """
import os, signal, sys
from pathlib import Path
from hetrl_cli.emulate import api, sshd
sshd.wait_listening = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # die with everything made, nothing done
api.emulate_up(Path(sys.argv[1]), Path(sys.argv[2]))
"""


@emulated
def test_down_cleans_up_after_a_crashed_up(spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "-c", CRASH, str(spec), str(state)], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert json.loads((state / "state.json").read_text())["complete"] is False
    assert leftovers() and sshd_pids(state)
    removed = emulate_down(state)
    assert "netns hetrl-emu-small" in removed
    assert_clean(state)


@emulated
def test_down_without_state_sweeps_by_name(spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    emulate_up(spec, state)
    (state / "state.json").unlink()
    removed = emulate_down(tmp_path / "elsewhere")
    assert {"netns hetrl-emu-big", "netns hetrl-emu-small", "bridge hetrl-emu-br"} <= set(removed)
    assert any(r.startswith("cgroup ") and r.endswith("hetrl-emu-big") for r in removed)
    assert leftovers() == [] and sshd_pids(state) == []
    with pytest.raises(HetrlError, match=f"already holds {api.CLIENT_KEY} but no state.json"):
        emulate_up(spec, state)  # the keys are still there: refused rather than overwritten
    assert leftovers() == []
