"""Shared base for every JSON artifact: strict fields, a `kind` tag and a `schema_version`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

MAX_NAME_CHARS = 200


def check_artifact_name(name: str) -> str:
    """A profile's or plan's `name` becomes a file or directory name (plans/NAME.json, runs/NAME-TIME/): it
    may not leave its folder or hide itself (no '/', '\\', leading '.', control characters). ValueError
    otherwise."""
    if not name or len(name) > MAX_NAME_CHARS:
        raise ValueError(f"a name of 1 to {MAX_NAME_CHARS} characters is expected, got {len(name)}")
    if "/" in name or "\\" in name or name.startswith(".") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(
            f"name {name!r} would leave its folder or hide itself: use letters, digits, '-', '_' and '.' (not first)"
        )
    return name


class Strict(BaseModel):
    """Unknown fields are errors, so a typo in a hand-edited file never passes silently."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=False)


class Artifact(Strict):
    """A top-level artifact. Subclasses pin `kind` with a Literal and set SCHEMA_VERSION."""

    SCHEMA_VERSION: ClassVar[int] = 1
    KIND: ClassVar[str] = ""

    kind: str
    """What this file is (`cluster-profile`, `workload`, `plan`, `run-summary`)."""
    schema_version: int = 1
    """Version of this kind's schema; readers refuse versions newer than they know."""
