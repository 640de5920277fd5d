"""bench/gpu_run.sh on this CPU (`--dry-run`): every part of the GPU script runs for real here on a small Qwen3,
so only its numbers wait for a GPU (issues 21 and 23)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from benchload import load_bench

REPO = Path(__file__).resolve().parent.parent
PARTS = ("model", "profile", "plan", "run", "engine")


def load_script() -> ModuleType:
    return load_bench("gpu_run")


def test_the_model_is_qwen3_1_7b() -> None:
    """The config written in code has the model card's 1.7 B parameters, 1.4 B without the (tied) embedding."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    fields = {k: v for k, v in load_script().QWEN3_1_7B.items() if k != "architectures"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**fields))
    params = sum(p.numel() for p in model.parameters())
    assert params == 1_720_574_976
    assert params - model.model.embed_tokens.weight.numel() == pytest.approx(1.41e9, rel=0.01)


def test_a_missing_part_is_reported_not_raised(tmp_path: Path) -> None:
    script = load_script()
    (tmp_path / "part-model.json").write_text(json.dumps({"status": "failed", "reason": "x", "wall_s": 1.0}))
    result = script.report(tmp_path)
    assert result["model"]["status"] == "failed" and result["run"]["status"].startswith("not run")
    assert "| model | failed | 1.0 |" in (tmp_path / "gpu_run.md").read_text()


@pytest.mark.slow
def test_dry_run_runs_every_part_on_the_cpu(tmp_path: Path) -> None:
    """profile, plan, a 2-step `hetrl run` (gloo on the CPU) and the hf engine, each ok, with the plan's and the
    cost model's predictions next to the measurements; the model and the run stay out of OUT."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "GPU_RUN_WORK": str(work), "HETRL_PROBE_QUICK": "1"}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_run.sh"), "--dry-run"], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "gpu_run.json").read_text())
    for name in PARTS:
        assert result[name]["status"] == "ok", (name, result[name].get("reason"), result[name].get("trace"))
    run = result["run"]
    assert run["backend"] == "gloo" and [s["step"] for s in run["steps"]] == [1, 2]
    tasks = {t["task"]: t for t in run["tasks"]}
    assert {"generation", "reference", "actor_train"} <= set(tasks)
    assert all(t["predicted_s"] > 0 and t["measured_s"] > 0 for t in tasks.values())
    assert run["iteration"]["predicted_s"] == pytest.approx(result["plan"]["iteration_s"])
    engine = result["engine"]
    assert engine["load"]["peak_over_steady"] <= 1.2 or engine["load"]["steady_bytes"] < 2**20
    assert engine["generation"]["tokens"] == engine["generation"]["batch"] * engine["generation"]["new_tokens"]
    assert engine["generation"]["decode_tokens_per_s"] > 0 and engine["predicted"]["seconds"] > 0
    assert engine["weight_load"]["gb_per_s"] > 0
    assert (out / "profile.json").exists() and (out / "plan.json").exists()
    assert not list(out.rglob("*.safetensors"))  # the model never lands where the device tool returns files from
    table = (out / "gpu_run.md").read_text()
    assert "| generation |" in table and "| decode tokens/s |" in table and table in done.stdout
