"""Load a script of bench/ as a module for a test: bench/ is not a package, its scripts import their siblings
(published imports published_figures) and their dataclasses look their module up in sys.modules by name."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/NAME.py executed as module NAME, registered in sys.modules (kept there) with bench/ importable."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    added = str(BENCH) not in sys.path
    if added:
        sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        if added:
            sys.path.remove(str(BENCH))
    return module


@contextlib.contextmanager
def bench_module(name: str) -> Iterator[ModuleType]:
    """`load_bench` for a fixture's lifetime: bench/ stays importable while the test runs (scripts import
    siblings lazily too) and the module and bench/ are gone from sys.modules and sys.path afterwards."""
    sys.path.insert(0, str(BENCH))
    try:
        yield load_bench(name)
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(str(BENCH))
