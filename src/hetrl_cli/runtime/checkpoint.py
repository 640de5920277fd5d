"""Sharded, checksummed checkpoints of the trained roles (actor, critic), readable by any layout.

```
checkpoints/step-000010/
  rank-00003.safetensors   what rank 3 holds that no other rank writes: slices of canonical tensors
  index.json               every tensor: full shape, dtype, its pieces (file, offsets, shape); every file's
                           sha256 and size; the optimizer's param groups, the loss scaler, non-tensor state
  meta.json                step, run, the training identity (the workload less its layout knobs), index digest
```

Keys are `<role>/model/<canonical name>` and `<role>/optim/<canonical name>/<state key>` (exp_avg, exp_avg_sq,
master, step, momentum_buffer): canonical names and full shapes as parallel.py defines them, so a plan of
another shape (devices, TP/PP/DP, ZeRO) reads the same checkpoint. Who writes what (no duplicates):
- weights: replica 0's ranks, each the tensors it `owns` (parallel.Shard.owned: first stage holding it, TP
  index 0 for whole tensors, the first of the ranks sharing a replicated KV head), TP slices as they are held;
- optimizer state: as it is held. Unsharded, replica 0's ranks write it next to their weights; with ZeRO every
  rank of every replica writes the partition it steps (no consolidation, no gather: each rank writes in
  parallel). Masters and moments are fp32; weights are in the run's precision.
Each rank writes its file into the staging folder `.step-N.tmp`; rank 0 checks every rank's report, writes
index.json and meta.json and renames the folder into place (rundir.finalize_checkpoint); the previous complete
checkpoint stays until then. A failed write (ENOSPC) removes the staging folder on every rank's word and ends
the run with one line naming the cause.

Reading never unpickles: JSON and safetensors only; `index.json` and `meta.json` carry their own sha256 (over
their canonical text), data files are checked against the index. Each rank reads only the slices it holds
(safetensors get_slice). No RNG state is kept: sampling seeds are a function of (seed, step, sequence) and the
models run without dropout, so a resumed step draws what an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.errors import BadInput, HetrlError, one_line
from hetrl_cli.runtime.rundir import RunDir, now_iso, read_sealed_json, sealed_json

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.artifacts.workload import Workload

ROLES = ("actor", "critic")
FORMAT = "hetrl-checkpoint"
VERSION = 2
INDEX, META = "index.json", "meta.json"
FILE_NAME = re.compile(r"rank-\d{5}\.safetensors")
DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "uint8", "bool")
"""The tensor dtypes an index may name (a name outside them is refused, never looked up blindly)."""
LAYOUT_FIELDS = ("kind", "schema_version", "name", "sharding", "recompute", "micro_batch", "response_length")
"""Workload fields a plan may change on resume: how the same training is laid out, not what it computes."""
HASH_CHUNK = 8 << 20


class CheckpointError(HetrlError):
    """A checkpoint that cannot be written or read: the message names the file and the cause (one line)."""


# --- what one rank writes -------------------------------------------------------------------------------


@dataclass
class Piece:
    """One slice of a canonical tensor: `offsets` of its first element in the full tensor."""

    key: str
    tensor: Tensor
    full_shape: tuple[int, ...]
    offsets: tuple[int, ...]


@dataclass
class RankPart:
    """What one rank holds of the checkpoint: tensor pieces and small JSON values, by key."""

    pieces: list[Piece] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


def _offsets(shard: Any, name: str, ndim: int) -> tuple[int, ...]:
    offsets = [0] * ndim
    sl = shard.slices.get(shard.par.pos.tp_rank, {}).get(name)
    if sl is not None:
        offsets[sl[0]] = sl[1]
    return tuple(offsets)


def _json_value(value: Any) -> Any:
    """Optimizer hyper-parameters and non-tensor state as JSON (tuples become lists)."""
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    raise CheckpointError(f"optimizer state value of type {type(value).__name__} has no JSON form")


def _optimizer_state(trainer: Any, param: Any) -> dict[str, Any]:
    """The optimizer state of one held parameter, with a master still waiting for its first step."""
    from hetrl_cli.runtime.sharding import inner_optimizer

    inner = inner_optimizer(trainer.optimizer)
    state = dict(inner.state.get(param, {}))
    pending = getattr(inner, "pending", None) or {}
    if "master" not in state and id(param) in pending:
        state["master"] = pending[id(param)]
    return state


def role_part(role: str, trainer: Any) -> RankPart:
    """The unique part of `role` (Actor or Critic) this rank holds: see the module docstring for who writes what."""
    shard = trainer.shard
    part = RankPart()
    if hasattr(shard, "checkpoint_pieces"):  # zero3: each rank's chunks, as boxes of the canonical tensors
        for name, key, tensor, offsets in shard.checkpoint_pieces(trainer.optimizer):
            slot = f"{role}/model/{name}" if key is None else f"{role}/optim/{name}/{key}"
            part.pieces.append(Piece(slot, tensor.detach(), shard.full_shapes[name] if offsets else (), offsets))
    else:
        _held_part(role, trainer, part)
    pos = shard.par.pos
    if pos.replica == 0 and pos.stage == 0 and pos.tp_rank == 0:
        groups = [{k: _json_value(v) for k, v in g.items() if k != "params"} for g in trainer.optimizer.param_groups]
        part.values[f"{role}/param_groups"] = groups
        scaler = trainer.scaler
        part.values[f"{role}/scaler"] = {"scale": scaler.scale, "clean_steps": scaler.clean_steps,
                                         "skipped": scaler.skipped}  # fmt: skip
    return part


def _held_part(role: str, trainer: Any, part: RankPart) -> None:
    """Weights (replica 0) and optimizer state (replica 0, or with ZeRO-1/2 every rank's partition) of the
    parameters this rank owns (parallel.Shard.owned), as the slices it holds."""
    from torch import Tensor

    from hetrl_cli.runtime.sharding import local_params

    shard, zero = trainer.shard, trainer.zero
    leader = shard.par.pos.replica == 0
    sharded = zero is not None and zero.active
    stepped_here = {id(p) for p in local_params(trainer.optimizer)}
    for name, param in shard.held:
        if not shard.owned(name):
            continue
        full, offsets = shard.full_shapes[name], _offsets(shard, name, param.dim())
        if leader:
            part.pieces.append(Piece(f"{role}/model/{name}", param.detach(), full, offsets))
        if not ((sharded and id(param) in stepped_here) or (not sharded and leader)):
            continue
        for key, value in _optimizer_state(trainer, param).items():
            slot = f"{role}/optim/{name}/{key}"
            if isinstance(value, Tensor) and value.dim() > 0:
                part.pieces.append(Piece(slot, value.detach(), full, offsets))
            elif isinstance(value, Tensor):
                if not any(offsets):  # a scalar (Adam's step) once per tensor: by the rank of its first slice
                    part.pieces.append(Piece(slot, value.detach(), (), ()))
            else:
                part.values[slot] = _json_value(value)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_part(staging: Path, rank: int, part: RankPart) -> dict[str, Any]:
    """Write this rank's pieces as one safetensors file (via a temp file, fsynced); -> its report for the index.
    An OSError leaves no temp file behind and comes back as the report's `error`."""
    report: dict[str, Any] = {"rank": rank, "values": part.values, "entries": [], "file": None, "error": None}
    if not part.pieces:
        return report
    import safetensors.torch
    from safetensors import SafetensorError

    name = f"rank-{rank:05d}.safetensors"
    tmp, final = staging / f".{name}.tmp", staging / name
    try:
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)  # on a host that does not share rank 0's folder
    except OSError as exc:
        report["error"] = f"rank {rank}: {exc.strerror or exc} creating {staging}"
        return report
    stored = [f"{p.key}#{n}" for n, p in enumerate(part.pieces)]  # zero3: several boxes of one tensor
    tensors, storages = {}, set()
    for key, piece in zip(stored, part.pieces, strict=True):
        tensor = piece.tensor.to("cpu").contiguous()
        if tensor.untyped_storage().data_ptr() in storages:  # views of one buffer (zero3 chunks, a shared step)
            tensor = tensor.clone()
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[key] = tensor
    try:
        safetensors.torch.save_file(tensors, str(tmp), metadata={"format": FORMAT})
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except (OSError, SafetensorError) as exc:  # the Rust writer reports ENOSPC as a SafetensorError
        tmp.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).removeprefix("Error while ")
        report["error"] = f"rank {rank}: {cause} writing {final}"
        return report
    report["file"] = {"name": name, "sha256": _sha256(final), "bytes": final.stat().st_size}
    report["entries"] = [
        {"key": p.key, "stored": k, "full_shape": list(p.full_shape), "offsets": list(p.offsets),
         "shape": list(p.tensor.shape), "dtype": str(p.tensor.dtype).removeprefix("torch.")}
        for k, p in zip(stored, part.pieces, strict=True)
    ]  # fmt: skip
    return report


def build_index(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """index.json from every rank's report: files with digests, tensors with their pieces, JSON values."""
    files: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for rep in reports:
        values.update(rep["values"])
        if rep["file"] is None:
            continue
        name = rep["file"]["name"]
        files[name] = {"sha256": rep["file"]["sha256"], "bytes": rep["file"]["bytes"]}
        for e in rep["entries"]:
            entry = tensors.setdefault(e["key"], {"shape": e["full_shape"], "dtype": e["dtype"], "pieces": []})
            entry["pieces"].append({"file": name, "key": e["stored"], "offsets": e["offsets"], "shape": e["shape"]})
    return {"format": FORMAT, "version": VERSION, "files": files, "tensors": tensors, "values": values}


# --- the collective write -------------------------------------------------------------------------------


def _all_gather(obj: Any, world: int) -> list[Any]:
    import torch.distributed as dist

    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _broadcast(obj: Any, world: int) -> Any:
    import torch.distributed as dist

    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_checkpoint(run: RunDir, step: int, trainers: dict[str, Any], meta: dict[str, Any], rank: int,
                    world: int) -> Path | None:  # fmt: skip
    """Collective over the world: every rank writes its part in parallel, rank 0 seals and renames. Raises
    CheckpointError on every rank (one line, the first cause) when any part fails; the staging folder is gone
    and the previous checkpoint untouched. None (and a warning) when rank 0 cannot see another host's files:
    without a shared filesystem a checkpoint cannot be assembled, and the run goes on without it."""
    staging = run.checkpoints / f".step-{step:06d}.tmp"
    error = None
    if rank == 0:
        _clean_staging(run)  # a killed run's half-written folders
        try:
            staging.mkdir(mode=0o700, parents=True)
        except OSError as exc:
            error = f"{exc.strerror or exc} creating {staging}"
    error = _broadcast(error, world)
    if error is None:
        part = RankPart()
        for role, trainer in trainers.items():
            mine = role_part(role, trainer)
            part.pieces += mine.pieces
            part.values.update(mine.values)
        report = write_part(staging, rank, part)
    else:
        report = {"error": error}
    reports = _all_gather(report, world)
    failed = next((r["error"] for r in reports if r["error"]), None)
    unseen = None
    if rank == 0 and failed is None:
        unseen = _unseen(staging, reports)
        failed = None if unseen else _seal(run, staging, step, reports, meta)
    failed, unseen = _broadcast((failed, unseen), world)
    if not (failed or unseen):
        return run.checkpoints / f"step-{step:06d}"
    shutil.rmtree(staging, ignore_errors=True)  # every rank: no temp files left on any host
    after = _kept(run)
    if failed:
        raise CheckpointError(f"checkpoint after step {step} not written ({after}): {failed}")
    if rank == 0:
        print(f"hetrl: warning: checkpoint after step {step} skipped ({after}): {unseen}", flush=True)
    return None


def _kept(run: RunDir) -> str:
    """Which checkpoint a failed one leaves in place, for the one-line message."""
    try:
        kept = run.latest_checkpoint()
    except (OSError, ValueError, KeyError, TypeError):
        kept = None
    return f"kept {kept[1].name}" if kept else "no earlier checkpoint"


def _clean_staging(run: RunDir) -> None:
    for stale in run.checkpoints.glob(".step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def _unseen(staging: Path, reports: list[dict[str, Any]]) -> str | None:
    """Why rank 0 cannot assemble the checkpoint: a rank's file it does not see (another host's disk)."""
    for rep in reports:
        name = rep["file"]["name"] if rep["file"] is not None else None
        if name is not None and not (staging / name).is_file():
            return f"{name} of rank {rep['rank']} is not on rank 0's host (checkpoints need a shared filesystem)"
    return None


def _seal(run: RunDir, staging: Path, step: int, reports: list[dict[str, Any]], meta: dict[str, Any]) -> str | None:
    """Rank 0: index.json and meta.json into the staging folder, then rename it into place; -> the error, if any."""
    index = build_index(reports)
    try:
        _write_new(staging / INDEX, sealed_json(index))
        body = dict(meta, step=step, format=FORMAT, version=VERSION, written_at=now_iso(),
                    index_sha256=_sha256(staging / INDEX))  # fmt: skip
        run.finalize_checkpoint(step, body)
    except OSError as exc:
        return f"{exc.strerror or exc} sealing {staging}"
    return None


def _write_new(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


# --- finding and checking a checkpoint --------------------------------------------------------------------


def _step_of(path: Path) -> int | None:
    match = re.fullmatch(r"step-(\d{6,})", path.name)
    return int(match.group(1)) if match else None


def read_json_file(path: Path) -> dict[str, Any]:
    """A sealed JSON file of a checkpoint; CheckpointError naming it when it is missing, altered or not JSON."""
    if path.exists() and not path.is_file():  # a folder, a link to /dev/zero or a FIFO: reading would not end
        raise CheckpointError(f"{path}: not a regular file; the checkpoint is corrupt")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text; the checkpoint is corrupt") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable ({exc.strerror or 'an I/O error'})") from None
    problem, body = read_sealed_json(text)
    if problem:
        raise CheckpointError(f"{path}: {problem}; the checkpoint is corrupt")
    return body


def verify(path: Path) -> dict[str, Any]:
    """Check a checkpoint end to end (sealed meta and index, every file's size and sha256); -> its meta."""
    if (path / "actor.pt").exists() and not (path / INDEX).exists():
        raise CheckpointError(f"{path}: written by an older hetrl (pickled actor.pt); it cannot be resumed safely")
    meta = read_json_file(path / META)
    index = read_json_file(path / INDEX)
    if meta.get("format") != FORMAT or meta.get("version") != VERSION or meta.get("step") != _step_of(path):
        raise CheckpointError(f"{path / META}: not a version {VERSION} {FORMAT} of step {_step_of(path)}")
    if meta.get("index_sha256") != _sha256(path / INDEX):
        raise CheckpointError(f"{path / INDEX}: does not match meta.json's digest; the checkpoint is corrupt")
    for name, info in _files(index, path).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing; the checkpoint is incomplete")
        if file.stat().st_size != info.get("bytes") or _sha256(file) != info.get("sha256"):
            raise CheckpointError(f"{file}: checksum mismatch; the checkpoint is corrupt")
    return meta


def _files(index: dict[str, Any], path: Path) -> dict[str, Any]:
    files = index.get("files")
    if not isinstance(files, dict) or not all(isinstance(n, str) and FILE_NAME.fullmatch(n) for n in files):
        raise CheckpointError(f"{path / INDEX}: names files outside the checkpoint's rank-NNNNN.safetensors")
    if not all(isinstance(info, dict) for info in files.values()):
        raise CheckpointError(f"{path / INDEX}: a file without its size and sha256; the checkpoint is corrupt")
    return files


@dataclass
class Resumable:
    step: int
    path: Path
    note: str | None = None
    """Why this is not what `latest` names (a fallback), for the launcher to print."""


def _complete(path: Path) -> bool:
    try:
        return (path / META).is_file() and (path / INDEX).is_file()
    except OSError:  # a name too long for the filesystem (a hand-edited `latest`)
        return False


def find_resumable(run: RunDir, flag: str = "--resume") -> Resumable:
    """The checkpoint to resume from: the one `latest` names, else the newest complete one (with a note saying
    why); verified end to end. BadInput when there is none, CheckpointError (naming the file) when it is corrupt."""
    folder = run.checkpoints
    pointer = folder / "latest"
    named, why = None, f"{pointer} is not a regular file"
    try:
        if not pointer.exists() or pointer.is_file():  # never a link to /dev/zero or a FIFO: it would not end
            named = pointer.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        why = f"{pointer} is missing"
    except (OSError, UnicodeDecodeError):
        why = f"{pointer} is unreadable"
    if named is not None:
        target = folder / named
        if re.fullmatch(r"step-\d{6,}", named) and _complete(target):
            _verified(target)
            return Resumable(_step_of(target) or 0, target)
        why = f"{pointer} names '{named[:40]}', which is not a complete checkpoint (no meta.json)"
    found = sorted((p for p in folder.glob("step-*") if _step_of(p) is not None and _complete(p)), key=_step_of)
    if not found:
        raise BadInput(f"{flag} {run.root}: no complete checkpoint to resume from ({why}); nothing was started")
    newest = found[-1]
    _verified(newest)
    return Resumable(_step_of(newest) or 0, newest, f"{why}; resuming from the newest complete one, {newest.name}")


def resume_point(plan: Plan, root: Path) -> Resumable:
    """The verified checkpoint `--resume root` continues from with `plan`: any plan of the same training (other
    devices, TP/PP/DP, ZeRO); BadInput naming the first differing workload field otherwise."""
    found = find_resumable(RunDir(root))
    saved = read_json_file(found.path / META).get("training")
    differs = identity_mismatch(saved, plan.workload) if isinstance(saved, dict) else "training"
    if differs:
        raise BadInput(
            f"--resume {root}: plan '{plan.name}' trains another workload than {found.path.name} ('{differs}' "
            "differs); pass a plan made for the same workload (only devices, TP/PP/DP, sharding, recompute and "
            "micro_batch may change)"
        )
    return found


def _verified(path: Path) -> None:
    try:
        verify(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; move {path} away to resume from an earlier checkpoint") from None


def training_identity(workload: Workload) -> dict[str, Any]:
    """What a resumed plan's workload must share with the checkpoint's: the workload less its layout knobs."""
    data = workload.model_dump(mode="json")
    return {k: v for k, v in sorted(data.items()) if k not in LAYOUT_FIELDS}


def identity_mismatch(saved: dict[str, Any], workload: Workload) -> str | None:
    """The first field in which `workload` trains something else than the checkpoint, or None."""
    mine = training_identity(workload)
    for key in sorted(set(saved) | set(mine)):
        if saved.get(key) != mine.get(key):
            return key
    return None


# --- reading --------------------------------------------------------------------------------------------


def _dims(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**48
                                           for n in value)  # fmt: skip


def _check_tensors(index: dict[str, Any], where: Path) -> None:
    """The shape of an index's `tensors` and `values` (a resealed index can hold anything): CheckpointError naming
    the first entry that is not {shape, dtype, pieces: [{file, key, offsets, shape}]} of lists of sizes."""
    tensors, values = index.get("tensors", {}), index.get("values", {})
    if not isinstance(tensors, dict) or not isinstance(values, dict):
        raise CheckpointError(f"{where}: 'tensors' and 'values' must be objects; the checkpoint is corrupt")
    for key, entry in tensors.items():
        pieces = entry.get("pieces") if isinstance(entry, dict) else None
        if not (isinstance(pieces, list) and _dims(entry.get("shape")) and all(
                isinstance(p, dict) and isinstance(p.get("file"), str) and isinstance(p.get("key"), str)
                and _dims(p.get("offsets")) and _dims(p.get("shape")) for p in pieces)):  # fmt: skip
            raise CheckpointError(f"{where}: tensor {one_line(key, 80)} is not described as hetrl writes it; "
                                  "the checkpoint is corrupt")  # fmt: skip


class Reader:
    """Reads regions of canonical tensors from a checkpoint's files (safetensors, slices only)."""

    def __init__(self, path: Path, index: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.index = index if index is not None else read_json_file(self.path / INDEX)
        _check_tensors(self.index, self.path / INDEX)
        self.tensors: dict[str, Any] = self.index.get("tensors", {})
        self.values: dict[str, Any] = self.index.get("values", {})
        self.files = _files(self.index, self.path)
        try:
            self.total_bytes = sum(int(info["bytes"]) for info in self.files.values())
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{self.path / INDEX}: a file without its size") from None
        self._open: dict[str, Any] = {}

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self.files:
            raise CheckpointError(f"{self.path / INDEX}: a piece names {name[:60]!r}, which it does not list")
        if name not in self._open:
            try:
                self._open[name] = safe_open(str(self.path / name), framework="pt").__enter__()
            except Exception as exc:
                raise CheckpointError(f"{self.path / name}: not a safetensors file ({type(exc).__name__})") from None
        return self._open[name]

    def _read(self, piece: dict[str, Any], box: tuple[slice, ...] | None) -> Tensor:
        """A stored piece, whole (`box` None) or the box of it."""
        source, stored = self._handle(piece["file"]), str(piece["key"])
        try:
            return source.get_tensor(stored) if box is None else source.get_slice(stored)[box]
        except Exception as exc:  # a key or box the file does not hold
            raise CheckpointError(f"{self.path / piece['file']}: no {stored[:80]} ({type(exc).__name__})") from None

    def shape(self, key: str) -> tuple[int, ...] | None:
        entry = self.tensors.get(key)
        return None if entry is None else tuple(entry["shape"])

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.tensors if k.startswith(prefix)]

    def full(self, key: str) -> Tensor:
        shape = self.shape(key)
        assert shape is not None
        return self.region(key, (0,) * len(shape), shape)

    def region(self, key: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
        """Elements [offsets, offsets + shape) of canonical tensor `key`, read from the pieces that cover them."""
        import torch

        entry = self.tensors.get(key)
        if entry is None:
            raise CheckpointError(f"{self.path}: holds no {key}")
        if entry.get("dtype") not in DTYPES:
            raise CheckpointError(f"{self.path / INDEX}: {key} has dtype {str(entry.get('dtype'))[:20]!r}")
        dtype = getattr(torch, entry["dtype"])
        if math.prod(shape) * dtype.itemsize > self.total_bytes:
            raise CheckpointError(f"{self.path / INDEX}: {key} is larger than the checkpoint's files")
        out = torch.empty(shape, dtype=dtype)
        covered = 0
        for piece in entry["pieces"]:
            at, size = list(piece["offsets"]), list(piece["shape"])
            if len(at) != len(shape) or len(size) != len(shape):
                raise CheckpointError(f"{self.path / INDEX}: {key} has a piece of {len(size)} dimensions")
            lo = [max(a, b) for a, b in zip(offsets, at, strict=True)]
            hi = [min(a + n, b + m) for a, n, b, m in zip(offsets, shape, at, size, strict=True)]
            if any(h <= low for low, h in zip(lo, hi, strict=True)):
                continue
            exact = at == list(offsets) and size == list(shape)  # the piece is the region: read it whole
            box = None if exact or not shape else tuple(slice(a - b, c - b) for a, b, c in zip(lo, at, hi, strict=True))
            data = self._read(piece, box)
            if exact and data.dtype == dtype and tuple(data.shape) == tuple(shape):
                return data
            target = tuple(slice(a - b, c - b) for a, b, c in zip(lo, offsets, hi, strict=True))
            out[target] = data.to(out.dtype)
            covered += math.prod(c - a for a, c in zip(lo, hi, strict=True))
        if covered != math.prod(shape):
            raise CheckpointError(f"{self.path}: {key} is incomplete ({covered} of {math.prod(shape)} elements)")
        return out


def load_trainer(reader: Reader, role: str, trainer: Any) -> None:
    """Load `role`'s weights, optimizer state and loss scaler into this rank's trainer (Actor or Critic): only
    the slices it holds, and with ZeRO only the optimizer state of the partition it steps."""
    from hetrl_cli.runtime.sharding import is_sharded, local_params

    shard, optimizer = trainer.shard, trainer.optimizer
    named = []
    for name, param in shard.held:
        key = f"{role}/model/{name}"
        if reader.shape(key) != shard.full_shapes[name]:
            found = reader.shape(key)
            held = "none" if found is None else list(found)
            raise CheckpointError(f"{reader.path}: {key} has shape {held}, the model {list(shard.full_shapes[name])};"
                                  " the checkpoint is of another model")  # fmt: skip
        named.append((name, reader.region(key, _offsets(shard, name, param.dim()), tuple(param.shape))))
    shard.load_full(named)
    wanted = {id(p) for p in local_params(optimizer)} if is_sharded(optimizer) else {id(p) for _, p in shard.held}
    state: dict[str, dict[str, Any]] = {}
    for name, param in shard.held:
        if id(param) not in wanted:
            continue
        prefix = f"{role}/optim/{name}/"
        slot = {k.removeprefix(prefix): v for k, v in reader.values.items() if k.startswith(prefix)}
        for key in reader.keys(prefix):
            full = reader.shape(key)
            offsets = _offsets(shard, name, param.dim()) if full else ()
            slot[key.removeprefix(prefix)] = reader.region(key, offsets, tuple(param.shape) if full else ())
        if slot:
            state[name] = slot
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    shard.load_optimizer_state(optimizer, {"state": state, "param_groups": groups})
    scaler = reader.values.get(f"{role}/scaler")
    if isinstance(scaler, dict):
        trainer.scaler.scale = float(scaler["scale"])
        trainer.scaler.clean_steps = int(scaler["clean_steps"])
        trainer.scaler.skipped = int(scaler["skipped"])


def load_checkpoint(path: Path, trainers: dict[str, Any]) -> int:
    """Load every trainer of this rank from the checkpoint at `path` (the launcher verified its files); -> step."""
    meta = read_json_file(path / META)
    with Reader(path) as reader:
        for role, trainer in trainers.items():
            if not reader.keys(f"{role}/model/"):
                raise CheckpointError(f"{path}: holds no {role}; it is of another workload")
            load_trainer(reader, role, trainer)
    return int(meta["step"])


def read_full_state(ckpt_dir: Path, role: str) -> dict[str, Any]:
    """{"model": {name: full tensor}, "optimizer": {"state": {name: {key: value}}, "param_groups": [...]}},
    the full tensors of `role` assembled from every rank's pieces, after checking the whole checkpoint (verify)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / INDEX).is_file() and (ckpt_dir / f"{role}.pt").is_file():
        return _read_legacy(ckpt_dir / f"{role}.pt")
    verify(ckpt_dir)
    with Reader(ckpt_dir) as reader:
        model = {k.removeprefix(f"{role}/model/"): reader.full(k) for k in reader.keys(f"{role}/model/")}
        if not model:
            raise CheckpointError(f"{ckpt_dir}: holds no {role}")
        state: dict[str, dict[str, Any]] = {}
        prefix = f"{role}/optim/"
        for key in reader.keys(prefix):
            name, _, slot = key.removeprefix(prefix).rpartition("/")
            state.setdefault(name, {})[slot] = reader.full(key)
        for key, value in reader.values.items():
            if key.startswith(prefix):
                name, _, slot = key.removeprefix(prefix).rpartition("/")
                state.setdefault(name, {})[slot] = value
        groups = reader.values.get(f"{role}/param_groups", [])
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}}


def _read_legacy(path: Path) -> dict[str, Any]:
    """A checkpoint of an older hetrl (one torch.save per role), read with weights_only=True (no code runs)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a checkpoint file ({type(exc).__name__})") from None


def read_full_role(ckpt_dir: Path, role: str) -> dict[str, Tensor]:
    """The full weights of `role` ("actor" or "critic") in canonical names, as the run held them last."""
    return dict(read_full_state(ckpt_dir, role)["model"])


def state_bytes_per_param(precision: str, optimizer: str) -> int:
    """Bytes a checkpoint holds per trained parameter: weights in the run's precision, fp32 optimizer state
    (Adam/AdamW: two moments; SGD: none at momentum 0) and fp32 masters for bf16/fp16."""
    weights = 4 if precision == "fp32" else 2
    moments = 0 if optimizer == "sgd" else 8
    master = 0 if precision == "fp32" else 4
    return weights + moments + master
