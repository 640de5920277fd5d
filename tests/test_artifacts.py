"""Every artifact survives save → load (files and `-` stdio), writes are atomic, bad loads fail with one exact
line, and the profile fingerprint depends on hardware facts only."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hetrl_cli.artifacts.base import Artifact
from hetrl_cli.artifacts.io import dump_artifact, load_artifact, parse_artifact, save_artifact, write_text_atomic
from hetrl_cli.artifacts.plan import Plan, PlanCost, Replica, SolverStats, TaskGroup, TaskPlan, TimelineEntry
from hetrl_cli.artifacts.profile import ClusterProfile, Device, Host, IntraLink, Link
from hetrl_cli.artifacts.run import RunSummary, TaskMeasurement
from hetrl_cli.artifacts.workload import Workload
from hetrl_cli.errors import BadInput

Hetrl = Callable[..., "subprocess.CompletedProcess[str]"]
"""The `hetrl` fixture from conftest.py: runs the real CLI."""


def sample_profile(**changes: object) -> ClusterProfile:
    hosts = [
        Host(
            name="a",
            address="10.0.0.1",
            region="us",
            software={"torch": "2.13.0", "vllm": None},
            intra_link=IntraLink(kind="nvlink", bandwidth_Bps=3e11, latency_s=3e-6, source="measured"),
        ),
        Host(name="b:2222", address="10.0.0.2", port=2222, user="ubuntu", region="eu", cpu_count=0.5),
    ]
    devices = [
        Device(
            id="a/0",
            host="a",
            index=0,
            kind="cuda",
            name="NVIDIA A100-SXM4-80GB",
            memory_bytes=80 * 2**30,
            peak_tflops={"bf16": 312.0},
            measured_tflops={"bf16": 250.5},
            memory_gbps=1800.0,
            peak_memory_gbps=2039.0,
            compute_capability="8.0",
        ),
        Device(
            id="a/1",
            host="a",
            index=1,
            kind="cuda",
            name="NVIDIA A100-SXM4-80GB",
            memory_bytes=80 * 2**30,
            measured_tflops={"bf16": 251.0},
            memory_gbps=1790.0,
        ),
        Device(
            id="b:2222/0",
            host="b:2222",
            index=0,
            kind="cpu",
            name="AMD EPYC",
            memory_bytes=24 * 2**30,
            measured_tflops={"fp32": 0.05},
            memory_gbps=20.0,
            cores=0.5,
        ),
    ]
    links = [Link(a="a", b="b:2222", bandwidth_Bps=1.25e8, latency_s=0.04, kind="wan", source="measured")]
    fields = {
        "name": "lab",
        "created_at": "2026-12-02T10:00:00+00:00",
        "method": "ssh-probe",
        "notes": ["n"],
        "hosts": hosts,
        "devices": devices,
        "links": links,
        **changes,
    }
    return ClusterProfile(**fields).with_fingerprint()  # type: ignore[arg-type]


def sample_plan() -> Plan:
    workload = Workload(name="tiny", actor={"arch": "tiny"}, prompts_per_step=4, responses_per_prompt=2)
    task = TaskPlan(
        task="generation",
        group="g0",
        tp=1,
        pp=1,
        dp=2,
        replicas=[
            Replica(stages=[["a/0"]], batch_share=0.5, layer_split=[2]),
            Replica(stages=[["a/1"]], batch_share=0.5, layer_split=[2]),
        ],
        memory_bytes={"a/0": 10**9},
    )
    return Plan(
        name="p",
        created_at="2026-12-02T10:00:00+00:00",
        profile_name="lab",
        profile_fingerprint="sha256:0123",
        workload=workload,
        groups=[TaskGroup(name="g0", tasks=["generation"], devices=["a/0", "a/1"])],
        tasks=[task],
        cost=PlanCost(
            iteration_s=1.5,
            samples_per_s=5.3,
            tokens_per_s=100.0,
            breakdown={"compute": 1.0},
            timeline=[TimelineEntry(name="generation", group="g0", start_s=0, end_s=1.5)],
            bottleneck="generation",
        ),
        solver=SolverStats(solver="ilp", status="optimal", objective=1.5, bound=1.5, gap=0.0, seconds=0.1),
    )


def sample_run() -> RunSummary:
    return RunSummary(
        run_id="r1",
        plan_name="p",
        profile_fingerprint="sha256:0123",
        steps=3,
        status="completed",
        started_at="2026-12-02T10:00:00+00:00",
        finished_at="2026-12-02T10:01:00+00:00",
        iteration=TaskMeasurement(task="iteration", predicted_s=1.5, measured_s=1.6, error=-0.0625),
        tasks=[TaskMeasurement(task="generation", measured_s=1.0, peak_memory_bytes=10**9)],
    )


SAMPLES: dict[str, Artifact] = {
    "cluster-profile": sample_profile(),
    "workload": Workload(),
    "plan": sample_plan(),
    "run-summary": sample_run(),
}


@pytest.mark.parametrize("kind", SAMPLES)
def test_round_trip_through_a_file(kind: str, tmp_path: Path) -> None:
    artifact = SAMPLES[kind]
    path = tmp_path / "deep" / "dir" / f"{kind}.json"
    save_artifact(artifact, path)
    assert load_artifact(path, type(artifact)) == artifact
    assert json.loads(path.read_text())["kind"] == kind
    assert path.read_text().endswith("}\n")
    assert sorted(p.name for p in path.parent.iterdir()) == [f"{kind}.json"]  # no temp file left


@pytest.mark.parametrize("kind", SAMPLES)
def test_round_trip_through_stdio(kind: str, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    artifact = SAMPLES[kind]
    save_artifact(artifact, "-")
    out = capsys.readouterr().out
    assert out == dump_artifact(artifact)
    monkeypatch.setattr(sys, "stdin", io.StringIO(out))
    assert load_artifact("-", type(artifact)) == artifact


@pytest.mark.slow
def test_cli_pipes_a_profile_from_stdin_hosts_to_stdout(hetrl: Hetrl, tmp_path: Path) -> None:
    piped = hetrl("profile", "-", "-o", "-", stdin="localhost\n", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    profile = parse_artifact(piped.stdout, ClusterProfile, "<stdout>")
    assert [h.name for h in profile.hosts] == ["localhost"] and profile.fingerprint
    assert piped.stdout == dump_artifact(profile)  # nothing but the artifact on stdout
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_old_file_and_no_temp_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "profile.json"
    target.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(target, "new \udc80 text")  # a lone surrogate cannot be encoded: fails mid-write
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_atomic_write_onto_a_directory_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "out.json").mkdir()
    with pytest.raises(OSError):
        save_artifact(Workload(), tmp_path / "out.json")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_wrong_kind_is_rejected() -> None:
    text = dump_artifact(sample_profile())
    with pytest.raises(BadInput) as err:
        parse_artifact(text, Plan, "plans/x.json")
    assert str(err.value) == "plans/x.json: is a 'cluster-profile' artifact, expected 'plan'"


def test_newer_schema_is_rejected() -> None:
    data = json.loads(dump_artifact(sample_run()))
    data["schema_version"] = 2
    with pytest.raises(BadInput) as err:
        parse_artifact(json.dumps(data), RunSummary, "runs/r1/summary.json")
    assert str(err.value) == (
        "runs/r1/summary.json: schema_version 2 is newer than this hetrl understands (1); upgrade hetrl"
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(bogus=1), "p.json: field 'bogus': Extra inputs are not permitted"),
        (
            lambda d: d["devices"][0].update(memory_bytes=0),
            "p.json: field 'devices.0.memory_bytes': Input should be greater than 0",
        ),
        (lambda d: d.update(schema_version="1"), "p.json: 'schema_version' must be a positive integer, got '1'"),
        (
            lambda d: d["links"][0].update(b="zz"),
            "p.json: field '(top level)': Value error, link a<->zz names an unknown host",
        ),
    ],
)
def test_invalid_profiles_fail_with_one_line(mutate, message: str) -> None:
    data = json.loads(dump_artifact(sample_profile()))
    mutate(data)
    with pytest.raises(BadInput) as err:
        parse_artifact(json.dumps(data), ClusterProfile, "p.json")
    assert str(err.value) == message


def test_not_json_names_line_and_column() -> None:
    with pytest.raises(BadInput) as err:
        parse_artifact('{\n  "kind": ,\n}', ClusterProfile, "p.json")
    assert str(err.value) == "p.json: not valid JSON (line 2, column 11: Expecting value)"


def test_fingerprint_ignores_measurements_timestamps_and_notes() -> None:
    base = sample_profile()
    remeasured = json.loads(dump_artifact(base))
    remeasured["created_at"] = "2027-01-01T00:00:00+00:00"
    remeasured["notes"] = ["other run"]
    remeasured["devices"][0]["measured_tflops"] = {"bf16": 199.0}
    remeasured["devices"][2]["memory_gbps"] = 25.0
    remeasured["links"][0].update(bandwidth_Bps=9e7, latency_s=0.05, source="override")
    remeasured["hosts"][0]["software"] = {"torch": "2.14.0"}
    again = ClusterProfile.model_validate(remeasured)
    assert again.compute_fingerprint() == base.fingerprint
    assert base.fingerprint.startswith("sha256:") and len(base.fingerprint) == len("sha256:") + 16


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["devices"][0].update(memory_bytes=40 * 2**30),
        lambda d: d["devices"][0].update(name="NVIDIA H100 80GB HBM3"),
        lambda d: d["hosts"][1].update(region="us"),
        lambda d: d["hosts"][1].update(status="missing"),
        lambda d: d.update(devices=d["devices"][:2]),
    ],
)
def test_fingerprint_changes_with_the_hardware(change) -> None:
    base = sample_profile()
    data = json.loads(dump_artifact(base))
    change(data)
    assert ClusterProfile.model_validate(data).compute_fingerprint() != base.fingerprint


def test_saving_into_a_fifo_writes_through_it_and_leaves_it_a_fifo(tmp_path: Path) -> None:
    """`-o /dev/null` or a named pipe: write into it; a temp file renamed over it would replace the node."""
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    save_artifact(Workload(), fifo)
    reader.join(timeout=10)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert json.loads(received[0])["kind"] == "workload"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
