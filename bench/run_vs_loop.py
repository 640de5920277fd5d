"""Step time of `hetrl run` against a hand-written GRPO loop and TRL's GRPOTrainer, same model, data, batch, steps.

The model: a random Qwen2 of ~2.5M parameters (BENCH_CONFIG, seed 0) saved with `save_pretrained` next to the
tiny model's byte-level tokenizer. The work of a step, on all three sides: the toy task's prompts (4 a step, the
same ones in the same order: `datasets.step_records`), 4 responses each (16 sequences) of up to 32 new tokens
sampled at temperature 1 from the full distribution, the toy reward, reference log-probs (KL coefficient 0.001,
k3 in the loss), GRPO advantages, one clipped update of the whole batch (one micro-batch of 16; the old log-probs
are the update's own forward, detached), Adam(W) at lr 1e-5 with no weight decay, gradient clipping at 1.0, fp32.

- hetrl: `hetrl run PLAN --engine hf --plain` of a one-rank plan (localhost/0 holding generation, reference,
  reward and actor_train: colocated GRPO); TensorBoard and peak-memory tracking on, as by default.
- hand loop: `run_overhead.grpo_loop` (plain torch/transformers in one process) with `reuse_old_logprobs`.
- TRL: `GRPOTrainer` (trl 1.13.0 in .venv-bench, `make setup-bench`) with num_generations 4, batch 16,
  steps_per_generation 1, num_iterations 1 (so no separate old log-prob pass), beta 0.001, loss_type dapo
  (token sum over the batch's tokens, as hetrl's), constant lr, transformers generation (no vLLM), on the CPU,
  fp32 and no gradient checkpointing (GRPOConfig's defaults are bf16 and checkpointing on; hetrl's workload has
  precision fp32 and recompute off).

Step time = wall time between consecutive step lines as they arrive (hetrl's report phase included; TRL's
logging included); also the CPU seconds of the working process. Rounds run the three sides in a rotating
order, so the machine's noise hits each alike; medians over the steps after `--warmup` of every round, and the
median of the per-round ratios. Per-phase medians: hetrl's metrics.jsonl `seconds` (and `weight_sync_s`), the
loop's own timers, TRL's `_generate_and_score_completions` (generation + reward + reference) and the rest of its
step.

Per-phase CPU seconds (`--cpu-rounds`, before the wall rounds, rotating alike): the same three commands with a
`sitecustomize` on PYTHONPATH that makes `time.perf_counter` return `time.process_time` in every process they
start, so each side's own phase timers (hetrl's worker Timer, the loop's, TRL's wrapper) count the working
process's CPU seconds (all its threads) instead of wall time. Nothing else changes: `hetrl run` launches its
worker as always (the variable reaches it through the launcher's environment). CPU seconds are what a shared box
disturbs least; they show how much of a phase is each side's own work rather than waiting for a core.

    .venv/bin/python bench/run_vs_loop.py [--rounds 5] [--steps 12] [--warmup 2] [--cpus 0] [--cpu-rounds 2]
    (~10 min on 2 idle cores; --cpus 0: every side pinned to core 0, one torch thread each: steadier on a box
    others load)
    → bench/results/run_vs_loop.json (docs/benchmarks.md quotes it)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import run_overhead

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "run_vs_loop.json"
HETRL = str(Path(sys.executable).with_name("hetrl"))
TRL_PYTHON = REPO / ".venv-bench" / "bin" / "python"
BENCH_CONFIG = {
    "vocab_size": 384,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}
PHASES = ("generation", "reference", "actor_train")
HETRL_PHASES = (*PHASES, "reward", "rollout_transfer", "experience_transfer")
CPU_CLOCK = (
    "import time\n\n"
    "time.perf_counter = time.process_time  # bench/run_vs_loop.py --cpu-rounds: phase timers count CPU seconds\n"
)


# ---- the shared inputs ---------------------------------------------------------------------------------------


def build_model(folder: Path) -> Path:
    """The random ~2.5M-parameter Qwen2 (seed 0) with the tiny tokenizer, saved as an HF directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hetrl_cli.runtime.tinymodel import build_tokenizer

    tokenizer = build_tokenizer(0)
    config = Qwen2Config(**BENCH_CONFIG, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def bench_workload(model_dir: Path):
    from hetrl_cli.artifacts.workload import ModelSpec, RLSpec, Workload

    return Workload(
        name="run-vs-loop", algorithm="grpo", actor=ModelSpec(path=str(model_dir)), prompts_per_step=4,
        responses_per_prompt=4, max_prompt_tokens=32, max_response_tokens=32, micro_batch=16, precision="fp32",
        optimizer="adam", dataset={"kind": "toy"}, reward_rule="toy",
        rl=RLSpec(lr=1e-5, kl_coef=0.001, clip_eps=0.2, grad_clip=1.0, temperature=1.0),
    )  # fmt: skip


def write_plan(workload, path: Path) -> None:
    """A one-rank plan: every GRPO task on localhost/0 (colocated)."""
    from hetrl_cli.artifacts.io import save_artifact
    from hetrl_cli.artifacts.plan import Plan, PlanCost, Replica, SolverStats, TaskCost, TaskGroup, TaskPlan

    device, layers = "localhost/0", BENCH_CONFIG["num_hidden_layers"]
    replica = Replica(stages=[[device]], batch_share=1.0, layer_split=[layers])
    tasks = [TaskPlan(task=t, group="g0", tp=1, pp=1, dp=1, replicas=[replica],
                      predicted=TaskCost(compute_s=0.1, total_s=0.1)) for t in workload.tasks]  # fmt: skip
    plan = Plan(
        name="run-vs-loop", created_at="2026-12-05T00:00:00Z", profile_name="localhost-bench",
        profile_fingerprint="sha256:bench", workload=workload,
        groups=[TaskGroup(name="g0", tasks=list(workload.tasks), devices=[device])], tasks=tasks,
        cost=PlanCost(iteration_s=1.0, samples_per_s=16.0, tokens_per_s=512.0, weight_sync_s=0.0),
        solver=SolverStats(solver="manual", status="heuristic"),
    )  # fmt: skip
    save_artifact(plan, path)


def load_workload(work: Path):
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan

    return load_artifact(work / "plan.json", Plan).workload


# ---- the sides that run in their own processes ------------------------------------------------------------------


def loop_main(work: Path, steps: int) -> None:
    wl = load_workload(work)
    run_overhead.grpo_loop(wl, Path(wl.actor.path), steps, reuse_old_logprobs=True)


def trl_main(work: Path, steps: int) -> None:
    """TRL's GRPOTrainer on the same model, prompts, batch and steps; prints `step N/M tokens T phases {...}`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hetrl_cli.profiling.probe import usable_cores
    from hetrl_cli.runtime.datasets import load_records, step_records
    from hetrl_cli.runtime.rewards import char_fraction_reward
    from hetrl_cli.runtime.tinymodel import load_tokenizer

    wl = load_workload(work)
    torch.set_num_threads(max(1, int(usable_cores())))  # what hetrl's one-rank worker sets
    records = load_records(wl.dataset.kind, wl.dataset.path, wl.seed)
    ordered = [r for s in range(1, steps + 1) for r in step_records(records, s, wl.prompts_per_step, wl.seed)]
    data = Dataset.from_list([{"prompt": r.prompt, "answer": r.answer} for r in ordered])

    def toy_reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
        return [char_fraction_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    group = wl.responses_per_prompt
    config = GRPOConfig(
        output_dir=str(work / "trl"), per_device_train_batch_size=wl.prompts_per_step * group,
        num_generations=group, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        max_completion_length=wl.max_response_tokens, temperature=wl.rl.temperature, top_k=0, top_p=1.0,
        beta=wl.rl.kl_coef, epsilon=wl.rl.clip_eps, loss_type="dapo", learning_rate=wl.rl.lr,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", weight_decay=0.0,
        max_grad_norm=wl.rl.grad_clip, max_steps=steps, logging_steps=1, report_to="none", save_strategy="no",
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, seed=wl.seed, shuffle_dataset=False,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )  # fmt: skip
    timing: dict[str, float] = {}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            timing["generation_scoring"] = time.perf_counter() - started
            timing["tokens"] = float(out["completion_mask"].sum())
            timing["step_start"] = started
            return out

    class Lines(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            phases = {"generation_scoring": timing["generation_scoring"],
                      "train": now - timing["step_start"] - timing["generation_scoring"]}  # fmt: skip
            print(f"step {state.global_step}/{steps} tokens {int(timing['tokens'])} phases {json.dumps(phases)}",
                  flush=True)  # fmt: skip

    model = AutoModelForCausalLM.from_pretrained(wl.actor.path, dtype=torch.float32)
    trainer = Timed(model=model, reward_funcs=toy_reward, args=config, train_dataset=data,
                    processing_class=load_tokenizer(wl.actor.path), callbacks=[Lines()])  # fmt: skip
    trainer.train()


# ---- the driver ------------------------------------------------------------------------------------------------


def cpu_clock_prefix(work: Path) -> list[str]:
    """`env PYTHONPATH=DIR:...` where DIR holds a sitecustomize making time.perf_counter the process CPU clock."""
    folder = work / "cpuclock"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(CPU_CLOCK)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return ["env", f"PYTHONPATH={path}"]


def hetrl_round(pin: list[str], work: Path, steps: int, warmup: int, index: str) -> dict:
    run_dir = work / f"hetrl-{index}"
    argv = [*pin, HETRL, "run", str(work / "plan.json"), "--steps", str(steps), "--run-dir", str(run_dir), "--engine",
            "hf", "--plain"]  # fmt: skip
    worker = lambda _proc: int((run_dir / "logs" / "rank-0.pid").read_text())  # noqa: E731 (the one rank)
    stamps, cpu, _ = run_overhead.timed_lines(argv, work, "[rank 0] step ", worker)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "period_s": run_overhead.periods(stamps, warmup),
        "cpu_s": run_overhead.periods(cpu, warmup),
        "worker_step_s": [m["step_s"] for m in metrics[warmup:]],
        "phases": [
            {p: m["seconds"].get(p, 0.0) for p in HETRL_PHASES} | {"weight_sync": m["weight_sync_s"]}
            for m in metrics[warmup:]
        ],
        "tokens": [m["response_tokens"] for m in metrics[warmup:]],
    }


def script_round(python: list[str], flag: str, work: Path, steps: int, warmup: int) -> dict:
    """The loop (`--loop`) or TRL (`--trl`) in its own process; step lines `step N/M ... phases {...}`."""
    argv = [*python, str(Path(__file__).resolve()), flag, "--steps", str(steps), "--work", str(work)]
    stamps, cpu, output = run_overhead.timed_lines(argv, work, "step ", lambda proc: proc.pid)
    lines = [line for line in output.splitlines() if line.startswith("step ")]
    tokens = [int(line.split()[5]) if flag == "--loop" else int(line.split()[3]) for line in lines]
    return {"period_s": run_overhead.periods(stamps, warmup), "cpu_s": run_overhead.periods(cpu, warmup),
            "tokens": tokens[warmup:],
            "phases": [json.loads(line.split(" phases ", 1)[1]) for line in lines][warmup:]}  # fmt: skip


def run_round(side: str, work: Path, args: argparse.Namespace, index: str, cpu_clock: bool = False) -> dict:
    """One run of `side`; `cpu_clock`: its phase timers count CPU seconds (cpu_clock_prefix)."""
    pin = (cpu_clock_prefix(work) if cpu_clock else []) + (["taskset", "-c", args.cpus] if args.cpus else [])
    if side == "hetrl":
        return hetrl_round(pin, work, args.steps, args.warmup, index)
    if side == "loop":
        return script_round([*pin, sys.executable], "--loop", work, args.steps, args.warmup)
    return script_round([*pin, str(TRL_PYTHON)], "--trl", work, args.steps, args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-trl", action="store_true", help="hetrl and the hand loop only")
    parser.add_argument("--out", type=Path, default=OUT, help="where the results go (JSON)")
    parser.add_argument("--cpus", help="run every side under `taskset -c CPUS` (each then uses that many threads)")
    parser.add_argument("--cpu-rounds", type=int, default=2, help="extra rounds timing each phase in CPU seconds")
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop or args.trl:
        (loop_main if args.loop else trl_main)(args.work, args.steps)
        return
    sides = ["hetrl", "loop"] + ([] if args.no_trl else ["trl"])
    if "trl" in sides and not TRL_PYTHON.exists():
        raise SystemExit(f"{TRL_PYTHON} is missing: run `make setup-bench` (or pass --no-trl)")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    cpu_runs: dict[str, list[dict]] = {side: [] for side in sides}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="hetrl-run-vs-loop-") as tmp:
        work = Path(tmp)
        write_plan(bench_workload(build_model(work / "model")), work / "plan.json")
        for r in range(args.cpu_rounds + args.rounds):  # CPU-clock rounds first: a failure there shows early
            cpu_clock = r < args.cpu_rounds
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                started, load = time.monotonic(), os.getloadavg()[0]
                result = run_round(side, work, args, f"cpu{r}" if cpu_clock else str(r), cpu_clock)
                (cpu_runs if cpu_clock else runs)[side].append(result | {"load_1min": load})
                kind = "cpu-clock round" if cpu_clock else "round"
                print(f"{kind} {r + 1} {side}: {time.monotonic() - started:.1f} s (load {load:.1f})", file=sys.stderr,
                      flush=True)  # fmt: skip
            write_results(args, runs, load_before, cpu_runs)  # after every round: a long run interrupted keeps them


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def _phase_medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    phases = {}
    for side, rs in runs.items():
        names = sorted({name for r in rs for ph in r["phases"] for name in ph})
        phases[side] = {name: _median([ph[name] for r in rs for ph in r["phases"] if name in ph]) for name in names}
    return phases


def write_results(
    args: argparse.Namespace,
    runs: dict[str, list[dict]],
    load_before: tuple[float, ...],
    cpu_runs: dict[str, list[dict]] | None = None,
) -> None:
    step = {side: _median([p for r in rs for p in r["period_s"]]) for side, rs in runs.items()}
    cpu = {side: _median([p for r in rs for p in r["cpu_s"]]) for side, rs in runs.items()}
    per_round = {side: [_median(r["period_s"]) for r in rs] for side, rs in runs.items()}
    ratios = {}
    for other in [s for s in runs if s != "hetrl"]:
        pairs = [h / o for h, o in zip(per_round["hetrl"], per_round[other], strict=True)]
        ratios[f"hetrl/{other}"] = {"pooled": step["hetrl"] / step[other], "per_round": pairs,
                                    "per_round_median": _median(pairs), "cpu": cpu["hetrl"] / cpu[other]}  # fmt: skip
    phases = _phase_medians(runs)
    result = {
        "command": "python bench/run_vs_loop.py " + " ".join(sys.argv[1:]),
        "cpus": args.cpus or "all",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {"config": BENCH_CONFIG, "parameters": _parameters()},
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_s_median": step,
        "cpu_s_per_step_median": cpu,
        "ratios": ratios,
        "per_round_step_s": per_round,
        "phase_s_median": phases,
        "tokens_per_step_median": {side: _median([t for r in rs for t in r["tokens"]]) for side, rs in runs.items()},
        "load_1min_per_round": {side: [r["load_1min"] for r in rs] for side, rs in runs.items()},
    }
    if cpu_runs and any(cpu_runs.values()):
        result["cpu_clock"] = {
            "rounds": args.cpu_rounds,
            "what": "phase timers on time.process_time (sitecustomize): each phase's CPU seconds, all threads",
            "phase_cpu_s_median": _phase_medians(cpu_runs),
            "cpu_s_per_step_median": {s: _median([c for r in rs for c in r["cpu_s"]]) for s, rs in cpu_runs.items()},
            "load_1min_per_round": {side: [r["load_1min"] for r in rs] for side, rs in cpu_runs.items()},
        }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("step_s_median", "ratios", "phase_s_median", "cpu_clock") if k in result},
                     indent=2))  # fmt: skip


def _parameters() -> int:
    """Parameters of BENCH_CONFIG's model (a tied head counted once)."""
    h, i, v, layers = (BENCH_CONFIG[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    q = BENCH_CONFIG["num_attention_heads"] * BENCH_CONFIG["head_dim"]
    kv = BENCH_CONFIG["num_key_value_heads"] * BENCH_CONFIG["head_dim"]
    attention = h * q + q + 2 * (h * kv + kv) + q * h
    return v * h + layers * (attention + 3 * h * i + 2 * h) + h


if __name__ == "__main__":
    main()
