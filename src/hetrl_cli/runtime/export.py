"""`hetrl export`: a run's trained actor (or critic) as a Hugging Face model directory (issue 22, item 4).

What other tools load: `model*.safetensors` (sharded with `model.safetensors.index.json` past a size),
`config.json`, the run's tokenizer, and (actor) `generation_config.json`. `AutoModelForCausalLM.from_pretrained`
gives the logits of the run's last weights; a critic loads with `AutoModelForTokenClassification` (its value
head is a one-label token-classification head named `score`, as roles.Critic trains it).

Names: a checkpoint holds the runtime's canonical names (runtime/parallel.py), which are the HF model's own
`named_parameters()` names, a tied head under the embedding's name. That is exactly what `save_pretrained`
writes, so the mapping is the identity for the built-in tiny model and for any `actor: {path: DIR}` model the
runtime executes (Qwen2/Qwen3/Llama/Mistral): the export checks the names and shapes against the architecture
built on the meta device from the source config (no memory) instead of trusting them, and refuses a mismatch.

Checkpoints are read only through runtime/checkpoint.read_full_role (never unpickled here). The directory is
written into a temp dir beside DIR and renamed into place, so a half export is never visible.

torch, transformers and safetensors are imported inside functions: the CLI imports this module lazily anyway.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.rundir import RunDir

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.artifacts.workload import Workload

ROLES = ("actor", "critic")
DTYPES = ("fp32", "bf16", "fp16")
MAX_SHARD_BYTES = 5 * 2**30
"""Past this a weights file is split (HF's own default shard size)."""


@dataclass(frozen=True)
class ExportResult:
    """What `export_run` wrote: the directory, which checkpoint, in which dtype, and its files."""

    directory: str
    role: str
    step: int
    checkpoint: str
    dtype: str
    parameters: int
    files: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    role: str = "actor",
    step: int | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> ExportResult:
    """Write `role` of the newest complete checkpoint of `run_dir` (or of `step`) to `out_dir` as an HF model
    directory, in the workload's precision or `dtype`. Bad input (not a run directory, no such checkpoint or
    role, `out_dir` not empty) raises BadInput before anything is written."""
    from hetrl_cli.runtime.checkpoint import CheckpointError, read_full_role

    run = _run_dir(run_dir)
    workload = _workload(run)
    if role not in ROLES:
        raise BadInput(f"--role {role}: unknown role; use one of {', '.join(ROLES)}")
    spec = workload.model_for(role)  # type: ignore[arg-type]
    if spec is None:
        raise BadInput(f"{run.root}: the run trains no {role} ({workload.algorithm}); use --role actor")
    if dtype is not None and dtype not in DTYPES:
        raise BadInput(f"--dtype {dtype}: unknown dtype; use one of {', '.join(DTYPES)}")
    target = _free_target(Path(out_dir))
    ckpt_step, ckpt = find_checkpoint(run, step)
    _quiet_transformers()
    try:
        weights = read_full_role(ckpt, role)
    except CheckpointError as exc:  # a corrupt checkpoint given to export is bad input: one line, exit 2
        raise BadInput(str(exc)) from None
    precision = dtype or workload.precision
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        count = write_hf_dir(tmp, weights, _source_dir(run, workload, role), _source_dir(run, workload, "actor"),
                             role, precision, max_shard_bytes)  # fmt: skip
        _plain_modes(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = sorted(p.name for p in target.iterdir())
    return ExportResult(str(target), role, ckpt_step, str(ckpt), precision, count, files)


def _quiet_transformers() -> None:
    """No progress bars or load reports from transformers (the command prints one line)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _plain_modes(folder: Path) -> None:
    """The modes of a model directory like any other under the user's umask (mkdtemp makes it 0700 and
    safetensors writes 0600), so a server running as another user can read it where the umask allows."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~mask)


def _run_dir(path: str | Path) -> RunDir:
    run = RunDir(Path(path).expanduser().absolute())
    if not run.root.is_dir():
        raise BadInput(f"{run.root}: no such run directory; give a runs/ID directory that `hetrl run` wrote")
    if not run.plan.is_file():
        raise BadInput(f"{run.root}: not a run directory (no plan.json); give a runs/ID directory of `hetrl run`")
    return run


def _workload(run: RunDir) -> Workload:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan

    return load_artifact(run.plan, Plan).workload


def _free_target(target: Path) -> Path:
    """`target`, absolute, when it is absent or an empty directory (its parents are made); else BadInput."""
    target = target.expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise BadInput(f"--hf {target}: exists and is not a directory; name a new or empty directory")
    if target.is_dir() and any(target.iterdir()):
        raise BadInput(f"--hf {target}: exists and is not empty; name a new or empty directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--hf {target}: cannot create its folder ({exc.strerror}); choose another place") from None
    return target


def find_checkpoint(run: RunDir, step: int | None) -> tuple[int, Path]:
    """(step, directory) of the checkpoint `latest` names, else of the newest complete one (meta.json written
    last), or of `step`'s; BadInput when there is none. The checkpoint's own files are checked when read."""
    complete = {}
    for path in run.checkpoints.glob("step-*"):
        number = path.name.removeprefix("step-")
        if number.isdigit() and (path / "meta.json").is_file():
            complete[int(number)] = path
    if step is not None:
        if step not in complete:
            listed = ", ".join(complete[s].name for s in sorted(complete)) or "none"
            raise BadInput(f"--step {step}: {run.checkpoints} has no complete checkpoint of that step (complete ones: "
                           f"{listed}); pick one of those")  # fmt: skip
        return step, complete[step]
    pointer = run.checkpoints / "latest"
    named = pointer.read_text(encoding="utf-8", errors="replace").strip() if pointer.is_file() else ""
    for number, path in complete.items():
        if path.name == named:
            return number, path
    if not complete:
        raise BadInput(f"{run.checkpoints}: no complete checkpoint; run with --checkpoint-every N, or to the end")
    newest = max(complete)
    return newest, complete[newest]


def _source_dir(run: RunDir, workload: Workload, role: str) -> Path:
    """The model directory the run loaded `role` from (the workload's path, or the tiny build in RUN/models)."""
    from hetrl_cli.runtime.tinymodel import resolve_model_dir

    spec = workload.model_for(role)  # type: ignore[arg-type]
    assert spec is not None
    return resolve_model_dir(spec.path, spec.arch, run.models, workload.seed)


def write_hf_dir(
    out: Path,
    weights: dict[str, Tensor],
    source: Path,
    tokenizer_source: Path,
    role: str,
    precision: str,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> int:
    """config.json, weights, tokenizer (and the actor's generation_config.json) into `out`; -> parameter count.

    `weights` are canonical names (= HF names, tied head left out) of the role's model built from `source`."""
    from hetrl_cli.runtime.precision import torch_dtype
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    config, model_class = _export_config(source, role, torch_dtype(precision))
    state = _checked_state(weights, config, model_class, source, torch_dtype(precision))
    _write_safetensors(out, state, max_shard_bytes)
    config.save_pretrained(out)
    tokenizer = load_tokenizer(tokenizer_source)  # as the run used it (a pad token set where the model had none)
    tokenizer.save_pretrained(out)
    if role == "actor":
        _generation_config(source, config, tokenizer).save_pretrained(out)
    return sum(t.numel() for t in state.values())


def _export_config(source: Path, role: str, dtype: Any) -> tuple[Any, Any]:
    """(config, model class) of the exported model: the source's config in `dtype`; for the critic the
    one-label token-classification model roles.Critic trains."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(str(source))
    auto = AutoModelForCausalLM if role == "actor" else AutoModelForTokenClassification
    if role == "critic":
        config.num_labels = 1
    try:
        model_class = auto._model_mapping[type(config)]
    except KeyError:
        kind = "causal LM" if role == "actor" else "token-classification (value) model"
        raise BadInput(f"{source}/config.json: model_type '{config.model_type}' has no {kind} class") from None
    config.architectures = [model_class.__name__]
    config.dtype = dtype
    return config, model_class


def _checked_state(weights: dict[str, Tensor], config: Any, model_class: Any, source: Path, dtype: Any) -> dict:
    """The checkpoint's tensors in `dtype`, after checking their names and shapes against the architecture
    (built on the meta device: no memory). A tied head the checkpoint may also hold is left out, as
    save_pretrained leaves it out."""
    import torch

    with torch.device("meta"):
        model = model_class(config)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied weights counted once
    state = {name: t for name, t in weights.items() if name in expected}
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(weights) - set(expected) - _tied_names(model))
    if missing or extra:
        what = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
        raise BadInput(f"the checkpoint's weights do not fit {source}/config.json ({what}); export from its own run")
    wrong = [n for n, t in state.items() if tuple(t.shape) != expected[n]]
    if wrong:
        name = wrong[0]
        raise BadInput(f"the checkpoint's {name} has shape {tuple(state[name].shape)}, {source}/config.json says "
                       f"{expected[name]}; export from its own run")  # fmt: skip
    return {name: t.detach().to(device="cpu", dtype=dtype).contiguous() for name, t in state.items()}


def _tied_names(model: Any) -> set[str]:
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    return set(tied)


def _write_safetensors(out: Path, state: dict[str, Tensor], max_shard_bytes: int) -> None:
    """model.safetensors, or model-0000i-of-0000n.safetensors and model.safetensors.index.json past the limit."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    split = split_torch_state_dict_into_shards(state, max_shard_size=max_shard_bytes)
    for filename, names in split.filename_to_tensors.items():
        save_file({name: state[name] for name in names}, str(out / filename), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {**split.metadata, "total_size": sum(t.nbytes for t in state.values())},
                 "weight_map": split.tensor_to_filename}  # fmt: skip
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _generation_config(source: Path, config: Any, tokenizer: Any) -> Any:
    """The source's generation config (else one from the model config), with the run tokenizer's special ids."""
    from transformers import GenerationConfig

    try:
        generation = GenerationConfig.from_pretrained(str(source))
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(generation, key, None) is None:
            setattr(generation, key, getattr(tokenizer, key, None))
    return generation
