"""The runtime on one GPU (issues 21 and 23): `hetrl profile`, then `hetrl run` of a random-initialised Qwen3-1.7B
GRPO step (colocated, bf16, NCCL world size 1, hf engine), and the hf engine alone (sharded loading, bounded
generation, bucketed weight loading), each next to the cost model's prediction.

One part per call, so bench/gpu_run.sh can put each under its own `timeout` and go on past a failure; every
part writes OUT/part-NAME.json (status, what it measured, what the plan or the cost model predicts), and
`report` merges them into OUT/gpu_run.json and OUT/gpu_run.md (the tables for docs/benchmarks.md):

    model    WORK/model: Qwen3-1.7B's real config (below), random weights in bf16, the tiny byte-level tokenizer
             (no hub: token ids of the sampled responses above its 384 decode to nothing, which the toy reward
             scores 0; the work per token is the real model's)
    profile  `hetrl profile`'s code on localhost (bench/gpu_check.profile_host) -> OUT/profile.json
    plan     the planner on that profile (hybrid search: no ILP solver needed) -> OUT/plan.json
    run      `hetrl run`'s code (runtime.api.run_plan) for --steps steps, engine hf, no checkpoints; step time,
             per-phase time and peak GPU memory against the plan (from summary.json and metrics.jsonl)
    engine   runtime.engines.hf.HFEngine on the model directory: load peak vs steady (runtime/loading.py), then
             sampled generation of B x R tokens (peak memory, decode tokens/s) and `load_weights` of the
             weights in 256 MiB buckets, against CostModel.task("generation")
    report   gpu_run.json + gpu_run.md from the parts found

`--dry-run` runs every part on the CPU with a small Qwen3 of the same family and tiny shapes (2 steps):
tests/test_gpu_run.py runs it, so the script is exercised here although no GPU is. The GPU image has torch,
transformers and accelerate but no vLLM (nor room for it): vLLM on CUDA is not part of this check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

QWEN3_1_7B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
"""Qwen/Qwen3-1.7B's config.json (its token ids aside: the tiny tokenizer's are used)."""
DRY_RUN_MODEL = QWEN3_1_7B | {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                              "max_window_layers": 2, "vocab_size": 384, "max_position_embeddings": 512}  # fmt: skip
SHAPES = {"gpu": {"prompts": 8, "responses": 4, "prompt": 64, "response": 128, "micro_batch": 8, "steps": 10},
          "dry": {"prompts": 2, "responses": 2, "prompt": 32, "response": 8, "micro_batch": 4, "steps": 2}}  # fmt: skip
"""Per step B = prompts x responses sequences of up to `prompt` + `response` tokens (random weights rarely
emit EOS, so responses run to `response`)."""


def _shapes(args: argparse.Namespace) -> dict[str, int]:
    shapes = dict(SHAPES["dry" if args.dry_run else "gpu"])
    if args.steps:
        shapes["steps"] = args.steps
    return shapes


def _device(args: argparse.Namespace) -> str:
    import torch

    return "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda:0"


def _write(out: Path, name: str, result: dict[str, Any]) -> None:
    (out / f"part-{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


# ---- parts -------------------------------------------------------------------------------------------------


def part_model(args: argparse.Namespace) -> dict[str, Any]:
    """Random Qwen3 weights built on the device in bf16, saved with save_pretrained, with the tiny tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from hetrl_cli.runtime.tinymodel import build_tokenizer

    target = Path(args.work) / "model"
    tokenizer = build_tokenizer(0)
    fields = {k: v for k, v in (DRY_RUN_MODEL if args.dry_run else QWEN3_1_7B).items() if k != "architectures"}
    config = Qwen3Config(**fields, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    device = _device(args)
    started = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    params = sum(p.numel() for p in model.parameters())
    return {"dir": str(target), "params": params, "device": device, "seconds": time.perf_counter() - started,
            "bytes_on_disk": sum(f.stat().st_size for f in target.glob("*.safetensors"))}  # fmt: skip


def part_profile(args: argparse.Namespace) -> dict[str, Any]:
    """`hetrl profile`'s code on localhost (what bench/gpu_check.py runs)."""
    import gpu_check

    profile, info = gpu_check.profile_host(Path(args.out), quick=args.dry_run or args.quick)
    if profile is None:
        raise RuntimeError(info.get("note", "no profile"))
    return info


def _workload(args: argparse.Namespace, shapes: dict[str, int]):
    from hetrl_cli.artifacts.workload import LengthDistribution, ModelSpec, Workload

    return Workload(
        name="gpu-run-qwen3-1.7b" if not args.dry_run else "gpu-run-dry",
        algorithm="grpo",
        actor=ModelSpec(path=str(Path(args.work) / "model")),
        prompts_per_step=shapes["prompts"],
        responses_per_prompt=shapes["responses"],
        max_prompt_tokens=shapes["prompt"],
        max_response_tokens=shapes["response"],
        response_length=LengthDistribution(mean_fraction=1.0, p99_fraction=1.0),
        micro_batch=shapes["micro_batch"],
        precision="bf16",
        optimizer="adamw",
        dataset={"kind": "toy"},
        reward_rule="toy",
    )


def _profile(args: argparse.Namespace):
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.profile import ClusterProfile

    return load_artifact(Path(args.out) / "profile.json", ClusterProfile)


def part_plan(args: argparse.Namespace) -> dict[str, Any]:
    """`hetrl plan`'s code: the hybrid search on the profile (one device: every task colocated on it)."""
    from hetrl_cli.artifacts.io import save_artifact
    from hetrl_cli.planner.api import make_plan

    plan = make_plan(_profile(args), _workload(args, _shapes(args)), solver="hybrid", budget_s=5.0, name="gpu-run")
    save_artifact(plan, Path(args.out) / "plan.json")
    return {"iteration_s": plan.cost.iteration_s, "weight_sync_s": plan.cost.weight_sync_s,
            "breakdown": plan.cost.breakdown, "memory_per_device": plan.memory_per_device, "tasks": _plan_tasks(plan),
            "groups": [g.model_dump() for g in plan.groups]}  # fmt: skip


def _plan_tasks(plan) -> dict[str, Any]:
    return {t.task: {"predicted_s": t.predicted.total_s, "memory_bytes": t.memory_bytes, "tp": t.tp, "pp": t.pp,
                     "dp": t.dp} for t in plan.tasks}  # fmt: skip


def part_run(args: argparse.Namespace) -> dict[str, Any]:
    """`hetrl run`'s code on the plan; the summary's measured-vs-predicted rows and the steps' phase times."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime.api import RunOptions, run_plan

    plan = load_artifact(Path(args.out) / "plan.json", Plan)
    run_dir = Path(args.work) / "run"
    options = RunOptions(steps=_shapes(args)["steps"], run_dir=run_dir, engine="hf", checkpoint_every=0,
                         tensorboard=False, profile=Path(args.out) / "profile.json",
                         timeout_s=float(args.run_timeout))  # fmt: skip
    summary = run_plan(plan, options)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    result = {
        "status_of_run": summary.status,
        "backend": json.loads((run_dir / "launch.json").read_text()).get("backend"),
        "predicted_iteration_s": plan.cost.iteration_s,
        "iteration": summary.iteration.model_dump() if summary.iteration else None,
        "tasks": [t.model_dump() for t in summary.tasks],
        "memory": [m.model_dump() for m in summary.memory],
        "steps": [{"step": m["step"], "step_s": m["step_s"], "seconds": m["seconds"],
                   "weight_sync_s": m.get("weight_sync_s"), "reward_mean": m.get("reward_mean")} for m in lines],
    }  # fmt: skip
    if summary.status != "completed":  # what it measured stays in the part's record
        result.update(status="failed", reason=f"run {summary.status}: {summary.error}"[:3000])
    return result


def _meter(device: str) -> tuple[Callable[[], None], Callable[[], dict[str, int]]]:
    """(reset, read): peak and current bytes on the device (torch's allocator on CUDA, the resident set on CPU)."""
    import torch

    from hetrl_cli.runtime import tracking

    def reset() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        else:
            tracking._reset_hwm()

    def read() -> dict[str, int]:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            return {"peak": torch.cuda.max_memory_allocated(device), "now": torch.cuda.memory_allocated(device)}
        rss = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
        return {"peak": tracking.rss_high_water_bytes(), "now": rss}

    return reset, read


def part_engine(args: argparse.Namespace) -> dict[str, Any]:
    """The hf engine alone: load (this rank's piece, meta device + safetensors), generate, load weights."""
    import torch

    from hetrl_cli.runtime.engines import Sampling, buckets
    from hetrl_cli.runtime.engines.hf import HFEngine
    from hetrl_cli.runtime.loading import load_shard

    shapes, device = _shapes(args), _device(args)
    model_dir = Path(args.work) / "model"
    reset, read = _meter(device)
    out: dict[str, Any] = {"device": device}
    reset()
    before = read()["now"]
    started = time.perf_counter()
    engine = HFEngine(model_dir, device=device, dtype="bf16", batch_size=256)
    after = read()
    out["load"] = {"seconds": time.perf_counter() - started, "steady_bytes": after["now"] - before,
                   "peak_bytes": after["peak"] - before}  # fmt: skip
    out["load"]["peak_over_steady"] = out["load"]["peak_bytes"] / max(1, out["load"]["steady_bytes"])
    batch = shapes["prompts"] * shapes["responses"]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 384, (shapes["prompt"],), generator=g).tolist() for _ in range(batch)]

    def generate(new_tokens: int) -> tuple[float, int]:
        sampling = Sampling(
            max_new_tokens=new_tokens,
            temperature=1.0,
            seeds=tuple(range(batch)),
            eos_token_id=3,
            pad_token_id=1,
            suppress_ids=(0, 1, 2, 3),
        )  # EOS suppressed: exactly new_tokens each
        reset()
        start = time.perf_counter()
        rows = engine.generate(prompts, sampling)
        seconds = time.perf_counter() - start
        return seconds, sum(len(r) for r in rows)

    generate(2)  # warm-up
    prefill_s, _ = generate(1)
    total_s, tokens = generate(shapes["response"])
    peak = read()["peak"]
    out["generation"] = {"batch": batch, "prompt": shapes["prompt"], "new_tokens": shapes["response"],
                         "seconds": total_s, "prefill_s": prefill_s, "tokens": tokens,
                         "decode_tokens_per_s": batch * (shapes["response"] - 1) / max(1e-9, total_s - prefill_s),
                         "peak_bytes": peak, "weights_bytes": after["now"] - before}  # fmt: skip
    source = load_shard(model_dir, device="cpu", dtype="bf16").shard.held  # what a trainer would send
    nbytes = sum(p.numel() * p.element_size() for _, p in source)
    reset()
    start = time.perf_counter()
    engine.load_weights(buckets((n, p.detach()) for n, p in source))
    seconds = time.perf_counter() - start
    out["weight_load"] = {"bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / max(1e-9, seconds) / 1e9,
                          "peak_over_weights_bytes": read()["peak"] - out["generation"]["weights_bytes"]}  # fmt: skip
    out["predicted"] = _predict_generation(args, shapes)
    pred = out["predicted"]
    if pred.get("seconds"):
        out["generation"]["predicted_tokens_per_s"] = batch * shapes["response"] / pred["seconds"]
    return out


def _predict_generation(args: argparse.Namespace, shapes: dict[str, int]) -> dict[str, Any]:
    """CostModel.task("generation") of B sequences alone on the profile's first device."""
    from hetrl_cli.costmodel.model import CostModel
    from hetrl_cli.costmodel.types import TaskPlacement

    profile = _profile(args)
    device = profile.devices[0].id
    est = CostModel(profile, _workload(args, shapes)).task(TaskPlacement("generation", (((device,),),)))
    return {"seconds": est.cost.total_s, "terms": {k: v for k, v in est.terms.items() if v},
            "memory_bytes": est.memory_bytes.get(device)}  # fmt: skip


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "model": part_model, "profile": part_profile, "plan": part_plan, "run": part_run, "engine": part_engine,
}  # fmt: skip


# ---- report ------------------------------------------------------------------------------------------------


def report(out: Path) -> dict[str, Any]:
    """Every part's result (or that it did not run) in gpu_run.json, and the tables in gpu_run.md."""
    result: dict[str, Any] = {}
    for name in PARTS:
        path = out / f"part-{name}.json"
        result[name] = json.loads(path.read_text()) if path.exists() else {"status": "not run (timed out?)"}
    (out / "gpu_run.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "gpu_run.md").write_text(markdown(result))
    return result


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# gpu_run", "", "| part | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {part.get('status')} | {part.get('wall_s', '-')} |" for name, part in result.items()]
    run = result.get("run", {})
    if run.get("status") == "ok":
        lines += ["", f"Backend {run.get('backend')}; iteration predicted {_sec(run.get('predicted_iteration_s'))}.",
                  "", "| task | predicted | measured (median) | predicted peak | measured peak |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for task in [run.get("iteration") or {}, *run.get("tasks", [])]:
            if task:
                times = f"{_sec(task.get('predicted_s'))} | {_sec(task.get('measured_s'))}"
                peaks = f"{_gib(task.get('predicted_memory_bytes'))} | {_gib(task.get('peak_memory_bytes'))}"
                lines.append(f"| {task['task']} | {times} | {peaks} |")
    engine = result.get("engine", {})
    if engine.get("status") == "ok":
        gen, pred, load, sync = engine["generation"], engine["predicted"], engine["load"], engine["weight_load"]
        lines += ["", "| hf engine | measured | cost model |", "|---|---|---|",
                  f"| load peak / steady | {_gib(load['peak_bytes'])} / {_gib(load['steady_bytes'])} | - |",
                  f"| generation {gen['batch']} x {gen['new_tokens']} | {_sec(gen['seconds'])} | "
                  f"{_sec(pred.get('seconds'))} |",
                  f"| decode tokens/s | {gen['decode_tokens_per_s']:.0f} | "
                  f"{gen.get('predicted_tokens_per_s', 0):.0f} (whole generation) |",
                  f"| generation peak | {_gib(gen['peak_bytes'])} | {_gib(pred.get('memory_bytes'))} |",
                  f"| bucketed load_weights | {sync['gb_per_s']:.2f} GB/s | - |"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=[*PARTS, "report"])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results" / "gpu_run"))
    parser.add_argument("--work", help="model and run directory (default OUT/work)")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, a small Qwen3, tiny shapes")
    parser.add_argument("--quick", action="store_true", help="the quick profile probe")
    parser.add_argument("--steps", type=int, help="steps of the run (default 10; 2 with --dry-run)")
    parser.add_argument("--run-timeout", type=float, default=600.0, help="limit of `hetrl run`'s launch")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or str(out / "work")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.part == "report":
        report(out)
        return 0
    started = time.monotonic()
    try:
        result = {"status": "ok", **PARTS[args.part](args)}
    except Exception as exc:  # recorded, so the report says which part failed and why
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:3000],
                  "trace": "".join(traceback.format_exc().splitlines(keepends=True)[-8:])}  # fmt: skip
    result["wall_s"] = round(time.monotonic() - started, 1)
    _write(out, args.part, result)
    print(f"gpu_run {args.part}: {result['status']} in {result['wall_s']} s", file=sys.stderr, flush=True)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
