"""Ctrl-C in tests: the processes a test interrupts get SIGINT's default action back.

`make test &` (or any job a shell starts in the background) runs with SIGINT ignored, and children inherit
that: a Python child then never raises KeyboardInterrupt, so a test that presses Ctrl-C would wait forever.
Pass `preexec_fn=default_sigint` to the Popen whose process the test interrupts."""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """Runs in the child between fork and exec: SIGINT back to its default, so the child's Python installs
    its KeyboardInterrupt handler as it does when started from a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
