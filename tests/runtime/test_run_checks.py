"""`hetrl run` checks before it starts, keeps its files private, and binds where it runs (issue 25).

- Bad model directories, datasets, seeds and plans whose memory does not fit end in one line and exit 2 (3 for
  memory) before any process starts or any file is written; before, the workers found them after the launch.
- A tiny model build stopped by SIGTERM leaves no temp dir, and a build killed outright is swept by the next.
- A real run (umask 0) leaves only 0700 folders and 0600 files, and everything it listens on is loopback
  (the torchrun store listened on every interface); across two hosts, on the hosts' own addresses.
- `hetrl show` of a run whose metrics.jsonl holds garbage skips the bad lines with one warning.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import load_artifact, save_artifact
from hetrl_cli.artifacts.profile import ClusterProfile
from hetrl_cli.artifacts.workload import ModelSpec
from hetrl_cli.runtime.rundir import RunDir
from hetrl_cli.runtime.tinymodel import cache_key

from .plans import (
    D0,
    GRPO_TASKS,
    disaggregated,
    hand_plan,
    on,
    run_processes,
    run_two_hosts,
    tiny_workload,
    two_host_plan,
)

HETRL = str(Path(sys.executable).with_name("hetrl"))
PROFILE = Path(__file__).resolve().parent.parent / "calibration" / "data" / "localhost-2cpu.json"


def single(**workload) -> object:
    return hand_plan(tiny_workload(**workload), on(D0, GRPO_TASKS), name="single")


def model_without_weights(tmp: Path) -> str:
    (tmp / "noweights").mkdir()
    (tmp / "noweights" / "config.json").write_text('{"model_type": "qwen2"}')
    return "noweights"


def garbage_dataset(tmp: Path) -> str:
    huge = "9" * 5000
    (tmp / "data.jsonl").write_text(f'{{"prompt": "1+1?", "answer": "2"}}\n{{"prompt": "2+2?", "answer": {huge}}}\n')
    return "data.jsonl"


BAD_INPUTS = {
    "model dir missing": (lambda t: single(actor=ModelSpec(path="nowhere")), "model path nowhere: no such"),
    "model dir without weights": (
        lambda t: single(actor=ModelSpec(arch="tiny", path=model_without_weights(t))),
        "model path noweights: no weights there",
    ),
    "model without a path": (lambda t: single(reference=ModelSpec(arch="qwen3-8b")), "model 'qwen3-8b' has no"),
    "dataset missing": (
        lambda t: single(dataset={"kind": "gsm8k-jsonl", "path": "none.jsonl"}),
        "none.jsonl: no such dataset file",
    ),
    "dataset line with a 5,000-digit number": (
        lambda t: single(dataset={"kind": "gsm8k-jsonl", "path": garbage_dataset(t)}),
        "data.jsonl:2: not a usable JSON line",
    ),
    "seed past numpy's range": (lambda t: single(seed=2**70), "seed 1180591620717411303424 is outside 0..4294967295"),
    "negative seed": (lambda t: single(seed=-1), "seed -1 is outside"),
}


def assert_refused(result: subprocess.CompletedProcess[str], code: int, expected: str, tmp: Path) -> None:
    """One line, the expected exit code, no traceback, and nothing written (no run directory at all)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("hetrl: error: ") and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp / "run").exists() and not (tmp / "runs").exists()


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_stop_before_the_launch(tmp_path: Path, case: str) -> None:
    make, expected = BAD_INPUTS[case]
    save_artifact(make(tmp_path), tmp_path / "plan.json")
    argv = [HETRL, "run", "plan.json", "--engine", "hf", "--steps", "1", "--run-dir", "run", "--timeout", "60s"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert_refused(result, 2, expected, tmp_path)


def oversized(profile: ClusterProfile) -> object:
    """The tiny model with a batch of 262,144 sequences in one micro-batch: ~800 GB on a 12 GB host."""
    plan = hand_plan(
        tiny_workload(prompts_per_step=4096, responses_per_prompt=64, micro_batch=262_144, max_prompt_tokens=256,
                      max_response_tokens=256),
        on(D0, GRPO_TASKS), name="oversized",
    )  # fmt: skip
    return plan.model_copy(update={"profile_fingerprint": profile.fingerprint or profile.compute_fingerprint()})


@pytest.mark.parametrize("how", ["--profile", "profiles/NAME.json"])
def test_memory_that_does_not_fit_is_refused_before_the_launch(tmp_path: Path, how: str) -> None:
    """Re-scored on the profile given, or the one `hetrl simulate` would find: exit 3 naming the device."""
    profile = load_artifact(PROFILE, ClusterProfile)
    save_artifact(oversized(profile), tmp_path / "plan.json")
    extra = ["--profile", str(PROFILE)] if how == "--profile" else []
    if how != "--profile":
        (tmp_path / "profiles").mkdir()
        shutil.copy(PROFILE, tmp_path / "profiles" / f"{profile.name}.json")
    argv = [HETRL, "run", "plan.json", "--engine", "hf", "--steps", "1", "--run-dir", "run", "--timeout", "20s"]
    result = subprocess.run([*argv, *extra], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert_refused(result, 3, "plan 'oversized' does not fit: localhost/0 needs", tmp_path)


def test_a_stopped_tiny_build_leaves_no_temp_dir(tmp_path: Path) -> None:
    """A build killed outright (SIGKILL) left `.tiny-*.XXXX`; the next build sweeps it, and a build stopped by
    SIGTERM (how runs stop workers) removes its own."""
    stale = tmp_path / f".{cache_key(0)}.killed1"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    code = "import sys; from hetrl_cli.runtime.tinymodel import ensure_tiny; ensure_tiny(sys.argv[1])"
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not [p for p in tmp_path.glob(f".{cache_key(0)}.*") if p.is_dir() and p != stale]:
            assert proc.poll() is None and time.monotonic() < deadline, "the build made no temp dir"
            time.sleep(0.05)
        time.sleep(0.5)  # well inside the build (its imports alone take seconds)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert not (tmp_path / cache_key(0)).exists()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def write_metrics(root: Path, lines: list[str]) -> Path:
    run = RunDir(root)
    run.logs.mkdir(parents=True)
    save_artifact(single(), run.plan)
    run.metrics.write_text("".join(line + "\n" for line in lines))
    return run.root


GOOD = [json.dumps({"step": s, "time": "2026-12-02T00:00:0{s}Z", "step_s": 0.5, "reward_mean": 0.1 * s,
                    "seconds": {"generation": 0.2}}) for s in (1, 2, 3)]  # fmt: skip


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_show_skips_garbage_metrics_lines_with_one_warning(tmp_path: Path, fmt: str) -> None:
    garbage = ["not json at all", '{"reward_mean": 1}', '{"step": 9, "step_s": 1e999}', '{"step": ' + "9" * 5000 + "}",
               '{"step": true}', '["step", 4]', '{"step": 4, "seconds": {"generation": "fast"}}', "[" * 100_000,
               '{"step": 5, "peak_memory_bytes": {"cpu/0": {"generation": -1}}}', '{"step": 1e400}']  # fmt: skip
    root = write_metrics(tmp_path / "run", [GOOD[0], *garbage, *GOOD[1:]])
    result = subprocess.run([HETRL, "show", str(root), "--format", fmt], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"warning: {root}/metrics.jsonl:2: not valid JSON; skipped {len(garbage)} lines that are not metrics lines, "
        "showing the rest"
    ]
    if fmt == "json":
        assert json.loads(result.stdout)["steps"] == [1, 2, 3]
    else:
        assert "3 logged" in result.stdout


def listening(run_dir: Path) -> list[str]:
    """`address:port` of every TCP listener of the run's processes (`ss -ltnp`, as a person would check)."""
    pids = set(run_processes(run_dir))
    table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    return [line.split()[3] for line in table.splitlines() if pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}]


def not_private(root: Path) -> list[str]:
    """Paths under `root` (itself included) that the group or others may read, write or enter."""
    paths = [root, *root.rglob("*")]
    return [f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p}" for p in paths if stat.S_IMODE(p.lstat().st_mode) & 0o077]


def run_until(argv: list[str], cwd: Path, ready: Path, deadline_s: float) -> tuple[list[str], int, str]:
    """Start `hetrl run` with umask 0 and SIGINT at its default, wait for `ready` to exist, note the run's
    listeners, then press Ctrl-C: (listeners, exit code, stderr)."""

    def child() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background shell would have it ignored

    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, umask=0,
                            preexec_fn=child)  # fmt: skip
    try:
        deadline = time.monotonic() + deadline_s
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"{ready} did not appear"
            time.sleep(0.2)
        time.sleep(0.5)
        found = listening(cwd / "run")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return found, proc.returncode, stderr


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one worker", "two workers"])
def test_a_run_is_private_and_listens_on_loopback(tmp_path: Path, layout: str) -> None:
    """One worker holds the store itself; two run under torchrun, whose agent holds it (it listened on `*`)."""
    plan = single() if layout == "one worker" else disaggregated(tiny_workload())
    save_artifact(plan, tmp_path / "plan.json")
    argv = [HETRL, "run", "plan.json", "--engine", "hf", "--steps", "1000", "--run-dir", str(tmp_path / "run"),
            "--checkpoint-every", "1"]  # fmt: skip
    found, code, stderr = run_until(argv, tmp_path, tmp_path / "run" / "checkpoints" / "latest", 120)
    assert code == 130, stderr[-3000:]
    print(f"{layout}: listening on {sorted(found)}")
    assert found, "the run listened on nothing"
    assert all(address.rsplit(":", 1)[0] == "127.0.0.1" for address in found), found
    assert not_private(tmp_path / "run") == []
    assert (tmp_path / "run" / "summary.json").exists() and any((tmp_path / "run" / "checkpoints").glob("step-*"))


@pytest.mark.slow
def test_multihost_run_is_private_and_listens_on_the_hosts_addresses(sshd_hosts, tmp_path: Path) -> None:
    """Across two sshd hosts (127.0.0.2 and .3): the store listens on the main host's address, nothing on every
    interface, and what the remote launches write is private too (they ran with sshd's umask)."""
    a, b = sshd_hosts.addresses[:2]
    two_host_plan(sshd_hosts, tiny_workload(), tmp_path)
    argv = [HETRL, "run", "plan.json", "--hosts", "hosts.txt", "--known-hosts", str(sshd_hosts.known_hosts),
            "--engine", "hf", "--steps", "1000", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    found, code, stderr = run_until(argv, tmp_path, tmp_path / "run" / "metrics.jsonl", 150)
    assert code == 130, stderr[-3000:]
    print(f"two hosts: listening on {sorted(found)}")
    hosts = {address.rsplit(":", 1)[0] for address in found}
    assert a in hosts, found  # the rendezvous store, on the main host's address
    assert hosts <= {a, b, "127.0.0.1"}, found  # gloo on the interface that reaches the main host (lo here)
    assert not_private(tmp_path / "run") == []


@pytest.mark.slow
def test_multihost_preflight_checks_the_model_directory_on_every_host(sshd_hosts, tmp_path: Path) -> None:
    workload = tiny_workload(actor=ModelSpec(arch="tiny", path=model_without_weights(tmp_path)))
    d0, d1 = two_host_plan(sshd_hosts, workload, tmp_path)
    result = run_two_hosts(sshd_hosts, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "preflight failed on 2 of 2 hosts; nothing launched" in result.stderr
    for host in (d0, d1):
        assert f"  {host.rsplit('/', 1)[0]}: actor: model path noweights: no weights there" in result.stderr
    assert not (tmp_path / "run").exists()
    assert os.listdir(tmp_path / "noweights") == ["config.json"]
