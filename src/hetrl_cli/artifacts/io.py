"""Reading and writing artifacts: `-` means stdin/stdout, writes are atomic, loads are checked.

Every load names the file and the first offending field, so a bad artifact is one readable line.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from hetrl_cli.artifacts.base import Artifact
from hetrl_cli.errors import BadInput

A = TypeVar("A", bound=Artifact)

STDIO = "-"


def read_text(path: str | Path) -> str:
    """Read a file, or stdin for `-`."""
    if str(path) == STDIO:
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text") from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    if str(path) == STDIO:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_current_umask())  # mkstemp makes 0600; artifacts get ordinary file modes
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def format_validation_error(where: str, err: ValidationError) -> str:
    """One line: where, which field, what is wrong (pydantic's first error; the count of the rest)."""
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = len(err.errors()) - 1
    tail = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return f"{where}: field '{loc}': {first['msg']}{tail}"


def parse_artifact(text: str, cls: type[A], where: str) -> A:
    """Parse JSON text into `cls`, refusing another kind or a newer schema version."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a JSON object with 'kind' and 'schema_version'")
    kind = data.get("kind")
    if kind != cls.KIND:
        raise BadInput(f"{where}: is a '{kind}' artifact, expected '{cls.KIND}'")
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise BadInput(f"{where}: 'schema_version' must be a positive integer, got {version!r}")
    if version > cls.SCHEMA_VERSION:
        raise BadInput(
            f"{where}: schema_version {version} is newer than this hetrl understands "
            f"({cls.SCHEMA_VERSION}); upgrade hetrl"
        )
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise BadInput(format_validation_error(where, exc)) from None


def load_artifact(path: str | Path, cls: type[A]) -> A:
    """Load an artifact from a path or `-` (stdin)."""
    where = "<stdin>" if str(path) == STDIO else str(path)
    return parse_artifact(read_text(path), cls, where)


def dump_artifact(artifact: Artifact) -> str:
    """Serialise to indented JSON with a trailing newline (diff-friendly)."""
    return artifact.model_dump_json(indent=2, exclude_none=False) + "\n"


def save_artifact(artifact: Artifact, path: str | Path) -> None:
    """Write an artifact atomically to a path, or to stdout for `-`."""
    write_text_atomic(path, dump_artifact(artifact))
