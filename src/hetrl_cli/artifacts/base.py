"""Shared base for every JSON artifact: strict fields, a `kind` tag and a `schema_version`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


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
