"""Checkpoints of the trained roles (actor, critic): reading them back in canonical names.

`read_full_role(ckpt_dir, role)` is the stable entry point other stages (`hetrl export`) use: the role's full
weights, canonical names (parallel.py), whatever layout wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.errors import HetrlError

if TYPE_CHECKING:
    from torch import Tensor

ROLES = ("actor", "critic")


class CheckpointError(HetrlError):
    """A checkpoint that cannot be written or read: the message names the file and the cause (one line)."""


def read_full_state(ckpt_dir: Path, role: str) -> dict[str, Any]:
    """{"model": {name: full tensor}, "optimizer": {"state": {name: {key: value}}, "param_groups": [...]}}."""
    import torch

    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    path = Path(ckpt_dir) / f"{role}.pt"
    if not path.is_file():
        raise CheckpointError(f"{path}: no {role} in this checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: not a checkpoint file ({type(exc).__name__})") from None


def read_full_role(ckpt_dir: Path, role: str) -> dict[str, Tensor]:
    """The full weights of `role` ("actor" or "critic") in canonical names, as the run held them last."""
    return dict(read_full_state(ckpt_dir, role)["model"])
