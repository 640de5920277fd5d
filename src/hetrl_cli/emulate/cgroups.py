"""Slower "devices": each host's processes share a CPU quota (and optionally a memory limit) in a cgroup.

cgroup v1 (this machine: `cpu` at /sys/fs/cgroup/cpu): `cpu.cfs_quota_us` / `cpu.cfs_period_us`, nested in
this process's own cgroup of that controller, so any limit already on us still applies. cgroup v2: `cpu.max`
and `memory.max` in a child of the hierarchy's root (the only cgroup that may both hold processes and hand
controllers to children). A process joins by writing its pid to `cgroup.procs`; its children inherit it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hetrl_cli.emulate.system import kill_pids
from hetrl_cli.errors import BadInput, HetrlError

DEFAULT_PREFIX = "hetrl-emu-"
PREFIX_ENV = "HETRL_EMULATE_PREFIX"
_PREFIX_PATTERN = re.compile(r"^hetrl-[a-z0-9]{1,4}-$")
"""At most 11 characters, so a veth name (PREFIX + v199) stays within IFNAMSIZ (15)."""


def _prefix() -> str:
    """The name prefix of everything `up` makes and `down` sweeps: `hetrl-emu-`, or $HETRL_EMULATE_PREFIX.

    A second prefix lets a second cluster (a benchmark) live beside the tests' one: each `down` sweeps only
    its own prefix. Read once at import; a bad value is refused then, before anything is made."""
    value = os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)
    if not _PREFIX_PATTERN.match(value):
        raise BadInput(f"${PREFIX_ENV}={value!r}: use hetrl-XXXX- (1-4 lower-case letters or digits), e.g. hetrl-emb-")
    return value


PREFIX = _prefix()
SWEEP_DEPTH = 6
"""How deep under a controller's mount `down` looks for leftover groups by name."""


@dataclass(frozen=True)
class Controller:
    """Where groups of one controller are made, and in which cgroup version."""

    name: str
    version: int
    parent: Path


def _mounts() -> list[tuple[str, Path, set[str]]]:
    """(fstype, mount point, options) of every cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[2], Path(parts[1]), set(parts[3].split(","))))
    return found


def _own_v1_path(controller: str) -> str:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return "/"


def find_controller(name: str) -> Controller | None:
    """The v1 mount of `name` if there is one, else the v2 hierarchy if it offers `name`, else None."""
    mounts = _mounts()
    for fstype, point, options in mounts:
        if fstype == "cgroup" and name in options:
            return Controller(name, 1, point / _own_v1_path(name).lstrip("/"))
    for fstype, point, _ in mounts:
        available = point / "cgroup.controllers"
        if fstype == "cgroup2" and available.is_file() and name in available.read_text().split():
            return Controller(name, 2, point)
    return None


def controller_mounts() -> list[Path]:
    """Every mount a group of ours could be under (for the sweep by name)."""
    return [point for fstype, point, options in _mounts() if fstype == "cgroup2" or options & {"cpu", "memory"}]


def _write(path: Path, value: str, what: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise HetrlError(f"{what}: cannot write {value!r} to {path}: {exc.strerror}") from None


def group_path(controller: Controller, host: str) -> Path:
    return controller.parent / f"{PREFIX}{host}"


MIN_QUOTA_US = 1000
"""The kernel refuses a CFS quota (and a period) below 1 ms."""


def effective_period_us(cpu: float, period_us: int) -> int:
    """The period actually used: long enough that the quota `cpu × period` is at least the kernel's 1 ms."""
    return max(period_us, math.ceil(MIN_QUOTA_US / cpu))


def create_cpu_group(controller: Controller, host: str, cpu: float, period_us: int) -> Path:
    """A group whose processes together get `cpu` cores, enforced every `period_us`."""
    path = group_path(controller, host)
    what = f"cpu cgroup of host {host}"
    _mkdir(path, controller, what)
    period_us = effective_period_us(cpu, period_us)
    quota_us = round(cpu * period_us)
    if controller.version == 1:
        _write(path / "cpu.cfs_period_us", str(period_us), what)
        _write(path / "cpu.cfs_quota_us", str(quota_us), what)
    else:
        _write(path / "cpu.max", f"{quota_us} {period_us}", what)
    return path


def create_memory_group(controller: Controller, host: str, limit_bytes: int) -> Path:
    """A group whose processes together may use `limit_bytes` of memory."""
    path = group_path(controller, host)
    what = f"memory cgroup of host {host}"
    _mkdir(path, controller, what)
    _write(path / ("memory.limit_in_bytes" if controller.version == 1 else "memory.max"), str(limit_bytes), what)
    return path


def create_group(controller: Controller, name: str) -> Path:
    """A group with no limit of its own: it only lets `down` find a process of ours by name (the delay line)."""
    path = group_path(controller, name)
    _mkdir(path, controller, f"cgroup {path.name}")
    return path


def set_weight(controller: Controller, path: Path, factor: int) -> None:
    """The group's CPU weight, `factor` times the default (v1 cpu.shares 1024, v2 cpu.weight 100; v2 caps at
    10000): under contention it is woken and run before groups of default weight."""
    if controller.version == 1:
        _write(path / "cpu.shares", str(1024 * factor), f"cgroup {path.name}")
    else:
        _write(path / "cpu.weight", str(min(10000, 100 * factor)), f"cgroup {path.name}")


def join(path: Path, pid: int) -> None:
    """Move process `pid` (and the children it forks from now on) into the group."""
    _write(path / "cgroup.procs", str(pid), f"cgroup {path.name}")


def _mkdir(path: Path, controller: Controller, what: str) -> None:
    if controller.version == 2:
        _write(controller.parent / "cgroup.subtree_control", f"+{controller.name}", what)
    try:
        path.mkdir(exist_ok=True)  # under cgroup v2 the cpu and memory limits share one group
    except OSError as exc:
        raise HetrlError(f"{what}: cannot create {path}: {exc.strerror}") from None


def procs(path: Path) -> list[int]:
    """Pids in a group (empty when it is gone)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def remove_group(path: Path) -> bool:
    """Stop what still runs in the group, then remove it; False when it was not there."""
    if not path.is_dir():
        return False
    for _ in range(3):  # a process may fork while we kill its siblings
        pids = procs(path)
        if not pids:
            break
        kill_pids(pids)
    try:
        path.rmdir()
    except OSError as exc:
        raise HetrlError(f"cannot remove cgroup {path}: {exc.strerror} (processes left: {procs(path)})") from None
    return True


def sweep_groups() -> list[Path]:
    """Every cgroup directory named with our prefix, deepest first (found by name, for a lost state.json)."""
    found: list[Path] = []
    for mount in controller_mounts():
        base_depth = len(mount.parts)
        for root, dirs, _ in os.walk(mount):
            if len(Path(root).parts) - base_depth >= SWEEP_DEPTH:
                dirs[:] = []
                continue
            for d in list(dirs):
                if d.startswith(PREFIX):
                    found.append(Path(root) / d)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)
