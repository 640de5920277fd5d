"""Loading a model directory for one rank's piece only (issue 21, item 4).

`from_pretrained` materialises the whole model on every rank, once per role, before `parallel.Shard.build` cuts it
down: an 8B actor's rank briefly held 32 GB of fp32 weights it then dropped. Here the model is built on the meta
device (`accelerate.init_empty_weights`: parameters without storage, buffers such as the rotary frequencies
real), cut to the rank's pipeline stage and TP slices by the same `Shard.build` (on meta tensors that costs
nothing), and only then are the parameters this rank holds given storage, one at a time, each filled from the
safetensors files with `safe_open(...).get_slice` (the TP slice only; sharded checkpoints through their
`*.index.json`).

Peak memory while loading: the rank's own pieces plus one tensor in flight. Each file is opened per tensor and
closed before the tensor is converted, so the memory-mapped pages it touched leave the resident set at once, and
the largest tensors go first, while little else is resident (tests/runtime/test_loading.py measures the peak
against the steady state in a fresh process).

Mixed precision: a trained role's fp32 master weights are made from the file, tensor by tensor, next to the
low-precision weights (`Loaded.masters`), instead of loading fp32 and casting afterwards (two fp32 copies).

Heads a checkpoint lacks (a critic's value head, a reward model's score on a policy checkpoint) are initialised
by the model's own `_init_weights` after `torch.manual_seed(seed)`, as `from_pretrained` does, so every rank
that holds them draws the same values. Directories without safetensors (PyTorch `.bin` only) are loaded whole
with `from_pretrained`, then cut (the old way), with one line saying so.

What can share between roles of one rank: only frozen copies with the same weights, head, precision and layout.
The reference is the one frozen copy of the policy (the engine's and the critic-inference copy change at every
weight sync; the actor trains), and a reward model has its own head and usually its own checkpoint; critic
inference already runs on the trained critic where their layouts are equal (worker._critic_shared). So no two
roles the runtime has today hold the same frozen weights: nothing more to share.

torch, transformers, accelerate and safetensors are imported inside the functions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor, nn

    from hetrl_cli.runtime.parallel import Parallel, Shard

HEADS = {
    "causal": "AutoModelForCausalLM",
    "token": "AutoModelForTokenClassification",
    "sequence": "AutoModelForSequenceClassification",
}
"""Which transformers auto class a role's model is: the policy's LM head, a critic's per-token value, a reward."""


@dataclass
class Loaded:
    """A rank's piece of a model: the shard, and (mixed precision) fp32 master weights in `shard.held` order."""

    shard: Shard
    masters: list[Tensor] | None = None
    missing: list[str] = field(default_factory=list)
    """Canonical names the checkpoint did not hold (initialised by the model's `_init_weights`)."""


class WeightFiles:
    """Where each tensor of a model directory lives: one or more `*.safetensors` files (an index, or the files'
    own headers). Tensors are read one at a time, each through its own `safe_open`, so no mapping stays open."""

    def __init__(self, folder: str | Path) -> None:
        from safetensors import safe_open

        self.folder = Path(folder).expanduser()
        self.where: dict[str, Path] = {}
        indexes = sorted(self.folder.glob("*.safetensors.index.json"))
        if indexes:
            weight_map = json.loads(indexes[0].read_text(encoding="utf-8")).get("weight_map", {})
            self.where = {key: self.folder / name for key, name in weight_map.items()}
            return
        for path in sorted(self.folder.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                self.where.update(dict.fromkeys(f.keys(), path))

    def __bool__(self) -> bool:
        return bool(self.where)

    def key(self, name: str) -> str | None:
        """The checkpoint's key of a canonical name (a bare backbone's keys lack the `model.` prefix)."""
        for key in (name, name.removeprefix("model."), f"model.{name}"):
            if key in self.where:
                return key
        return None

    def check_shape(self, key: str, shape: tuple[int, ...]) -> None:
        """The file's tensor has the full shape the config implies (what from_pretrained checks). Whole, not a
        rank's TP slice of it: a slice of a larger tensor (a bigger vocabulary, more heads) has the rank's shape
        too, so comparing slices let a checkpoint that does not fit its config load at tp > 1 where tp 1 refused."""
        from safetensors import safe_open

        with safe_open(str(self.where[key]), "pt") as f:
            stored = tuple(f.get_slice(key).get_shape())
        if stored != shape:
            raise ValueError(f"{self.folder}: tensor {key} has shape {stored}; the config implies {shape}")

    def read(self, key: str, part: tuple[int, int, int] | None = None) -> Tensor:
        """The tensor `key`, or only rows/columns [lo, hi) of dimension `dim` for `part` = (dim, lo, hi), on the
        CPU in the file's dtype, contiguous and owning exactly its bytes. The file is closed (unmapped) before
        this returns.

        `get_slice` returns a view: a column slice (dim 1: o_proj, down_proj) is non-contiguous and a row slice may
        sit in a larger buffer. A parameter made of such a view breaks collectives that write into it in place
        (ZeroRedundancyOptimizer's broadcast of the updated partition left the other replica's TP pieces stale:
        dp2xtp2 zero2 diverged from the unsharded update), and keeps the larger buffer alive; so it is copied."""
        import torch
        from safetensors import safe_open

        with safe_open(str(self.where[key]), "pt") as f:
            if part is None:
                return f.get_tensor(key)
            piece = f.get_slice(key)
            index: list[slice] = [slice(None)] * len(piece.get_shape())
            dim, lo, hi = part
            index[dim] = slice(lo, hi)
            tensor = piece[tuple(index)]
        if tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
            return tensor
        return tensor.clone(memory_format=torch.contiguous_format)


def _empty_model(model_dir: Path, head: str) -> nn.Module:
    """The HF model of `model_dir`'s config with its parameters on the meta device (ties kept)."""
    import transformers
    from accelerate import init_empty_weights

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    if head != "causal":
        config.num_labels = 1
    with init_empty_weights(include_buffers=False):
        model = getattr(transformers, HEADS[head]).from_config(config)
    model.tie_weights()  # init_empty_weights registers the head anew: tie it back to the embedding
    return model


def load_shard(
    model_dir: str | Path,
    parallel: Parallel | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    head: str = "causal",
    seed: int = 0,
    trained: bool = False,
) -> Loaded:
    """This rank's piece of the model in `model_dir`, in `dtype` on `device`, in eval mode.

    `trained`: a role that trains it: gradients on, buffers in `dtype` too (as casting the loaded fp32 model did),
    and, below fp32, fp32 master weights from the file (`Loaded.masters`). Otherwise frozen (no gradients).
    A zero3 rank loads through zero3load.load_trained instead: its chunks only, never the whole piece."""
    import torch

    from hetrl_cli.runtime.parallel import Parallel, Shard
    from hetrl_cli.runtime.precision import torch_dtype

    folder = Path(model_dir).expanduser()
    par = parallel or Parallel.single()
    files = WeightFiles(folder)
    if not files:
        return _load_whole(folder, par, device, dtype, head, seed, trained)
    shard = Shard.build(_empty_model(folder, head), par)
    target = torch_dtype(dtype)
    keep_masters = trained and dtype != "fp32"
    loaded = Loaded(shard, [] if keep_masters else None)
    masters: dict[int, Tensor] = {}
    part_of = shard.slices.get(par.pos.tp_rank, {})
    order = sorted(range(len(shard.held)), key=lambda i: -shard.held[i][1].numel())  # largest first
    for i in order:
        name, param = shard.held[i]
        key = files.key(name)
        if key is None:
            loaded.missing.append(name)
            _give_storage(param, torch.empty(param.shape, dtype=torch.float32, device=device), trained)
            continue
        files.check_shape(key, shard.full_shapes[name])
        tensor = files.read(key, part_of.get(name))
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{folder}: tensor {key} has shape {tuple(tensor.shape)}; the config implies "
                             f"{tuple(param.shape)} for this rank")  # fmt: skip
        if keep_masters:
            masters[i] = tensor.to(device=device, dtype=torch.float32, copy=True)
        _give_storage(param, tensor.to(device=device, dtype=target), trained)
        del tensor
    if loaded.missing:
        _init_missing(shard, loaded.missing, seed)
        for i, (name, param) in enumerate(shard.held):
            if name in loaded.missing:
                if keep_masters:
                    masters[i] = param.detach().clone()
                with torch.no_grad():
                    param.data = param.data.to(target)
    if keep_masters:
        loaded.masters = [masters[i] for i in range(len(shard.held))]
    _place_buffers(shard.model, device, target if trained else None)
    shard.model.eval()
    return loaded


def _give_storage(param: nn.Parameter, data: Tensor, trained: bool) -> None:
    """Swap a meta parameter's contents for `data`, keeping the Parameter object (the shard's `held` list, a
    tied head and the TP modules all refer to it)."""
    import torch
    from torch import nn

    torch.utils.swap_tensors(param, nn.Parameter(data, requires_grad=trained))


def _init_missing(shard: Shard, names: list[str], seed: int) -> None:
    """Heads the checkpoint lacks: the model's own `_init_weights` on their modules after seeding, as
    `from_pretrained` initialises missing weights (then identical on every rank that holds them)."""
    import torch

    missing = {id(p) for n, p in shard.held if n in names}
    torch.manual_seed(seed)
    for module in shard.model.modules():
        if any(id(p) in missing for p in module.parameters(recurse=False)):
            with torch.no_grad():
                shard.model._init_weights(module)


def _place_buffers(model: nn.Module, device: str, dtype: Any) -> None:
    """Buffers (rotary frequencies) onto the device; a trained role's also into its dtype (fp32 loads cast
    whole, buffers included, as before)."""
    for module in model.modules():
        for name, buf in list(module._buffers.items()):
            if buf is None:
                continue
            moved = buf.to(device)
            if dtype is not None and moved.is_floating_point() and name not in module._non_persistent_buffers_set:
                moved = moved.to(dtype)
            module._buffers[name] = moved


def _load_whole(folder: Path, par: Parallel, device: str, dtype: str, head: str, seed: int, trained: bool) -> Loaded:
    """No safetensors: `from_pretrained` of the whole model (PyTorch .bin), then cut to this rank's piece."""
    import torch
    import transformers

    from hetrl_cli.runtime.parallel import Shard
    from hetrl_cli.runtime.precision import torch_dtype

    print(f"loading {folder} whole on this rank (no *.safetensors there; .bin checkpoints are not sliced)", flush=True)
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {} if head == "causal" else {"num_labels": 1}
    if not trained:
        kwargs["dtype"] = torch_dtype(dtype)
    model = getattr(transformers, HEADS[head]).from_pretrained(str(folder), **kwargs).to(device)
    shard = Shard.build(model.requires_grad_(trained).eval(), par)
    masters = None
    if trained and dtype != "fp32":
        masters = [p.detach().clone() for _, p in shard.held]
        for param in shard.model.parameters():
            param.data = param.data.to(torch_dtype(dtype))
        _place_buffers(shard.model, device, torch_dtype(dtype))
    return Loaded(shard, masters)
