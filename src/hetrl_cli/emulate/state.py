"""state.json: every thing `up` creates, recorded BEFORE it is created, so `down` can remove it after a crash.

Resources, in creation order (down removes them in reverse kind order, see api.py):
  {"type": "bridge" | "veth" | "netns", "name": ...}    network objects in this machine's root namespace
  {"type": "cgroup", "path": ...}                      one directory per host and controller
  {"type": "process", "pid": N, "marker": CONFIG}      an sshd; `marker` must be in its cmdline to be ours
  {"type": "path", "path": ...}                        files and folders written into the state dir
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetrl_cli.artifacts.io import write_text_atomic
from hetrl_cli.errors import BadInput

STATE_FILE = "state.json"
KIND = "emulated-cluster-state"
SCHEMA_VERSION = 1


@dataclass
class State:
    """The record of one emulated cluster; `record` writes it to disk at once."""

    path: Path
    resources: list[dict[str, Any]] = field(default_factory=list)
    spec: str = ""
    complete: bool = False
    """Set when `up` finished; a state that is not complete is a crashed or failed `up`."""

    def record(self, **resource: Any) -> None:
        """Note a resource about to be created (before, so a crash right after creation is still covered)."""
        if resource not in self.resources:
            self.resources.append(resource)
            self.save()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.resources if r["type"] == kind]

    def save(self) -> None:
        data = {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "spec": self.spec,
            "complete": self.complete,
            "resources": self.resources,
        }
        write_text_atomic(self.path, json.dumps(data, indent=2) + "\n")


def load_state(state_dir: Path) -> State | None:
    """The state in `state_dir`, or None when there is none; a damaged file is BadInput (down still sweeps)."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("kind") != KIND or not isinstance(data.get("resources"), list):
            raise ValueError("not an emulated-cluster state")
        resources = [r for r in data["resources"] if isinstance(r, dict) and "type" in r]
    except (ValueError, OSError, AttributeError) as exc:
        raise BadInput(f"{path}: unreadable state ({exc})") from None
    return State(path=path, resources=resources, spec=str(data.get("spec", "")), complete=bool(data.get("complete")))
