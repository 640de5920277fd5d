"""Sharded checkpoints (runtime/checkpoint.py): written per rank as safetensors slices of canonical tensors with a
sealed JSON index; read back by any layout, slice by slice; never unpickled; refused, naming the file, when
altered; a failed write (ENOSPC) keeps the previous checkpoint and leaves no temp file.

Layouts are built by the runtime's own code (layout.TaskLayout -> comm.make_groups -> parallel.Parallel.of) over
real gloo process groups; `hetrl run` tests resume on one layout and on another.
"""

from __future__ import annotations

import datetime
import errno
import functools
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.plan import Plan
from hetrl_cli.artifacts.workload import RLSpec
from hetrl_cli.errors import BadInput, HetrlError
from hetrl_cli.runtime import checkpoint as ck
from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
from hetrl_cli.runtime.local import free_port
from hetrl_cli.runtime.roles import Actor, pad_rows
from hetrl_cli.runtime.rundir import RunDir, read_sealed_json, sealed_json

from .plans import D0, D1, GRPO_TASKS, disaggregated, hand_plan, on, replica, tiny_workload
from .test_distributed import _batch

ADAM = RLSpec(lr=1e-2, grad_clip=1e9, kl_coef=0.05)


def _update(actor: Actor, lo: int = 0, hi: int = 8, dp=(None, 1)) -> dict[str, float]:
    """One Adam step on sequences [lo, hi) of the fixed batch; -> the loss sums (before the step)."""
    rollouts, adv = _batch()
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(actor.logprobs(rollouts) or [[0.0]] * len(rollouts), steps)  # non-last stages: no log-probs
    ref = old - 0.1 * mask
    return actor.train_step(rollouts[lo:hi], (adv * mask)[lo:hi], old[lo:hi], ref[lo:hi], float(mask.sum()), dp)


def _trained(tiny_dir: Path, precision: str = "fp32") -> Actor:
    actor = Actor(tiny_dir, ADAM, "grpo", "adam", 1, pad_id=1, micro_batch=3, precision=precision)
    _update(actor)
    return actor


def _save(actor: Actor, root: Path, step: int = 1) -> Path:
    path = ck.save_checkpoint(RunDir(root), step, {"actor": actor}, {"training": {}}, rank=0, world=1)
    assert path is not None
    return path


def _assert_same_state(a: dict, b: dict) -> None:
    """Two read_full_state results hold the same tensors, bit for bit and dtype for dtype."""
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert tensor.dtype == b["model"][name].dtype and torch.equal(tensor, b["model"][name]), name
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for name, slots in a["optimizer"]["state"].items():
        assert slots.keys() == b["optimizer"]["state"][name].keys(), name
        for key, value in slots.items():
            other = b["optimizer"]["state"][name][key]
            assert value.dtype == other.dtype and torch.equal(value, other), (name, key)


# --- format, round trip ---------------------------------------------------------------------------------


def test_sealed_json_refuses_every_changed_byte() -> None:
    body = {"step": 3, "lr": 1e-08, "files": {"rank-00000.safetensors": {"bytes": 10}}}
    text = sealed_json(body)
    assert read_sealed_json(text) == (None, body)
    for at in range(len(text)):
        for flipped in (text[at].swapcase(), chr(ord(text[at]) ^ 1), " "):
            if flipped != text[at]:
                changed = text[:at] + flipped + text[at + 1 :]
                assert read_sealed_json(changed)[0] is not None, (at, flipped)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_round_trip_is_exact_and_reads_what_the_actor_holds(tiny_dir: Path, tmp_path: Path, precision: str) -> None:
    """The checkpoint holds what Actor.state() gathers (bf16 weights, fp32 masters and moments in bf16); loading
    it into a fresh actor restores weights and optimizer state bit for bit, and training on from it equals
    training on from the original."""
    actor = _trained(tiny_dir, precision)
    path = _save(actor, tmp_path)
    assert sorted(p.name for p in path.iterdir()) == ["index.json", "meta.json", "rank-00000.safetensors"]
    expected = actor.state()
    _assert_same_state(expected, ck.read_full_state(path, "actor"))
    weights = ck.read_full_role(path, "actor")
    assert weights.keys() == expected["model"].keys() and {t.dtype for t in weights.values()} == {
        torch.float32 if precision == "fp32" else torch.bfloat16
    }
    params, size = sum(t.numel() for t in weights.values()), (path / "rank-00000.safetensors").stat().st_size
    assert 1.0 <= size / (params * ck.state_bytes_per_param(precision, "adam")) < 1.01  # what multihost asks for
    fresh = Actor(tiny_dir, ADAM, "grpo", "adam", 1, pad_id=1, micro_batch=3, precision=precision)
    assert ck.load_checkpoint(path, {"actor": fresh}) == 1
    _assert_same_state(expected, fresh.state())
    assert _update(fresh) == _update(actor)
    _assert_same_state(actor.state(), fresh.state())


def test_checkpoint_every_zero_writes_none_and_default_writes_the_last(tmp_path: Path) -> None:
    """The launch manifest says what the CLI asked: no --checkpoint-every = after the last step only; 0 = none."""
    from hetrl_cli.runtime.api import RunOptions, prepare

    plan = disaggregated(tiny_workload())
    for every, expected in ((None, (0, True)), (0, (0, False)), (3, (3, True))):
        run = prepare(plan, RunOptions(run_dir=tmp_path / f"run{every}", checkpoint_every=every), "hf")
        manifest = json.loads(run.manifest.read_text())
        assert (manifest["checkpoint_every"], manifest["checkpoint_last"]) == expected


# --- what is refused ------------------------------------------------------------------------------------


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["meta.json", "index.json", "rank-00000.safetensors", "header"])
def test_a_flipped_byte_is_refused_naming_the_file(tiny_dir: Path, tmp_path: Path, name: str) -> None:
    path = _save(_trained(tiny_dir), tmp_path)
    target = path / ("rank-00000.safetensors" if name == "header" else name)
    _flip(target, 20 if name == "header" else None)  # "header": inside the safetensors JSON header
    with pytest.raises(ck.CheckpointError) as err:
        ck.find_resumable(RunDir(tmp_path))
    assert str(target) in str(err.value) and "\n" not in str(err.value)


class _Payload:
    """Unpickling this creates `marker`: a pickle that runs code when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _reseal(path: Path, name: str, data: bytes) -> None:
    """Replace `name` by `data` and fix every digest, as an attacker who can write the folder would."""
    (path / name).write_bytes(data)
    index = json.loads((path / "index.json").read_text())
    index.pop("sha256")
    index["files"][name] = {"sha256": ck._sha256(path / name), "bytes": len(data)}
    (path / "index.json").write_text(sealed_json(index))
    meta = json.loads((path / "meta.json").read_text())
    meta.pop("sha256")
    meta["index_sha256"] = ck._sha256(path / "index.json")
    (path / "meta.json").write_text(sealed_json(meta))


def _plant(source: Path, root: Path, name: str, payload: bytes) -> Path:
    """A copy of checkpoint `source` under root/checkpoints with `payload` placed as `name`; -> its folder."""
    path = root / "checkpoints" / source.name
    shutil.copytree(source.parent, path.parent)
    if name == "resealed":
        _reseal(path, "rank-00000.safetensors", payload)
    elif name == "actor.pt":  # the old format: one pickled file per role
        for other in path.iterdir():
            other.unlink()
        (path / "actor.pt").write_bytes(payload)
        (path / "meta.json").write_text(json.dumps({"step": 1}))
    else:
        (path / name).write_bytes(payload)
    return path


def test_a_crafted_pickle_in_any_checkpoint_file_does_not_run(tiny_dir: Path, tmp_path: Path) -> None:
    """A pickle that would create a marker file, placed as each file of the checkpoint (also with every digest
    fixed to match it, and as the pickled actor.pt of the old format): refused in one line, never run."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    assert b"system" in payload
    source = _save(_trained(tiny_dir), tmp_path / "source")
    for name in ("meta.json", "index.json", "rank-00000.safetensors", "resealed", "actor.pt"):
        root = tmp_path / name
        path = _plant(source, root, name, payload)
        fresh = Actor(tiny_dir, ADAM, "grpo", "adam", 1, pad_id=1, micro_batch=3)
        attempts = [
            functools.partial(ck.load_checkpoint, path, {"actor": fresh}),  # what a worker does
            functools.partial(ck.read_full_role, path, "actor"),  # what hetrl export does
        ]
        if name == "resealed":  # its digests match: the launcher's check passes, the safetensors reader refuses it
            assert ck.find_resumable(RunDir(root)).step == 1
        else:
            attempts.append(functools.partial(ck.find_resumable, RunDir(root)))
        for attempt in attempts:
            with pytest.raises(HetrlError) as err:  # CheckpointError, or BadInput where none is complete
                attempt()
            assert "\n" not in str(err.value), (name, str(err.value))
        assert not marker.exists(), name


def test_resume_without_a_complete_checkpoint_fails_or_falls_back_saying_which(tiny_dir: Path, tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(BadInput, match="no complete checkpoint to resume from"):
        ck.find_resumable(run)
    actor = _trained(tiny_dir)
    _save(actor, tmp_path, 1)
    _save(actor, tmp_path, 2)
    assert ck.find_resumable(run) == ck.Resumable(2, run.checkpoints / "step-000002")
    (run.checkpoints / "step-000002" / "meta.json").unlink()  # meta missing: the newest complete one, said so
    found = ck.find_resumable(run)
    assert (found.step, found.path.name) == (1, "step-000001")
    assert "names 'step-000002', which is not a complete checkpoint" in found.note and "step-000001" in found.note
    (run.checkpoints / "latest").unlink()  # latest missing
    assert ck.find_resumable(run).step == 1 and "latest is missing" in ck.find_resumable(run).note
    (run.checkpoints / "latest").write_text("\x00garbage\n")  # latest broken
    assert ck.find_resumable(run).step == 1
    (run.checkpoints / "step-000001" / "index.json").unlink()
    with pytest.raises(BadInput, match=r"no complete checkpoint to resume from \(.*latest names"):
        ck.find_resumable(run)


def test_resume_takes_another_layout_of_the_same_workload_only(tiny_dir: Path, tmp_path: Path) -> None:
    from .plans import colocated

    workload = tiny_workload()
    actor = _trained(tiny_dir)
    ck.save_checkpoint(RunDir(tmp_path), 1, {"actor": actor}, {"training": ck.training_identity(workload)}, 0, 1)
    relaid = colocated(tiny_workload(sharding="zero1", recompute=True, micro_batch=4, name="other"))
    assert ck.resume_point(relaid, tmp_path).step == 1
    for changed, field in ((tiny_workload(rl=RLSpec(lr=1e-3)), "rl"), (tiny_workload(precision="bf16"), "precision")):
        with pytest.raises(BadInput, match=f"trains another workload than step-000001 \\('{field}' differs\\)"):
            ck.resume_point(disaggregated(changed), tmp_path)


# --- ENOSPC ---------------------------------------------------------------------------------------------


def _assert_kept(root: Path, step: int, err: ck.CheckpointError) -> None:
    """The failed checkpoint left the previous one intact and no temp file, and said why in one line."""
    message = str(err)
    assert "\n" not in message and "No space left on device" in message, message
    assert f"checkpoint after step {step + 1} not written (kept step-{step:06d})" in message
    run = RunDir(root)
    assert [p.name for p in run.checkpoints.iterdir()] == ["latest", f"step-{step:06d}"] or sorted(
        p.name for p in run.checkpoints.iterdir()
    ) == ["latest", f"step-{step:06d}"]
    assert not [p for p in run.checkpoints.rglob("*") if ".tmp" in p.name]
    assert ck.find_resumable(run) == ck.Resumable(step, run.checkpoints / f"step-{step:06d}")


def test_enospc_from_the_writer_keeps_the_previous_checkpoint(tiny_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import safetensors.torch

    actor = _trained(tiny_dir)
    _save(actor, tmp_path, 1)
    real = safetensors.torch.save_file

    def full_disk(tensors, filename, metadata=None):
        real(dict(list(tensors.items())[:3]), filename, metadata)  # part of the file is on disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(ck.CheckpointError) as err:
        _save(actor, tmp_path, 2)
    _assert_kept(tmp_path, 1, err.value)


TORCHRUN_REPORT = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
hetrl_cli.runtime.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 3891)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 3892)
============================================================"""


def test_the_launcher_passes_on_no_torchrun_traceback() -> None:
    """torchrun's ChildFailedError report is not echoed (the launcher's last line names rank and cause); any
    other traceback of the launch is, whole."""
    from hetrl_cli.runtime.local import AgentReport

    shown: list[str] = []
    report = AgentReport(shown.append)
    other = ["Traceback (most recent call last):", '  File "x.py", line 1', "OSError: something else"]
    for line in ["[rank 1] worker failed: checkpoint after step 2 not written", *TORCHRUN_REPORT.splitlines(),
                 "after", *other]:  # fmt: skip
        report.line(line)
    report.flush()
    assert shown == ["[rank 1] worker failed: checkpoint after step 2 not written", "after", *other]


def test_without_a_shared_filesystem_the_checkpoint_is_skipped_with_a_warning(
    tiny_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A rank whose file rank 0 cannot see (another host's disk): no checkpoint, a warning, no staging folder,
    the previous checkpoint kept, and the run goes on (no error)."""
    actor = _trained(tiny_dir)
    _save(actor, tmp_path, 1)
    real = ck.write_part

    def elsewhere(staging: Path, rank: int, part: ck.RankPart) -> dict:
        report = real(staging, rank, part)
        (staging / report["file"]["name"]).unlink()  # written, but on a disk rank 0 does not share
        return report

    monkeypatch.setattr(ck, "write_part", elsewhere)
    assert ck.save_checkpoint(RunDir(tmp_path), 2, {"actor": actor}, {"training": {}}, rank=0, world=1) is None
    warning = capsys.readouterr().out
    assert "checkpoint after step 2 skipped (kept step-000001)" in warning and "shared filesystem" in warning
    assert sorted(p.name for p in RunDir(tmp_path).checkpoints.iterdir()) == ["latest", "step-000001"]


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 6 MiB tmpfs (one tiny checkpoint is ~4.2 MB): skipped where mounting needs a root we are not."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()[:100]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_enospc_on_a_full_tmpfs_keeps_the_previous_checkpoint(tiny_dir: Path, small_tmpfs: Path) -> None:
    actor = _trained(tiny_dir)
    _save(actor, small_tmpfs, 1)
    with pytest.raises(ck.CheckpointError) as err:
        _save(actor, small_tmpfs, 2)
    _assert_kept(small_tmpfs, 1, err.value)


# --- resharding over real process groups ------------------------------------------------------------------

LAYOUTS = {
    "tp2": ([((0, 1),)], (2,), "none"),
    "pp2": ([((0,), (1,))], (1, 1), "none"),
    "dp2-zero1": ([((0,),), ((1,),)], (2,), "zero1"),
    "tp2xpp2": ([((0, 1), (2, 3))], (1, 1), "none"),
    "dp2xtp2": ([((0, 1),), ((2, 3),)], (2,), "none"),
    "dp2-zero3": ([((0,),), ((1,),)], (2,), "zero3"),
}
FILES = {"tp2": 2, "pp2": 2, "dp2-zero1": 2, "tp2xpp2": 4, "dp2xtp2": 2, "dp2-zero3": 2}
"""Ranks that write: unsharded, replica 0's; with ZeRO every replica's (its optimizer partition or chunks)."""


def _task(shape: str) -> TaskLayout:
    grids, split, _ = LAYOUTS[shape]
    spans = [(0, 8)] if len(grids) == 1 else [(0, 3), (3, 8)]
    return TaskLayout("actor_train", tuple(ReplicaLayout(g, split, s) for g, s in zip(grids, spans, strict=True)))


def _reshard_worker(rank: int, port: int, shape: str, model_dir: str, source: str, out: str) -> None:
    """Layout `shape`: load the single-process checkpoint, write it again at once (step 1), train one step
    from it and write that (step 2); the loss sums go to out/sums-RANK.json."""
    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.parallel import Parallel, dp_group
    from hetrl_cli.runtime.sharding import zero_for

    task = _task(shape)
    world = len(task.ranks)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    kind = LAYOUTS[shape][2]
    groups = comm.make_groups(task.group_specs(zero=kind != "none"), 120)
    zero = zero_for(task, rank, groups, kind)
    actor = Actor(model_dir, ADAM, "grpo", "adam", 1, pad_id=1, micro_batch=3, parallel=Parallel.of(task, rank, groups),
                  zero=zero)  # fmt: skip
    assert ck.load_checkpoint(Path(source), {"actor": actor}) == 1
    run = RunDir(out)
    ck.save_checkpoint(run, 1, {"actor": actor}, {"training": {}}, rank, world)
    sums = _update(actor, *task.range_of(rank), dp_group(task, rank, groups))
    ck.save_checkpoint(run, 2, {"actor": actor}, {"training": {}}, rank, world)
    Path(out, f"sums-{rank}.json").write_text(json.dumps(sums if actor.shard.par.pos.output else {}))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(LAYOUTS))
def test_another_layout_reads_a_checkpoint_and_writes_it_back_bit_for_bit(
    tiny_dir: Path, tmp_path: Path, shape: str
) -> None:
    """(b) A (one process) -> B (`shape`) -> written again at once == A, every tensor bit for bit; (c) one step
    trained on B from A's checkpoint == the same step on A (same losses, weights and moments to fp rounding)."""
    actor = _trained(tiny_dir)
    source = _save(actor, tmp_path / "a")
    world = len(_task(shape).ranks)
    out = tmp_path / "b"
    mp.spawn(_reshard_worker, args=(free_port(), shape, str(tiny_dir), str(source), str(out)), nprocs=world, join=True)
    again = out / "checkpoints" / "step-000001"
    assert len(list(again.glob("rank-*.safetensors"))) == FILES[shape]
    _assert_same_state(ck.read_full_state(source, "actor"), ck.read_full_state(again, "actor"))
    ck.verify(again)

    expected_sums = _update(actor)
    sums = [json.loads((out / f"sums-{r}.json").read_text()) for r in range(world)]
    got = {k: sum(s.get(k, 0.0) for s in sums) for k in ("pg_loss_sum", "kl_sum", "tokens")}
    assert got == pytest.approx({k: expected_sums[k] for k in got}, rel=1e-5, abs=1e-6)
    trained, expected = ck.read_full_state(out / "checkpoints" / "step-000002", "actor"), actor.state()
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(trained["model"][name], tensor, rtol=1e-3, atol=2e-4)  # Adam: lr 1e-2 a step
    for name, slots in expected["optimizer"]["state"].items():
        for key, value in slots.items():
            torch.testing.assert_close(trained["optimizer"]["state"][name][key], value, rtol=1e-3, atol=1e-6)


# --- hetrl run --------------------------------------------------------------------------------------------

HETRL = str(Path(sys.executable).with_name("hetrl"))
DETERMINISTIC = ("reward_mean", "reward_std", "pg_loss", "kl", "kl_ref_k3", "clip_frac", "grad_norm",
                 "response_tokens", "response_length_mean")  # fmt: skip
"""Metrics a step computes (not times): bit for bit equal between runs of the same layout and weights."""


def _tp2(workload) -> Plan:
    """Layout B: actor_train and reference TP 2 over both devices; generation and reward on device 0."""
    tp = [replica([[D0, D1]])]
    return hand_plan(workload, {"generation": [(D0, 1.0)], "reward": [(D0, 1.0)], "reference": tp,
                                "actor_train": tp}, name="tp2")  # fmt: skip


def _run(plan: Plan, tmp_path: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    plan_file = tmp_path / f"{plan.name}.json"
    save_artifact(plan, plan_file)
    where = ["--resume", str(run_dir)] if "--resume" in args else ["--run-dir", str(run_dir)]
    argv = [HETRL, "run", str(plan_file), "--engine", "hf", *where, *(a for a in args if a != "--resume")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _computed(lines: list[dict]) -> list[dict]:
    return [{k: m[k] for k in DETERMINISTIC} for m in lines]


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.mark.slow
def test_resume_on_its_own_layout_is_bit_for_bit_the_uninterrupted_run(tmp_path: Path) -> None:
    """(a) Layout B (TP 2): 2 steps, then --resume to 3 == 3 steps without a stop: every metric a step computes
    and every tensor of the final checkpoint (weights, moments, step counts), bit for bit."""
    plan = _tp2(tiny_workload())
    _ok(_run(plan, tmp_path, tmp_path / "whole", "--steps", "3"))
    _ok(_run(plan, tmp_path, tmp_path / "halves", "--steps", "2"))
    assert "resuming after step 2" in _ok(_run(plan, tmp_path, tmp_path / "halves", "--resume", "--steps", "3"))
    whole, halves = _metrics(tmp_path / "whole"), _metrics(tmp_path / "halves")
    assert [m["step"] for m in halves] == [1, 2, 3]
    assert _computed(halves) == _computed(whole)
    last = Path("checkpoints", "step-000003")
    _assert_same_state(ck.read_full_state(tmp_path / "whole" / last, "actor"),
                       ck.read_full_state(tmp_path / "halves" / last, "actor"))  # fmt: skip


@pytest.mark.slow
def test_resume_onto_another_layout_continues_the_run(tmp_path: Path) -> None:
    """(c) A (one device) 2 steps, resumed on B (TP 2 over two devices) to step 3 == A's own 3 steps, to fp
    rounding (TP sums in another order); the run keeps A's plan as plan.until-step-000002.json. A plan of
    another workload is refused in one line, before anything is written."""
    workload = tiny_workload()
    single = hand_plan(workload, on(D0, GRPO_TASKS), name="single")
    _ok(_run(single, tmp_path, tmp_path / "whole", "--steps", "3"))
    run_dir = tmp_path / "moved"
    _ok(_run(single, tmp_path, run_dir, "--steps", "2"))
    other = _run(_tp2(tiny_workload(rl=RLSpec(lr=1e-3, critic_lr=3e-3, kl_coef=0.001))), tmp_path, run_dir,
                 "--resume", "--steps", "3")  # fmt: skip
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert "trains another workload than step-000002 ('rl' differs)" in other.stderr
    stderr = _ok(_run(_tp2(workload), tmp_path, run_dir, "--resume", "--steps", "3"))
    assert "resuming after step 2" in stderr
    assert json.loads((run_dir / "plan.until-step-000002.json").read_text())["name"] == "single"
    assert json.loads((run_dir / "plan.json").read_text())["name"] == "tp2"
    moved, whole = _metrics(run_dir), _metrics(tmp_path / "whole")
    assert [m["step"] for m in moved] == [1, 2, 3]
    assert _computed(moved[:2]) == _computed(whole[:2])
    for key in DETERMINISTIC:
        assert moved[2][key] == pytest.approx(whole[2][key], rel=1e-4, abs=1e-6), key
    last = Path("checkpoints", "step-000003")
    mine, theirs = ck.read_full_role(run_dir / last, "actor"), ck.read_full_role(tmp_path / "whole" / last, "actor")
    for name, tensor in theirs.items():
        torch.testing.assert_close(mine[name], tensor, rtol=1e-3, atol=2e-4)


@pytest.mark.slow
def test_resume_without_a_checkpoint_fails_in_one_line(tmp_path: Path) -> None:
    """--checkpoint-every 0 writes none; a --resume of that run exits 2 in one line and runs no step again."""
    plan = disaggregated(tiny_workload())
    _ok(_run(plan, tmp_path, tmp_path / "run", "--steps", "1", "--checkpoint-every", "0"))
    assert not any((tmp_path / "run" / "checkpoints").glob("*"))
    resumed = _run(plan, tmp_path, tmp_path / "run", "--resume", "--steps", "2")
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "no complete checkpoint to resume from" in resumed.stderr
    assert [m["step"] for m in _metrics(tmp_path / "run")] == [1]


@pytest.mark.slow
def test_a_full_disk_ends_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path: Path, small_tmpfs: Path) -> None:
    """The run's checkpoints on a 6 MiB tmpfs: step 1's fits, step 2's does not: the run fails naming the cause,
    step-000001 stays complete, no temp file is left, and nothing prints a traceback."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(small_tmpfs, run_dir / "checkpoints")
    result = _run(disaggregated(tiny_workload()), tmp_path, run_dir, "--steps", "3", "--checkpoint-every", "1")
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]
    assert "No space left on device" in last and "checkpoint after step 2 not written (kept step-000001)" in last
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["latest", "step-000001"]
    assert not [p for p in small_tmpfs.rglob("*") if ".tmp" in p.name]
    assert ck.find_resumable(RunDir(run_dir)).step == 1
