"""The `hf` rollout engine: transformers `generate` on a private (TP-sharded) copy of the policy.

Sampling is seeded per sequence (a Gumbel-max logits processor with one generator per row), so a sequence's tokens
depend on its seed and the weights, not on which replica or batch it landed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetrl_cli.runtime.engines import EngineBuild, Sampling, checksum_named, cut_at_eos

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
        self.drawn = 0
        """Tokens of noise drawn so far (a window at a time)."""

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
            uniform = torch.stack([torch.rand(window, vocab, generator=g) for g in self.generators])
            self.noise = (-torch.log(-torch.log(uniform.clamp(1e-10, 1.0 - 1e-7)))).to(scores.device)
            self.used, self.drawn = 0, self.drawn + window
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
