"""The `hf` rollout engine: a transformers model's greedy decode loop (hfdecode.py: `generate`'s tokens without its
per-token bookkeeping) on a private (TP-sharded) copy of the policy.

Sampling is seeded per sequence (a Gumbel-max logits processor with one generator per row), so a sequence's tokens
depend on its seed and the weights, not on which replica or batch it landed in. Its KV cache lives only inside
one decode call; asleep it holds its weights in host memory (level 1) or nothing (level 2).
"""

from __future__ import annotations

from collections.abc import Iterable
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

if TYPE_CHECKING:
    from torch import Tensor


def build(at: EngineBuild) -> HFEngine:
    """The registry's builder: on the rank's device, sharded like the rank's generation placement."""
    return HFEngine(at.model_dir, device=at.device, dtype=at.dtype, parallel=at.parallel)


NOISE_BYTES = 32 * 2**20
"""At most this much sampling noise (fp32) is drawn at once per batch: one token's worth when the vocabulary is
large, so generation's peak does not grow with the response length."""


class _SeededGumbel:
    """A logits processor that samples with per-row generators: argmax(logits / T + Gumbel) ~ softmax(logits / T).

    Used with greedy decoding (argmax of its scores; hfdecode.py does the rest: caching, EOS, padding) while each
    row's randomness comes from its own seed rather than the process-global RNG. It is also a transformers logits
    processor, which tests use to check the decode loop against `generate`.
    """

    def __init__(
        self, seeds: tuple[int, ...], temperature: float, suppress_ids: tuple[int, ...], steps: int = 1
    ) -> None:
        import torch

        self.temperature = temperature
        self.suppress_ids = list(suppress_ids)
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.steps, self.used, self.noise = max(1, steps), 0, None
        self.drawn = 0
        """Tokens of noise drawn so far (a window at a time)."""
        self.host: Tensor | None = None
        """The host buffer the noise is drawn into (the generators are CPU ones)."""

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        import torch

        scores = scores.float().clone()
        scores[:, self.suppress_ids] = float("-inf")
        if self.temperature <= 0:
            return scores
        if self.noise is None or self.used == self.noise.shape[1]:
            # Each row's noise for a window of tokens in one draw: the generator yields the same stream as one
            # draw per token (so the same samples, whatever the window) in a few large ops instead of ~10 small
            # ones a token (bench/run_overhead). The window is bounded by NOISE_BYTES, not the response length:
            # 64 rows x 1024 tokens x a 152k vocabulary would be 37 GiB at once; a small vocabulary still draws
            # a whole response at a time.
            rows, vocab = scores.shape
            window = max(1, min(self.steps - self.drawn, NOISE_BYTES // (4 * rows * vocab)))
            # Drawn and transformed in place in one host buffer, reused while the window's size holds: fresh
            # [rows, window, vocabulary] temporaries each window (and new [rows, vocabulary] scores each token)
            # fragmented glibc's heap once its dynamic mmap threshold had moved past them: 16 rows x 152k x 512
            # steps grew the RSS by 1.0-4.6 GB where this holds it at 0.16-0.33 GB (tests/runtime/test_precision.py)
            if self.host is None or self.host.shape[1] != window:
                self.host = torch.empty((rows, window, vocab))
            for row, g in enumerate(self.generators):
                torch.rand(window, vocab, generator=g, out=self.host[row])
            self.host.clamp_(1e-10, 1.0 - 1e-7).log_().neg_().log_().neg_()
            self.noise = self.host.to(scores.device)
            self.used, self.drawn = 0, self.drawn + window
        self.used += 1
        return scores.div_(self.temperature).add_(self.noise[:, self.used - 1])


class HFEngine(RolloutEngine):
    """A decode loop (hfdecode.py) on a private copy of the policy; prompts left-padded, batches of `batch_size`.

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
        from hetrl_cli.runtime.loading import load_shard
        from hetrl_cli.runtime.parallel import Parallel

        par = parallel or Parallel.single()
        if par.pos.stages > 1:
            raise ValueError("the hf engine does not pipeline generation (pp must be 1)")
        self.shard = load_shard(model_dir, par, device, dtype).shard  # this rank's TP slices only
        self.model = self.shard.model
        head = self.model.get_output_embeddings()
        if head is not None:  # transformers hands the head a strided last-position view (hidden[:, -1:, :])
            head.register_forward_pre_hook(_contiguous_inputs)
        self.device = device
        self.batch_size = batch_size
        self.asleep = 0
        self._shapes: dict[int, tuple[Any, ...]] = {}
        """Level 2: each dropped parameter's (shape, dtype), to allocate it again."""

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[list[int]]:
        if self.asleep:
            raise RuntimeError(f"the hf engine is asleep (level {self.asleep}): wake() it before generate")
        out: list[list[int]] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = prompts[start : start + self.batch_size]
            seeds = sampling.seeds[start : start + self.batch_size]
            out.extend(self._generate_batch(chunk, sampling, seeds))
        return out

    def _generate_batch(self, prompts: list[list[int]], sampling: Sampling, seeds: tuple[int, ...]) -> list[list[int]]:
        import torch

        from hetrl_cli.runtime.engines.hfdecode import decode

        sampler = _SeededGumbel(seeds, sampling.temperature, sampling.suppress_ids, sampling.max_new_tokens)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), sampling.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        # inference mode, not just no_grad: no version counters or autograd metadata on the cache and activations
        # (~4 % of a small model's generate on CPU, bench/run_vs_loop.py); the same kernels, the same tokens.
        # hfdecode.decode: generate's greedy loop (the same model calls, the same tokens) without its per-token
        # bookkeeping
        with torch.inference_mode():
            new = decode(self.model, ids.to(self.device), mask.to(self.device), sampling.max_new_tokens,
                         lambda logits: sampler(ids, logits).argmax(dim=-1), sampling.eos_token_id,
                         sampling.pad_token_id)  # fmt: skip
        rows = new.tolist()
        return [cut_at_eos(row, sampling.eos_token_id, sampling.pad_token_id) for row in rows]

    def load_weights(self, named_buckets: Iterable[Bucket]) -> None:
        """Each bucket's full tensors into this rank's (TP) pieces in place; asleep at level 2 the weights are
        allocated on the device first (they are all about to be overwritten)."""
        if self._shapes:
            self._materialise()
        for bucket in named_buckets:
            self.shard.load_full(bucket)

    def sleep(self, level: int = 2) -> None:
        """Level 1: weights to host memory; level 2: weights dropped (load_weights allocates them again). Its KV
        cache is already gone (it lives inside one decode call); on CUDA the freed blocks go back to the driver."""
        import torch

        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.asleep:
            return
        with torch.no_grad():
            for _, param in self._params():
                if level == 1:
                    param.data = param.data.to("cpu")
                else:
                    self._shapes[id(param)] = (tuple(param.shape), param.dtype)
                    param.data = torch.empty(0, dtype=param.dtype, device=self.device)
        self.asleep = level
        _release(self.device)

    def wake(self) -> None:
        """Weights back on the device (level 1) or allocated for the next load (level 2: the caller loads them)."""
        import torch

        if self.asleep == 1:
            with torch.no_grad():
                for _, param in self._params():
                    param.data = param.data.to(self.device)
        self._materialise()  # level 2 and no load since: allocated, contents undefined until the next load
        self.asleep = 0

    def _materialise(self) -> None:
        import torch

        with torch.no_grad():
            for _, param in self._params():
                dropped = self._shapes.pop(id(param), None)
                if dropped is not None:
                    param.data = torch.empty(dropped[0], dtype=dropped[1], device=self.device)

    def _params(self):
        """Every distinct parameter of the model (a tied head once)."""
        seen: set[int] = set()
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if id(param) not in seen:
                seen.add(id(param))
                yield name, param

    def memory_report(self) -> EngineMemory:
        on_device = sum(p.numel() * p.element_size() for _, p in self._params() if str(p.device) == self.device)
        return EngineMemory(self.device, on_device, 0, self.asleep, process_bytes(self.device))

    def weights_checksum(self) -> str:
        """Of the full weights: with TP the shards are gathered first (collective over the TP group)."""
        full = self.shard.full_weights(everyone=True)
        assert full is not None
        return checksum_named(full)


def _contiguous_inputs(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The head's input made contiguous (a [batch, 1, hidden] copy: kilobytes): torch's CPU bf16 linear of a strided
    view converts the whole head first, 1.1 GB a call for a 152k x 256 head (measured), every prefill."""
    return tuple(a.contiguous() if hasattr(a, "contiguous") else a for a in args)


def _release(device: str) -> None:
    """Hand freed device memory back (CUDA's caching allocator keeps it otherwise)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
