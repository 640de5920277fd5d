"""The error types every stage raises; the CLI maps each to one line and an exit code.

Exit codes (DESIGN.md): 0 ok, 1 runtime failure, 2 bad input, 3 infeasible plan.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: str, limit: int = 300) -> str:
    """`text` (a value from an input, echoed in a message) as one printable line of at most `limit` characters:
    control and bidi characters escaped, the middle cut. A hostile name can neither forge output lines nor
    flood the terminal.

    >>> print(one_line("a\\nb" + "x" * 400, limit=12))
    a\\nbx…xxxxxx
    """
    flat = _CONTROL.sub(lambda m: repr(m.group())[1:-1] if m.group().isascii() else f"\\u{ord(m.group()):04x}", text)
    if len(flat) <= limit:
        return flat
    keep = limit - 1
    return flat[: keep // 2] + "…" + flat[len(flat) - (keep - keep // 2) :]


class HetrlError(Exception):
    """A failure the user can act on: printed as one line, never as a traceback."""

    exit_code = 1


class BadInput(HetrlError):
    """Usage, parse or validation error in something the user gave us (file, flag, artifact)."""

    exit_code = 2


class Unwritable(BadInput, OSError):
    """An output path that cannot be written (a directory, a read-only or missing place): bad input for the
    CLI's one line, and still an OSError for library callers that handle file errors."""


class Infeasible(HetrlError):
    """No plan fits the cluster: the message names the binding constraint."""

    exit_code = 3


class RemoteError(HetrlError):
    """A host could not be reached or a command on it failed; the message names the host."""

    exit_code = 1
