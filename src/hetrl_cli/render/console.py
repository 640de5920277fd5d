"""The consoles `show`, `run`, `validate`, `calibrate` and the CLI's messages print through.

On a terminal rich fits output to the window. Off one (a pipe, a file, a CI log) rich would assume 80 columns
and wrap sentences mid-word and squeeze tables. There, a $COLUMNS the user set is honoured as the width to fit;
without it every line stays whole instead: plain lines never wrap, and tables and the timeline get
OFF_TERMINAL_WIDTH columns.
"""

from __future__ import annotations

import os

from rich.console import Console

OFF_TERMINAL_WIDTH = 200
"""Columns for tables and the timeline when no terminal says how wide it is."""


def make_console(*, stderr: bool = False) -> Console:
    """A console for people on a terminal and for logs elsewhere (see the module docstring)."""
    console = Console(stderr=stderr, highlight=False)
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return Console(stderr=stderr, highlight=False, width=int(columns))
    return Console(stderr=stderr, highlight=False, width=OFF_TERMINAL_WIDTH, soft_wrap=True)
