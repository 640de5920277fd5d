"""A replica's weight and optimizer-state pieces on its leader (or every member) as tensors in bounded buckets
(issue 21, item 5): what `Shard.full_weights()` (every weight sync) and `Shard.full_optimizer_state()` move.

Until now every member pickled its pieces through `gather_object`/`all_gather_object`, staged on the CPU, and the
leader held every member's whole part unpickled before assembling it: the model twice. Here:

- metadata is an int32 table, one row per piece: (name number in the full model's order, TP rank, optimizer key
  number or -1, dtype number, ndim, dims): all-gathered with `ragged_all_gather` (wire.py's too), no object collective;
- values move per dtype in their own dtype (weights in the workload's precision, masters and moments fp32),
  packed piece after piece into buckets of at most `GATHER_BUCKET_BYTES` on the members' device (NCCL on CUDA
  ranks, gloo on CPU ranks), never a whole flat copy of a member's part;
- to the leader by point-to-point send/recv (members in group order, bucket after bucket): `dist.gather` is not
  in every NCCL version torch supports, and an all-gather would make every member receive and hold the whole
  model; with `everyone` (an engine's TP ranks each need the full weights) by all-gathers of one bucket a member;
- the receiver copies each bucket's pieces into their destinations at once (a piece cut by a bucket boundary
  is staged alone), so its peak is the assembled result plus one bucket and at most one piece.

Results are the pickled path's, bit for bit (tests/runtime/test_gather_tensors.py): whole tensors as the
member holds them (the last member's wins), TP slices copied into zeros of the full shape, dict order of first
appearance, members in group order. torch is imported inside the functions (worker processes only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

GATHER_BUCKET_BYTES = 16 << 20
"""Values move in sends (or all-gathers, per member) of at most this many bytes (wire.WIRE_BUCKET_BYTES too)."""
MAX_DIMS = 8
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
OBJECT = len(DTYPE_NAMES)
"""The dtype number of a non-tensor value (optimizer state only): its value travels in the caller's metadata."""
HEAD = 5
"""Table columns before the dims: name, tp rank, key, dtype, ndim."""

Slice = tuple[int, int, int]
Piece = tuple[int, int, int, "Tensor"]
"""(name number, TP rank, key number or -1, tensor): one piece a member contributes."""
Sink = Callable[[int, int, "Tensor"], None]
"""sink(member, row, piece): a complete piece, as a view that is only valid during the call."""


def ragged_all_gather(
    table: Tensor, values: Tensor, group: Any, size: int, device: str = "cpu", bucket_bytes: int = GATHER_BUCKET_BYTES
) -> list[tuple[Tensor, Tensor]]:
    """Every member's (table [rows, C] int32, values [n]) on every member, in group-rank order, on the CPU.

    Members may hold different row and value counts (none at all too); tables and values are padded to the
    longest for the all-gathers and cut back afterwards."""
    import torch
    import torch.distributed as dist

    if size == 1:
        return [(table, values)]
    counts = torch.tensor([table.shape[0], values.numel()], dtype=torch.int64, device=device)
    all_counts = [torch.empty_like(counts) for _ in range(size)]
    dist.all_gather(all_counts, counts, group=group)
    rows, lengths = zip(*(tuple(int(x) for x in c.tolist()) for c in all_counts), strict=True)
    padded = torch.zeros((max(1, *rows), table.shape[1]), dtype=torch.int32, device=device)  # gloo: never empty
    padded[: table.shape[0]] = table.to(device=device, dtype=torch.int32)
    tables = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(tables, padded, group=group)
    longest = max(1, *lengths)
    flat = torch.zeros(longest, dtype=values.dtype, device=device)
    flat[: values.numel()] = values.to(device)
    received = [torch.empty(longest, dtype=values.dtype) for _ in range(size)]
    step = max(1, bucket_bytes // flat.element_size())
    for start in range(0, longest, step):
        chunk = flat[start : start + step]
        parts = [torch.empty_like(chunk) for _ in range(size)]
        dist.all_gather(parts, chunk, group=group)
        for out, part in zip(received, parts, strict=True):
            out[start : start + step].copy_(part)
    return [(t[:r].cpu(), v[:n]) for t, v, r, n in zip(tables, received, rows, lengths, strict=True)]


def _dtypes() -> list[Any]:
    import torch

    return [getattr(torch, name) for name in DTYPE_NAMES]


@dataclass
class Row:
    name: int
    tp_rank: int
    key: int
    dtype: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def table_of(pieces: list[Piece]) -> Tensor:
    import torch

    dtypes = _dtypes()
    rows = []
    for name, tp_rank, key, tensor in pieces:
        if not isinstance(tensor, torch.Tensor):
            rows.append([name, tp_rank, key, OBJECT, 0] + [0] * MAX_DIMS)
            continue
        if tensor.dim() > MAX_DIMS or tensor.dtype not in dtypes:
            raise ValueError(f"cannot gather a {tensor.dtype} tensor of {tensor.dim()} dims (at most {MAX_DIMS})")
        dims = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
        rows.append([name, tp_rank, key, dtypes.index(tensor.dtype), tensor.dim(), *dims])
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), HEAD + MAX_DIMS)


def rows_of(table: Tensor) -> list[Row]:
    return [Row(r[0], r[1], r[2], r[3], tuple(r[HEAD : HEAD + r[4]])) for r in table.tolist()]


@dataclass
class _Unpacker:
    """One member's stream of one dtype: buckets in, complete pieces out to the sink."""

    member: int
    rows: list[tuple[int, Row]]
    sink: Sink
    cursor: int = 0
    filled: int = 0
    staged: Any = None

    def _flush_empty(self) -> None:
        import torch

        while self.cursor < len(self.rows) and self.rows[self.cursor][1].numel == 0:
            index, row = self.rows[self.cursor]
            self.sink(self.member, index, torch.zeros(row.shape, dtype=_dtypes()[row.dtype]))
            self.cursor += 1

    def feed(self, bucket: Tensor) -> None:
        import torch

        pos = 0
        self._flush_empty()
        while pos < bucket.numel():
            index, row = self.rows[self.cursor]
            take = min(row.numel - self.filled, bucket.numel() - pos)
            part = bucket[pos : pos + take]
            pos += take
            if self.filled == 0 and take == row.numel:  # the whole piece in this bucket: no staging
                self.sink(self.member, index, part.view(row.shape))
            else:  # cut by a bucket boundary: staged alone
                if self.staged is None:
                    self.staged = torch.empty(row.numel, dtype=bucket.dtype, device=bucket.device)
                self.staged[self.filled : self.filled + take].copy_(part)
                self.filled += take
                if self.filled < row.numel:
                    continue
                self.sink(self.member, index, self.staged.view(row.shape))
                self.staged, self.filled = None, 0
            self.cursor += 1
            self._flush_empty()


def _pack(tensors: list[Tensor], starts: list[int], start: int, size: int, dtype: Any, device: Any) -> Tensor:
    """Elements [start, start + size) of the concatenation of `tensors` (zero past the end)."""
    import bisect

    import torch

    out = torch.zeros(size, dtype=dtype, device=device)
    i = max(0, bisect.bisect_right(starts, start) - 1)
    while i < len(tensors) and starts[i] < start + size:
        flat = tensors[i].reshape(-1)
        lo, hi = max(start, starts[i]), min(start + size, starts[i] + flat.numel())
        if hi > lo:
            out[lo - start : hi - start].copy_(flat[lo - starts[i] : hi - starts[i]])
        i += 1
    return out


@dataclass
class Exchange:
    """One gather of pieces over a replica's group (`ranks`: global ranks, `ranks[0]` the leader)."""

    group: Any
    ranks: tuple[int, ...]
    everyone: bool
    device: Any
    bucket_bytes: int | None = None
    """None: `GATHER_BUCKET_BYTES` as it is when the exchange runs."""
    tables: list[list[Row]] = field(default_factory=list)

    @property
    def receiving(self) -> bool:
        import torch.distributed as dist

        return self.everyone or dist.get_rank() == self.ranks[0]

    def run(self, pieces: list[Piece], before: Callable[[list[list[Row]]], Sink] | None) -> None:
        """Exchange the tables, then the values; on receiving members `before(tables)` prepares the destinations
        and returns the sink each complete piece goes to."""
        import torch

        size = len(self.ranks)
        empty = torch.zeros(0, dtype=torch.int32)
        self.tables = [rows_of(t) for t, _ in ragged_all_gather(table_of(pieces), empty, self.group, size, self.device)]
        sink = before(self.tables) if self.receiving and before is not None else None
        codes = sorted({row.dtype for table in self.tables for row in table} - {OBJECT})
        for code in codes:
            mine = [t for (_, _, _, t), row in zip(pieces, self.tables[self._me()], strict=True) if row.dtype == code]
            self._values(code, mine, sink)

    def _me(self) -> int:
        import torch.distributed as dist

        return self.ranks.index(dist.get_rank())

    def _values(self, code: int, mine: list[Tensor], sink: Sink | None) -> None:
        import torch
        import torch.distributed as dist

        dtype = _dtypes()[code]
        step = max(1, (self.bucket_bytes or GATHER_BUCKET_BYTES) // torch.empty(0, dtype=dtype).element_size())
        streams = [[(i, r) for i, r in enumerate(table) if r.dtype == code] for table in self.tables]
        totals = [sum(r.numel for _, r in rows) for rows in streams]
        starts = [sum(t.numel() for t in mine[:i]) for i in range(len(mine))]
        me = self._me()
        unpackers = [_Unpacker(m, rows, sink) for m, rows in enumerate(streams)] if sink else []
        if self.everyone:
            longest = max(1, *totals)
            for start in range(0, longest, step):
                width = min(step, longest - start)
                chunk = _pack(mine, starts, start, width, dtype, self.device)
                parts = [torch.empty_like(chunk) for _ in self.ranks]
                dist.all_gather(parts, chunk, group=self.group)
                for unpacker, part, total in zip(unpackers, parts, totals, strict=True):
                    unpacker.feed(part[: max(0, min(width, total - start))])
            for unpacker in unpackers:
                unpacker.feed(torch.zeros(0, dtype=dtype))
            return
        if me != 0:
            for start in range(0, totals[me], step):
                chunk = _pack(mine, starts, start, min(step, totals[me] - start), dtype, self.device)
                dist.send(chunk, dst=self.ranks[0], group=self.group)
            return
        for (index, _), tensor in zip(streams[0], mine, strict=True):  # the leader's own: no transport
            sink(0, index, tensor.detach())
        for member in range(1, len(self.ranks)):
            for start in range(0, totals[member], step):
                buf = torch.empty(min(step, totals[member] - start), dtype=dtype, device=self.device)
                dist.recv(buf, src=self.ranks[member], group=self.group)
                unpackers[member].feed(buf)
            unpackers[member].feed(torch.zeros(0, dtype=dtype))


@dataclass
class Assembly:
    """Full tensors from pieces, as Shard._assemble and full_optimizer_state assembled the pickled parts: keyed
    (name number, key name or None), in order of first appearance; a whole piece (no TP slice, 0-dim, or not a
    tensor) is the last member's copy; TP slices go into zeros of the full shape in the first piece's dtype.
    `keys[m]` names member m's key numbers, `extras[m]` holds its non-tensor values by row."""

    full_shapes: list[tuple[int, ...]]
    slice_of: Callable[[int, int], Slice | None]
    keys: list[list[str]]
    extras: list[dict[int, Any]]
    out: dict[tuple[int, str | None], Any] = field(default_factory=dict)
    winners: dict[tuple[int, str | None], tuple[int, int]] = field(default_factory=dict)

    def _key(self, member: int, row: Row) -> tuple[int, str | None]:
        return row.name, None if row.key < 0 else self.keys[member][row.key]

    def prepare(self, tables: list[list[Row]]) -> Sink:
        import torch

        dtypes = _dtypes()
        for member, table in enumerate(tables):
            for index, row in enumerate(table):
                key = self._key(member, row)
                if row.dtype == OBJECT:
                    self.out[key] = self.extras[member][index]
                    self.winners[key] = (member, index)
                elif self._whole(row):
                    self.out[key] = None
                    self.winners[key] = (member, index)
                elif self.out.get(key) is None:
                    self.out[key] = torch.zeros(self.full_shapes[row.name], dtype=dtypes[row.dtype])
                    self.winners.pop(key, None)

        def sink(member: int, index: int, piece: Tensor) -> None:
            row = tables[member][index]
            key = self._key(member, row)
            if not self._whole(row):
                dim, lo, hi = self.slice_of(row.name, row.tp_rank)  # type: ignore[misc]
                self.out[key].narrow(dim, lo, hi - lo).copy_(piece)
            elif self.winners.get(key) == (member, index):
                self.out[key] = torch.empty(row.shape, dtype=piece.dtype).copy_(piece)

        return sink

    def _whole(self, row: Row) -> bool:
        return len(row.shape) == 0 or self.slice_of(row.name, row.tp_rank) is None
