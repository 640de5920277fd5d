"""`hetrl profile hosts.txt` end to end: the real CLI, a real sshd with three hosts, real probes and links.

Plus the pieces it is made of, run for real: the probe's core count under cgroup quotas and affinity,
netbench's bounded lifetime, link sampling and inference, the links file and its units.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.artifacts.hosts import parse_hosts_text
from hetrl_cli.artifacts.io import load_artifact
from hetrl_cli.artifacts.profile import ClusterProfile, Link
from hetrl_cli.errors import BadInput
from hetrl_cli.profiling.links import apply_overrides, load_link_overrides, parse_bandwidth, parse_latency
from hetrl_cli.profiling.remote import choose_pairs, infer_missing, link_kind, remote_command
from sshd import SshdHosts, free_port, keygen

slow = pytest.mark.slow

Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]
"""The `hetrl` fixture from conftest.py: runs the real CLI."""


def write_hosts(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def profile_args(hosts: SshdHosts, hosts_file: Path, *extra: str | Path) -> list[str | Path]:
    return ["profile", hosts_file, "--known-hosts", hosts.known_hosts, "--timeout", "60", *extra]


# ---- the happy path ---------------------------------------------------------------------------------------


@slow
def test_three_hosts_profiled_with_links_between_all_pairs_and_stable_fingerprint(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    hosts_file = write_hosts(tmp_path, "".join(sshd_hosts.hosts_line(a) for a in sshd_hosts.addresses))
    out = tmp_path / "lab.json"
    first = hetrl(*profile_args(sshd_hosts, hosts_file, "-o", out))
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""
    assert f"wrote {out}" in first.stderr
    profile = load_artifact(out, ClusterProfile)
    names = [f"{a}:{sshd_hosts.port}" for a in sshd_hosts.addresses]
    assert profile.name == "hosts" and profile.method == "ssh-probe"
    assert [h.name for h in profile.hosts] == names
    for host in profile.hosts:
        assert host.status == "ok" and host.error is None
        assert host.software["python"] == ".".join(map(str, sys.version_info[:3]))
        assert host.software["hetrl"] and host.software["torch"]
        assert host.memory_bytes and host.free_disk_bytes and host.cpu_count and host.cpu_count > 0
        assert host.intra_link is None  # one device per host
    assert [d.id for d in profile.devices] == [f"{n}/0" for n in names]
    for device in profile.devices:
        assert device.kind == "cpu" and device.cores and device.cores > 0
        assert device.measured_tflops["fp32"] > 1e-4  # > 0.1 GFLOP/s even on a loaded 2-core machine
        assert device.memory_gbps > 0.1
    assert {frozenset((lk.a, lk.b)) for lk in profile.links} == {
        frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1 :]
    }
    for link in profile.links:
        assert link.source == "measured" and link.kind == "loopback"
        assert link.bandwidth_Bps > 1e6 and 0 < link.latency_s < 0.05
    assert profile.fingerprint == profile.compute_fingerprint()

    # Re-profile the same hardware, with one pair given in a links file: --json prints only the profile,
    # and the fingerprint (hardware facts, not timings) does not change.
    links_yaml = tmp_path / "links.yaml"
    links_yaml.write_text(f"links:\n  - a: {names[0]}\n    b: {names[1]}\n    bandwidth: 5Gbps\n    latency: 10ms\n")
    second = hetrl(*profile_args(sshd_hosts, hosts_file, "--json", "--links", links_yaml), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    again = ClusterProfile.model_validate(json.loads(second.stdout))
    assert again.fingerprint == profile.fingerprint
    overridden = again.link_map()[frozenset(names[:2])]
    assert (overridden.source, overridden.bandwidth_Bps, overridden.latency_s) == ("override", 625e6, 0.01)
    assert sorted(lk.source for lk in again.links) == ["measured", "measured", "override"]
    assert not (tmp_path / "profiles").exists()  # --json writes no file


@slow
def test_localhost_is_profiled_without_ssh_and_stdin_hosts_file_works(hetrl: Hetrl, tmp_path: Path) -> None:
    result = hetrl("profile", "-", "--json", stdin="localhost  # this machine\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    profile = ClusterProfile.model_validate(json.loads(result.stdout))
    (host,) = profile.hosts
    assert (host.name, host.status) == ("localhost", "ok")
    assert Path(host.python).parent == Path(sys.executable).parent  # the interpreter running hetrl
    assert profile.name == "stdin" and profile.links == []
    assert [d.id for d in profile.devices] == ["localhost/0"]
    assert not (tmp_path / "profiles").exists()


# ---- failures, each naming the host ----------------------------------------------------------------------


@slow
def test_down_host_fails_naming_it_and_allow_partial_marks_it_missing(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    closed = free_port(("127.0.0.4",))
    down = f"127.0.0.4:{closed}"
    hosts_file = write_hosts(tmp_path, sshd_hosts.hosts_line("127.0.0.2") + f"{down} python={sys.executable}\n")
    out = tmp_path / "p.json"
    failed = hetrl(*profile_args(sshd_hosts, hosts_file, "-o", out))
    assert failed.returncode == 1
    assert failed.stderr.splitlines() == [
        "hetrl: error: could not profile 1 of 2 hosts; no profile written "
        "(--allow-partial writes the others and marks these missing):",
        f"  {down}: connection refused at {down}: is sshd running there and is the port right?",
    ]
    assert not out.exists() and list(tmp_path.iterdir()) == [hosts_file]

    partial = hetrl(*profile_args(sshd_hosts, hosts_file, "-o", out, "--allow-partial"))
    assert partial.returncode == 0, partial.stderr
    assert f"warning: {down}: connection refused" in partial.stderr
    profile = load_artifact(out, ClusterProfile)
    statuses = {h.name: (h.status, h.error) for h in profile.hosts}
    assert statuses[f"127.0.0.2:{sshd_hosts.port}"] == ("ok", None)
    assert statuses[down][0] == "missing" and "connection refused" in statuses[down][1]
    assert [d.host for d in profile.devices] == [f"127.0.0.2:{sshd_hosts.port}"]
    assert profile.links == []


def test_silent_port_times_out_with_the_timeout_named(hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path) -> None:
    with socket.socket() as listener:  # accepts TCP but never speaks SSH, like a hung host
        listener.bind(("127.0.0.3", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        hosts_file = write_hosts(tmp_path, f"127.0.0.3:{port}\n")
        start = time.monotonic()
        result = hetrl("profile", hosts_file, "--known-hosts", sshd_hosts.known_hosts, "--timeout", "2")
    assert result.returncode == 1
    assert time.monotonic() - start < 20
    assert result.stderr.splitlines() == [
        "hetrl: error: could not profile the host; no profile written:",
        f"  127.0.0.3:{port}: no SSH banner from 127.0.0.3:{port} within 2s: "
        "not an SSH server, or overloaded (--timeout)",
    ]


def test_wrong_identity_is_an_authentication_error(hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path) -> None:
    line = sshd_hosts.hosts_line("127.0.0.2", identity=sshd_hosts.other_identity)
    result = hetrl(*profile_args(sshd_hosts, write_hosts(tmp_path, line)))
    assert result.returncode == 1
    name = f"127.0.0.2:{sshd_hosts.port}"
    assert result.stderr.splitlines() == [
        "hetrl: error: could not profile the host; no profile written:",
        f"  {name}: SSH authentication failed for {sshd_hosts.user}@{name} with key {sshd_hosts.other_identity}: "
        "add the public key to that host's authorized_keys or set identity= in hosts.txt",
    ]


def test_host_key_mismatch_is_refused(hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path) -> None:
    impostor = keygen(tmp_path / "impostor", "impostor")
    known = tmp_path / "known_hosts"
    known.write_text(sshd_hosts.known_hosts_line("127.0.0.3", impostor))
    hosts_file = write_hosts(tmp_path, sshd_hosts.hosts_line("127.0.0.3"))
    result = hetrl("profile", hosts_file, "--known-hosts", known, "--accept-new-host-keys")
    assert result.returncode == 1
    header, last = result.stderr.splitlines()
    assert header == "hetrl: error: could not profile the host; no profile written:"
    assert last.startswith(f"  127.0.0.3:{sshd_hosts.port}: HOST KEY MISMATCH for [127.0.0.3]:{sshd_hosts.port}:")
    assert f"ssh-keygen -R '[127.0.0.3]:{sshd_hosts.port}' -f {known}" in last
    assert known.read_text() == sshd_hosts.known_hosts_line("127.0.0.3", impostor)  # never "fixed" silently


@slow
def test_unknown_host_key_needs_the_flag_which_adds_and_reports_it(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    known = tmp_path / "ssh" / "known_hosts"  # does not exist yet
    hosts_file = write_hosts(tmp_path, sshd_hosts.hosts_line("127.0.0.4"))
    name = f"127.0.0.4:{sshd_hosts.port}"
    refused = hetrl("profile", hosts_file, "--known-hosts", known, "-o", tmp_path / "p.json")
    assert refused.returncode == 1
    header, last = refused.stderr.splitlines()
    assert header == "hetrl: error: could not profile the host; no profile written:"
    assert last.startswith(f"  {name}: host key ssh-ed25519 SHA256:")
    assert last.endswith("or rerun with --accept-new-host-keys")
    assert not known.exists() and not (tmp_path / "p.json").exists()

    accepted = hetrl("profile", hosts_file, "--known-hosts", known, "--accept-new-host-keys", "-o", tmp_path / "p.json")
    assert accepted.returncode == 0, accepted.stderr
    assert f"added host key [127.0.0.4]:{sshd_hosts.port} ssh-ed25519 SHA256:" in accepted.stderr
    assert known.read_text() == sshd_hosts.known_hosts_line("127.0.0.4")
    profile = load_artifact(tmp_path / "p.json", ClusterProfile)
    assert any(note.startswith("added host key") for note in profile.notes)

    strict_again = hetrl("profile", hosts_file, "--known-hosts", known, "--json")
    assert strict_again.returncode == 0, strict_again.stderr
    assert "added host key" not in strict_again.stderr


@slow
def test_a_probe_error_before_the_barrier_names_the_host_and_spares_the_other(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    """The probe refuses `gpus=` on a CPU host before it says ready: that host fails with the probe's reason,
    and with --allow-partial the other is still benchmarked (its `go` does not wait for the failed one)."""
    text = sshd_hosts.hosts_line("127.0.0.2") + sshd_hosts.hosts_line("127.0.0.3").rstrip("\n") + " gpus=0\n"
    result = hetrl(*profile_args(sshd_hosts, write_hosts(tmp_path, text), "--allow-partial", "-o", tmp_path / "p.json"))
    assert result.returncode == 0, result.stderr
    profile = ClusterProfile.model_validate_json((tmp_path / "p.json").read_text())
    assert [h.status for h in profile.hosts] == ["ok", "missing"]
    assert (
        f"warning: 127.0.0.3:{sshd_hosts.port}: probe: gpus=0 but the host has no CUDA GPUs; use slots=N to split "
        "its CPU" in result.stderr
    )


@slow
def test_missing_python_missing_hetrl_and_a_crash_are_each_reported(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    bare_python = "/usr/bin/python3"
    check = subprocess.run([bare_python, "-c", "import hetrl_cli"], capture_output=True)
    if check.returncode == 0:
        pytest.skip(f"{bare_python} has hetrl installed; cannot show the missing-hetrl error")
    base = f"{sshd_hosts.user}@{{}}:{sshd_hosts.port} identity={sshd_hosts.identity}"
    text = base.format("127.0.0.2") + " python=/nonexistent/bin/python3\n"
    text += base.format("127.0.0.3") + f" python={bare_python}\n"
    text += base.format("127.0.0.4") + " python=/bin/false\n"  # "crashes" silently
    result = hetrl(*profile_args(sshd_hosts, write_hosts(tmp_path, text)))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "hetrl: error: could not profile any of the 3 hosts; no profile written:",
        f"  127.0.0.2:{sshd_hosts.port}: python '/nonexistent/bin/python3' not found: set python= in hosts.txt to "
        "an interpreter that has hetrl installed",
        f"  127.0.0.3:{sshd_hosts.port}: hetrl is not installed for {bare_python}: pip install hetrl on that host, "
        "or set python= in hosts.txt",
        f"  127.0.0.4:{sshd_hosts.port}: probe crashed (exit 1): no error output",
    ]


# ---- progress ---------------------------------------------------------------------------------------------


@slow
def test_off_a_terminal_each_finished_host_and_link_step_is_one_whole_line(
    hetrl: Hetrl, sshd_hosts: SshdHosts, tmp_path: Path
) -> None:
    """CI logs see progress while the probes run: one line per host as it finishes, one per link step, never
    wrapped (even at 40 columns)."""
    import re

    a, b = (f"{addr}:{sshd_hosts.port}" for addr in sshd_hosts.addresses[:2])
    text = sshd_hosts.hosts_line(sshd_hosts.addresses[0]) + sshd_hosts.hosts_line(sshd_hosts.addresses[1])
    result = hetrl(*profile_args(sshd_hosts, write_hosts(tmp_path, text), "--json"), COLUMNS="40")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    progress = [line for line in lines if line.startswith("profile: ")]
    assert len(progress) == 4, result.stderr
    for name in (a, b):
        assert any(re.fullmatch(rf"profile: {re.escape(name)} done \(1 device, \d+\.\d s\)", x) for x in progress)
    assert progress[2] == f"profile: links: {a} <-> {b} (1/1)"
    assert re.fullmatch(r"profile: links: 1 of 1 measured \(\d+\.\d s\)", progress[3])


@slow
def test_on_a_terminal_progress_stays_live_without_log_lines(tmp_path: Path, monkeypatch) -> None:
    """On a pty: rich's live host lines, not the plain lines meant for logs."""
    from conftest import HETRL
    from runtime.test_run_watch import run_in_pty

    monkeypatch.setenv("HETRL_PROBE_QUICK", "1")
    hosts_file = write_hosts(tmp_path, "localhost\n")
    code, seen = run_in_pty([HETRL, "profile", str(hosts_file), "-o", str(tmp_path / "p.json")], tmp_path, 120)
    assert code == 0, seen
    assert load_artifact(tmp_path / "p.json", ClusterProfile).hosts[0].name == "localhost"
    assert "localhost: " in seen  # the live line
    assert "profile: localhost done" not in seen


# ---- the probe on its own -------------------------------------------------------------------------------


def _cores_in(preexec: object = None, prefix: list[str] | None = None) -> float:
    code = "from hetrl_cli.profiling.probe import usable_cores; print(usable_cores())"
    done = subprocess.run(
        [*(prefix or []), sys.executable, "-c", code], capture_output=True, text=True, check=True, preexec_fn=preexec
    )
    return float(done.stdout)


def test_usable_cores_honour_affinity() -> None:
    assert _cores_in(preexec=lambda: os.sched_setaffinity(0, {0})) == 1.0


def test_usable_cores_honour_a_cgroup_v1_quota(tmp_path: Path) -> None:
    controller = Path("/sys/fs/cgroup/cpu")
    if not (controller / "cpu.cfs_quota_us").exists() or not os.access(controller, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    group = controller / f"hetrl-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")
        shell = f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"'
        assert _cores_in(prefix=["sh", "-c", shell]) == 0.5
    finally:
        group.rmdir()


@slow
def test_sustained_timing_sees_the_pauses_a_cpu_quota_makes() -> None:
    """Under a quota short steps run at full speed between throttled pauses: the median misses the pauses,
    the sustained rate (wall time per step) includes them."""
    from hetrl_cli.profiling.probe import _timed_loop

    calls = []

    def step() -> None:  # every fourth step waits 40 ms, like a step that hits the end of the period's quota
        calls.append(1)
        time.sleep(0.04 if len(calls) % 4 == 0 else 0.001)

    assert _timed_loop(step, 0.3) < 0.005
    calls.clear()
    assert _timed_loop(step, 0.3, sustained=True) > 0.008


def test_probe_prints_one_json_object_and_rejects_gpus_on_a_cpu_host() -> None:
    env = {**os.environ, "HETRL_PROBE_QUICK": "1"}
    ok = subprocess.run(
        [sys.executable, "-m", "hetrl_cli.profiling.probe"], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 1
    facts = json.loads(ok.stdout)
    assert facts["quick"] is True and [d["kind"] for d in facts["devices"]] == ["cpu"]
    bad = subprocess.run(
        [sys.executable, "-m", "hetrl_cli.profiling.probe", "--gpus", "0,1"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 3
    assert json.loads(bad.stdout)["error"] == ("gpus=0,1 but the host has no CUDA GPUs; use slots=N to split its CPU")


def test_together_probe_runs_each_benchmark_only_after_go_and_quits_on_eof() -> None:
    """--together: a ready line before each benchmark stage, the next line only after `go` (profile_hosts'
    lockstep), the facts last; EOF instead of `go` (the launcher gave up) ends it with exit 4, no facts."""
    from hetrl_cli.profiling.probe import GO_LINE

    env = {**os.environ, "HETRL_PROBE_QUICK": "1"}
    argv = [sys.executable, "-m", "hetrl_cli.profiling.probe", "--together"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdin is not None
    stages = []
    while "ready" in (line := json.loads(proc.stdout.readline())):
        stages.append(line["ready"])
        proc.stdin.write((GO_LINE + "\n").encode())
        proc.stdin.flush()
    assert stages == ["start", "memory", "decode", "forward"]
    [device] = line["devices"]
    assert device["kind"] == "cpu" and device["decode_steps_per_s"] > 0 and device["forward_tokens_per_s"] > 0
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and rest == b"", err.decode()

    gave_up = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = gave_up.communicate(b"", timeout=120)
    assert gave_up.returncode == 4, err.decode()
    assert [json.loads(x) for x in out.splitlines()] == [{"ready": "start"}]


@slow
def test_cpu_host_with_slots_is_split_into_equal_devices() -> None:
    env = {**os.environ, "HETRL_PROBE_QUICK": "1"}
    argv = [sys.executable, "-m", "hetrl_cli.profiling.probe", "--slots", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    devices = facts["devices"]
    assert [d["index"] for d in devices] == [0, 1]
    assert devices[0]["cores"] == devices[1]["cores"] == pytest.approx(facts["cpu_count"] / 2)
    assert devices[0]["memory_bytes"] == facts["memory_bytes"] // 2
    assert facts["intra_link"]["kind"] == "loopback" and facts["intra_link"]["source"] == "assumed"


# ---- netbench -------------------------------------------------------------------------------------------


def _serve(lifetime: float) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "hetrl_cli.profiling.netbench", "serve", "--token", "t0k3n", "--lifetime"]
    return subprocess.Popen([*argv, str(lifetime)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_netbench_server_gives_up_after_its_lifetime_and_ignores_strangers() -> None:
    server = _serve(1.5)
    assert server.stdout is not None
    port = json.loads(server.stdout.readline())["port"]
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.sendall(b"wrong-token!")
    start = time.monotonic()
    assert server.wait(timeout=10) == 5
    assert time.monotonic() - start < 3


def test_netbench_measures_latency_and_bounded_bandwidth() -> None:
    from hetrl_cli.profiling.netbench import measure

    server = _serve(20)
    assert server.stdout is not None
    port = json.loads(server.stdout.readline())["port"]
    result = measure("127.0.0.3", port, "t0k3n", pings=5, max_bytes=4 << 20, max_seconds=5, timeout_s=10)
    assert server.wait(timeout=10) == 0
    assert result["bytes"] == 4 << 20 and result["pings"] == 5
    assert result["bandwidth_Bps"] > 1e6 and 0 < result["latency_s"] < 0.05


# ---- sampling, inference, overrides, units -----------------------------------------------------------------


def test_up_to_eight_hosts_every_pair_is_measured() -> None:
    entries = parse_hosts_text("".join(f"h{i}\n" for i in range(8)), "h.txt")
    assert len(choose_pairs(entries)) == 28


def test_beyond_eight_hosts_a_spanning_sample_covers_every_region_class() -> None:
    text = "".join(f"a{i} region=us\n" for i in range(6)) + "".join(f"b{i} region=eu\n" for i in range(4))
    entries = parse_hosts_text(text + "c0 region=ap\n", "h.txt")
    pairs = choose_pairs(entries)
    assert len(pairs) == 5 + 3 + 3  # chains inside us (6 hosts) and eu (4), one pair per region pair
    classes = {tuple(sorted((a.region, b.region))) for a, b in pairs}
    assert classes == {("us", "us"), ("eu", "eu"), ("eu", "us"), ("ap", "us"), ("ap", "eu")}
    parent = {e.name: e.name for e in entries}  # the measured pairs connect every host

    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n

    for a, b in pairs:
        parent[root(a.name)] = root(b.name)
    assert len({root(e.name) for e in entries}) == 1
    measured = {
        frozenset((a.name, b.name)): Link(
            a=a.name, b=b.name, bandwidth_Bps=1e9 if a.region == b.region else 1e8, latency_s=1e-4, kind=link_kind(a, b)
        )
        for a, b in pairs
    }
    inferred = infer_missing(entries, measured)
    assert len(inferred) + len(measured) == 55 and {lk.source for lk in inferred} == {"inferred"}
    cross = next(lk for lk in inferred if {lk.a, lk.b} == {"a3", "b2"})
    assert (cross.bandwidth_Bps, cross.kind) == (1e8, "wan")


def test_links_file_host_entries_beat_region_entries(tmp_path: Path) -> None:
    entries = parse_hosts_text("x1 region=us\nx2 region=us\ny1 region=eu\n", "h.txt")
    path = tmp_path / "links.yaml"
    path.write_text(
        "links:\n"
        "  - {a: region:us, b: region:eu, bandwidth: 1 Gbps, latency: 80ms}\n"
        "  - {a: y1, b: x2, bandwidth: 25 GB/s}\n"
        "  - {a: region:us, b: region:us, latency: 50us, kind: lan}\n"
    )
    overrides = load_link_overrides(path, entries)
    links, notes = apply_overrides([], overrides, entries, link_kind)
    got = {frozenset((lk.a, lk.b)): (lk.bandwidth_Bps, lk.latency_s, lk.kind, lk.source) for lk in links}
    assert got == {
        frozenset(("x1", "y1")): (125e6, 0.08, "wan", "override"),
        frozenset(("x2", "y1")): (25e9, 0.08, "wan", "override"),
    }
    assert notes == [
        "links file: 2 link(s) set from overrides",
        "links file: x1 <-> x2 has no measurement and the file gives only part",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "links:\n  - {a: x1, b: nope, bandwidth: 1Gbps}\n",
            "links.yaml:2: unknown host 'nope'; hosts.txt names: x1, x2",
        ),
        (
            "links:\n  - {a: x1, b: region:mars, latency: 1ms}\n",
            "links.yaml:2: unknown region 'region:mars'; regions in hosts.txt: default",
        ),
        (
            "links:\n  - a: x1\n    b: x2\n    bandwidth: fast\n",
            "links.yaml:2: bandwidth: bad bandwidth 'fast': "
            'expected "5Gbps", "100Mbps", "25 GB/s" or a number of bytes/s',
        ),
        ("links:\n  - {a: x1, b: x2}\n", "links.yaml:2: give bandwidth, latency or both"),
        (
            "links:\n  - {a: x1, b: x2, latency: 1ms, jitter: 2ms}\n",
            "links.yaml:2: unknown key 'jitter'; known keys: a, b, bandwidth, latency, kind",
        ),
        ("links: [\n", "links.yaml:2: not valid YAML"),
    ],
)
def test_links_file_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "links.yaml"
    path.write_text(text)
    with pytest.raises(BadInput) as err:
        load_link_overrides(path, parse_hosts_text("x1\nx2\n", "h.txt"))
    assert str(err.value) == message.replace("links.yaml", str(path))


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("5Gbps", 625e6),
        ("1 Gbps", 125e6),
        ("600GB/s", 600e9),
        ("25 GB/s", 25e9),
        ("100Mbps", 12.5e6),
        ("2.5e9", 2.5e9),
        (1e9, 1e9),
        (400, 400.0),
    ],
)
def test_parse_bandwidth(text: str | float, bps: float) -> None:
    assert parse_bandwidth(text, "w") == pytest.approx(bps)


@pytest.mark.parametrize(
    ("text", "seconds"), [("10ms", 0.01), ("50us", 5e-5), ("0.01s", 0.01), (0.002, 0.002), ("3", 3.0), ("500 ns", 5e-7)]
)
def test_parse_latency(text: str | float, seconds: float) -> None:
    assert parse_latency(text, "w") == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["fast", "5 Gb", "-3", "0", "5G", "", True])
def test_parse_bandwidth_rejects_with_where(bad: object) -> None:
    with pytest.raises(BadInput, match=r"^cluster\.yaml:4: (bad bandwidth|bandwidth must be positive)"):
        parse_bandwidth(bad, "cluster.yaml:4")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["soon", "10 minutes", "-1ms", "1e", float("nan")])
def test_parse_latency_rejects_with_where(bad: object) -> None:
    with pytest.raises(BadInput, match=r"^x:1: bad latency"):
        parse_latency(bad, "x:1")  # type: ignore[arg-type]


def test_remote_commands_quote_every_argument() -> None:
    assert remote_command(["~/venv/bin/python", "-m", "m", "a b", "$(id)", "`x`;y"]) == (
        "\"$HOME\"/venv/bin/python -m m 'a b' '$(id)' '`x`;y'"
    )
    assert remote_command(["/opt/py thon", "-c", "x"]) == "'/opt/py thon' -c x"
