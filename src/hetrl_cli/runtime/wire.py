"""Rollouts and experience between ranks as tensors in bounded buckets (issue 21, item 5).

Until now every rank's rollouts and experience were pickled into `all_gather_object`: Python lists of ints and
floats, ~4-9 bytes a token through pickle, staged through host memory and gloo even on GPUs. Here a rank's part
is a small int32 table (one row per sequence or per experience row) and one flat value tensor:

- rollouts: table (index, prompt length, response length), values the token ids, int32 (every vocabulary fits);
- experience: table (field, index, length), values float32: reference and old log-probs, critic values, scores.
  fp32 and not the workload's bf16 because the PPO ratio exp(logp - old) and the k3 KL difference log-probs:
  bf16 keeps 8 bits of mantissa, an error of ~0.03 on a log-prob of -5 and so ~3 % on a ratio that is clipped at
  20 %; the roles compute them in fp32 (`.float()`), so fp32 on the wire is exactly what they computed. Scores
  become fp32 here instead of at the receiver, the same single rounding.

One exchange is three kinds of tensor collectives and no object collective: an all-gather of each member's two
counts (int64), of its table padded to the longest, and of its values padded to the longest, cut into buckets of
at most `bucket_bytes` per member (`WIRE_BUCKET_BYTES`), so no member holds more than size x bucket of others'
values in flight. The tensors go on `device`: on CUDA ranks the world group's NCCL half carries them, on CPU gloo.
The merged result is the one the pickled exchange gave, bit for bit (tests/runtime/test_wire.py).

torch is imported inside the functions (worker processes only).
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from hetrl_cli.runtime.gather import ragged_all_gather  # in gather.py: full weights use it too, without a cycle

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.runtime.roles import Rollout

WIRE_BUCKET_BYTES = 16 << 20
"""Values move in all-gathers of at most this many bytes per member."""
FIELDS = ("score", "ref_logp", "old_logp", "values")
"""Experience fields, by their number on the wire; `score` is one number per sequence, the others per token."""
SCALARS = frozenset({"score"})


def pack_rollouts(rollouts: list[Rollout]) -> tuple[Tensor, Tensor]:
    """(table [n, 3] = index, prompt length, response length; token ids int32, prompt then response)."""
    import torch

    table = torch.tensor([(r.index, len(r.prompt_ids), len(r.response_ids)) for r in rollouts], dtype=torch.int32)
    tokens = array("i")  # filled in C from the tuples: several times faster than torch.tensor(list)
    for r in rollouts:
        tokens.extend(r.prompt_ids)
        tokens.extend(r.response_ids)
    return table.reshape(len(rollouts), 3), _from_array(tokens, torch.int32)


def _from_array(values: array, dtype: Any) -> Tensor:
    import torch

    return torch.frombuffer(values, dtype=dtype) if len(values) else torch.zeros(0, dtype=dtype)


def unpack_rollouts(table: Tensor, tokens: Tensor) -> list[Rollout]:
    from hetrl_cli.runtime.roles import Rollout

    ids, out, offset = tokens.tolist(), [], 0
    for index, prompt, response in table.tolist():
        middle, end = offset + prompt, offset + prompt + response
        out.append(Rollout(index, tuple(ids[offset:middle]), tuple(ids[middle:end])))
        offset = end
    return out


def all_gather_rollouts(mine: list[Rollout], group: Any, size: int, device: str = "cpu") -> list[Rollout]:
    """Every member's rollouts, sorted by sequence index."""
    parts = ragged_all_gather(*pack_rollouts(mine), group, size, device)
    return sorted((r for part in parts for r in unpack_rollouts(*part)), key=lambda r: r.index)


def pack_experience(mine: dict[str, dict[int, Any]]) -> tuple[Tensor, Tensor]:
    """(table [rows, 3] = field number, sequence index, length; values float32): one row per (field, sequence)."""
    import torch

    rows, values = [], array("f")  # C floats: each Python float rounded to float32 as torch would
    for field, by_index in mine.items():
        number = FIELDS.index(field)
        for index, value in by_index.items():
            row = [value] if field in SCALARS else value
            rows.append((number, index, len(row)))
            values.extend(row.tolist() if isinstance(row, torch.Tensor) else row)
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), 3), _from_array(values, torch.float32)


def all_gather_experience(
    mine: dict[str, dict[int, Any]], group: Any, size: int, count: int, device: str = "cpu"
) -> dict[str, list[Any]]:
    """Every member's experience merged: {field: one entry per sequence 0..count-1}, a float for a score, a float32
    tensor for the per-token fields. Where members hold the same (field, sequence) (TP peers), the last in group
    order wins, as the pickled merge did."""
    merged: dict[str, dict[int, Any]] = {}
    for table, values in ragged_all_gather(*pack_experience(mine), group, size, device):
        offset = 0
        for number, index, length in table.tolist():
            field = FIELDS[number]
            row = values[offset : offset + length]
            merged.setdefault(field, {})[index] = float(row[0]) if field in SCALARS else row
            offset += length
    return {field: [by_index[i] for i in range(count)] for field, by_index in merged.items()}
