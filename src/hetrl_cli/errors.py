"""The error types every stage raises; the CLI maps each to one line and an exit code.

Exit codes (DESIGN.md): 0 ok, 1 runtime failure, 2 bad input, 3 infeasible plan.
"""

from __future__ import annotations


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
