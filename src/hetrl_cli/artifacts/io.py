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
from hetrl_cli.errors import BadInput, Unwritable, one_line

A = TypeVar("A", bound=Artifact)

STDIO = "-"


def read_text(path: str | Path) -> str:
    """Read a file, or stdin for `-`: at most MAX_ARTIFACT_CHARS, so a path to /dev/zero (or an endless pipe) is
    refused at once instead of filling memory, and a FIFO without a writer as empty instead of a hang."""
    where = "<stdin>" if str(path) == STDIO else str(path)
    try:
        if str(path) == STDIO:
            text = sys.stdin.read(MAX_ARTIFACT_CHARS + 1)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO nobody writes to reads as empty, never waits
            os.set_blocking(fd, True)
            with open(fd, encoding="utf-8") as fh:
                text = fh.read(MAX_ARTIFACT_CHARS + 1)
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise BadInput(f"{where}: not UTF-8 text") from None
    except OSError as exc:  # no permission, a socket, a broken device
        raise BadInput(f"{where}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(text) > MAX_ARTIFACT_CHARS:
        raise BadInput(f"{where}: more than an artifact or input file may be ({MAX_ARTIFACT_CHARS // 2**20} MiB)")
    return text


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    if str(path) == STDIO:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        _write_special(target, text)  # /dev/null, a FIFO, /dev/stdout: replacing it by a file would break it
        return
    if target.is_dir():
        raise Unwritable(f"{path}: is a directory; name a file in it (e.g. {target / 'out.json'})")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise Unwritable(f"{path}: cannot write here ({exc.strerror}); choose a writable path") from None
    try:
        os.fchmod(fd, 0o666 & ~_current_umask())  # mkstemp makes 0600; artifacts get ordinary file modes
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise Unwritable(f"{path}: cannot write here ({exc.strerror}); choose a writable path") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path) -> None:
    """Refuse an output path before the work that fills it (a plan search takes a minute): a directory, or a
    place whose nearest existing folder cannot be written. The write itself still reports what it meets."""
    if str(path) == STDIO:
        return
    target = Path(path)
    if target.is_dir():
        raise Unwritable(f"{path}: is a directory; name a file in it (e.g. {target / 'out.json'})")
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise Unwritable(f"{path}: cannot write here ({folder} is not a writable folder); choose a writable path")


def _write_special(target: Path, text: str) -> None:
    """Write straight into a device or pipe (there is no half-written file to avoid)."""
    try:
        with target.open("w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise Unwritable(f"{target}: cannot write here ({exc.strerror}); choose a writable path") from None


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def format_validation_error(where: str, err: ValidationError, every: bool = False) -> str:
    """One line: where, which field, what is wrong — pydantic's first error and the count of the rest, or
    with `every` all of them, `; `-separated (a hand-written file is better fixed in one round)."""
    errors = err.errors()

    def one(e: dict) -> str:
        loc = ".".join(str(part) for part in e["loc"]) or "(top level)"
        return f"field '{one_line(loc, 120)}': {one_line(e['msg'])}"  # a value echoed in it is the input's

    if every:
        return f"{where}: " + "; ".join(one(e) for e in errors)
    more = len(errors) - 1
    tail = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return f"{where}: {one(errors[0])}{tail}"


MAX_ARTIFACT_CHARS = 16 * 2**20
"""Larger input is refused before parsing: a plan for 1,000 hosts of 8 GPUs is 1.1 MiB, and unbounded input
would cost minutes of parsing and printing."""


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number hetrl accepts; write a finite number")


MAX_DIGITS = 300
"""Longer integers are refused while parsing: as a float they would be inf (past 1e308), and int() refuses 4,300
digits. Fields bound their own ranges; a seed past numpy's is refused by `run` with its own message."""


def _int_in_range(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number has too many digits (at most {MAX_DIGITS})")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # json reads 1e999 as inf, not as an error
        raise ValueError(f"{one_line(text, 40)} is out of range; write a finite number")
    return value


def _json_data(text: str, where: str) -> object:
    """json.loads with every failure as one line: syntax, inf/NaN, numbers too long, nesting too deep."""
    if not text.strip():
        raise BadInput(f"{where}: no input (empty); pass an artifact file or pipe one in")
    if len(text) > MAX_ARTIFACT_CHARS:
        raise BadInput(
            f"{where}: {len(text) / 2**20:.0f} MiB is more than an artifact may be ({MAX_ARTIFACT_CHARS // 2**20} MiB)"
        )
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_int_in_range, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply to be an artifact") from None
    except ValueError as exc:  # a constant refused above, or an integer over Python's digit limit
        reason = "a number has too many digits" if "digits" in str(exc) else str(exc)
        raise BadInput(f"{where}: {reason}") from None


def parse_artifact(text: str, cls: type[A], where: str) -> A:
    """Parse JSON text into `cls`, refusing another kind or a newer schema version. Fields are validated in
    pydantic's strict JSON mode: no boolean where a number belongs, no string where a number belongs."""
    data = _json_data(text, where)
    if not isinstance(data, dict):
        raise BadInput(f"{where}: expected a JSON object with 'kind' and 'schema_version'")
    kind = data.get("kind")
    if kind != cls.KIND:
        raise BadInput(f"{where}: is a '{one_line(str(kind), 60)}' artifact, expected '{cls.KIND}'")
    version = data.get("schema_version")
    if not isinstance(version, int) or version < 1:
        raise BadInput(f"{where}: 'schema_version' must be a positive integer, got {one_line(repr(version), 60)}")
    if version > cls.SCHEMA_VERSION:
        raise BadInput(
            f"{where}: schema_version {version} is newer than this hetrl understands "
            f"({cls.SCHEMA_VERSION}); upgrade hetrl"
        )
    return validate_json(text, cls, where)


def validate_json(text: str, cls: type[A], where: str) -> A:
    """`cls` from JSON text in strict mode, a ValidationError as one BadInput line."""
    try:
        return cls.model_validate_json(text, strict=True)
    except ValidationError as exc:
        raise BadInput(format_validation_error(where, exc)) from None
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply to be an artifact") from None


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
