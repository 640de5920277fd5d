"""Loading a zero3 rank's chunks straight from a model directory (issue 21, item 4 under `sharding: zero3`).

loading.load_shard gives a rank its whole TP/PP piece (and, in mixed precision, fp32 masters of it) before
zero3.Zero3Shard cuts it into 1/dp chunks: a zero3 rank's peak while loading was its whole piece, about dp x
its steady state (measured, tests/runtime/test_zero3_loading.py: 2.0x for dp 2, bf16 with masters). Here the
piece stays on the meta device, Zero3Shard builds its units on it (full buffers allocated but never touched, so
never resident, and freed at once), and each unit's chunk, and its fp32 master chunk, is filled from the
safetensors files: for each parameter overlapping the chunk only the rows covering that flat range are read
(`get_slice`, the TP slice included), a bounded block at a time, each block through its own `safe_open` so no
mapping stays resident. Peak while loading: the chunks plus one block.

The chunks equal Zero3Shard.of's on the whole piece bit for bit (the same file values cast the same way;
tests/runtime/test_zero3_loading.py compares them). Heads the checkpoint lacks are initialised whole (they are
small) exactly as loading.load_shard does, and chunked from that.

torch and safetensors are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from torch import Tensor

    from hetrl_cli.runtime.loading import Loaded, WeightFiles
    from hetrl_cli.runtime.parallel import Parallel
    from hetrl_cli.runtime.zero3 import Unit

BLOCK_ELEMENTS = 1 << 21
"""At most this many elements (rounded up to a whole row) read from a file at once: 4 MiB of bf16."""


class FileChunks:
    """zero3.ChunkSource reading each chunk's parameter ranges from the safetensors files (module docstring);
    `masters` collects the fp32 master chunks in unit order when mixed precision keeps them."""

    def __init__(self, files: WeightFiles, parts: dict[str, tuple[int, int, int]], shapes: dict[str, tuple[int, ...]],
                 fresh: dict[str, Tensor], dtype: Any, device: str, masters: bool) -> None:  # fmt: skip
        self.files, self.parts, self.shapes, self.fresh = files, parts, shapes, fresh
        self.dtype, self.device = dtype, device
        self.masters: list[Tensor] | None = [] if masters else None

    def fill(self, unit: Unit, ranges: Iterable[tuple[str, int, int]], base: int) -> None:
        import torch

        local = unit.local.data
        master = None if self.masters is None else torch.zeros(unit.chunk, dtype=torch.float32, device=self.device)
        for name, lo, hi in ranges:
            first = lo + base - unit.offsets[unit.names.index(name)]  # the parameter's flat index at chunk position lo
            for at, values in self._values(name, first, first + hi - lo):
                where = slice(lo + at - first, lo + at - first + values.numel())
                local[where].copy_(values)
                if master is not None:
                    master[where].copy_(values)
        if self.masters is not None and master is not None:
            self.masters.append(master)

    def _values(self, name: str, lo: int, hi: int) -> Iterator[tuple[int, Tensor]]:
        """(first flat index, values) covering flat elements [lo, hi) of this rank's piece of `name`."""
        if name in self.fresh:
            yield lo, self.fresh[name].reshape(-1)[lo:hi]
            return
        key = self.files.key(name)
        assert key is not None
        yield from read_range(self.files.where[key], key, self.shapes[name], self.parts.get(name), lo, hi)


def read_range(path: Path, key: str, shape: tuple[int, ...], part: tuple[int, int, int] | None, lo: int,
               hi: int) -> Iterator[tuple[int, Tensor]]:  # fmt: skip
    """Flat elements [lo, hi) of tensor `key` (cut to `part` = (dim, lo, hi), its TP slice, whose shape is `shape`)
    as (first flat index, flat values) blocks of whole rows, in the file's dtype; each block read by its own
    `safe_open`, so the file is unmapped between blocks."""
    from safetensors import safe_open

    inner = 1
    for size in shape[1:]:
        inner *= size
    first, last = lo // inner, -(-hi // inner)
    step = max(1, BLOCK_ELEMENTS // inner)
    for row in range(first, last, step):
        end = min(last, row + step)
        index: list[slice] = [slice(None)] * len(shape)
        if part is not None:
            index[part[0]] = slice(part[1], part[2])
        shift = part[1] if part is not None and part[0] == 0 else 0
        index[0] = slice(shift + row, shift + end)
        with safe_open(str(path), "pt") as f:
            block = f.get_slice(key)[tuple(index)].reshape(-1)
        a, b = max(lo, row * inner), min(hi, end * inner)
        yield a, block[a - row * inner : b - row * inner]
        del block


def load_trained(model_dir: str | Path, parallel: Parallel | None = None, device: str = "cpu", dtype: str = "fp32",
                 head: str = "causal", seed: int = 0, zero: Any = None) -> Loaded:  # fmt: skip
    """A trained role's piece (loading.load_shard with `trained`), or with `zero` (sharding.Zero) active zero3 and
    safetensors to read, its zero3.Zero3Shard whose chunks and master chunks come from the files (load_zero3)."""
    from hetrl_cli.runtime.loading import WeightFiles, load_shard
    from hetrl_cli.runtime.parallel import Parallel

    folder = Path(model_dir).expanduser()
    if zero is None or zero.kind != "zero3" or not zero.active or not WeightFiles(folder):
        return load_shard(folder, parallel, device, dtype, head, seed, trained=True)
    return load_zero3(folder, parallel or Parallel.single(), device, dtype, head, seed, zero)


def load_zero3(folder: Path, par: Parallel, device: str, dtype: str, head: str, seed: int, zero: Any) -> Loaded:
    """This rank's zero3.Zero3Shard of the model in `folder` (a trained role, `zero` active zero3), chunks read
    from the files; `Loaded.masters` are the fp32 master chunks in unit order (zero3.Zero3Shard.local_masters'
    form) below fp32."""
    import torch
    from torch import nn

    from hetrl_cli.runtime.loading import Loaded, WeightFiles, _empty_model, _init_missing, _place_buffers
    from hetrl_cli.runtime.parallel import Shard
    from hetrl_cli.runtime.precision import torch_dtype
    from hetrl_cli.runtime.zero3 import Zero3Shard

    files = WeightFiles(folder)
    shard = Shard.build(_empty_model(folder, head), par)
    parts = shard.slices.get(par.pos.tp_rank, {})
    missing = [name for name, _ in shard.held if files.key(name) is None]
    for name, param in shard.held:
        key = files.key(name)
        if key is not None:
            files.check_shape(key, shard.full_shapes[name])
        else:  # a head the checkpoint lacks: whole and fp32 for load_shard's initialisation, chunked below
            torch.utils.swap_tensors(param, nn.Parameter(torch.empty(param.shape, device=device)))
    fresh: dict[str, Tensor] = {}
    if missing:
        _init_missing(shard, missing, seed)
        fresh = {name: param.detach().clone() for name, param in shard.held if name in missing}
    target = torch_dtype(dtype)
    shapes = {name: tuple(param.shape) for name, param in shard.held}
    source = FileChunks(files, parts, shapes, fresh, target, device, masters=dtype != "fp32")
    for _, param in shard.held:
        param.requires_grad_(True)  # a trained role's (the meta model's are already)
    sharded = Zero3Shard.of(shard, zero, source)
    source.fresh = {}
    _place_buffers(sharded.model, device, target)
    sharded.model.eval()
    return Loaded(sharded, source.masters, missing)
