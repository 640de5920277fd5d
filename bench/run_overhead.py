"""Runtime overhead on one host: `hetrl run` of the tiny GRPO against a minimal hand-written loop.

hetrl side: `hetrl run plans/localhost.json --engine hf --plain` (the tiny GRPO of examples/tiny-grpo.yaml on
localhost/0: one rank holding generation, reference, reward and actor_train; TensorBoard on, as by default).
Hand-written side: one Python process doing the same work with the same torch code and no runtime around it:
the same tiny model (seed 0), prompts (datasets.step_records), 4 x 4 sequences of up to 12 new tokens,
transformers `generate` sampling at temperature 1 on the trained model itself, the toy reward, the reference
and old log-probs, GRPO advantages, the clipped loss with k3 KL (runtime/algorithms.py), Adam at the
workload's learning rate, gradient clipping at 1.0, and a one-line print per step.

Step time = the wall time between consecutive "step" lines as they arrive (so hetrl's report phase, gathering,
metrics.jsonl, TensorBoard and printing, is inside it), and for hetrl also the worker's own `step_s`. Rounds
alternate the two (and which goes first), so the machine's noise hits both; medians are over the steps after
`--warmup` of every round. Per-task measured (summary.json) vs predicted (the plan) for the same hetrl runs.

    .venv/bin/python bench/run_overhead.py [--rounds 3] [--steps 12] [--warmup 2]    # ~2 min on 2 cores
    → bench/results/run_overhead.json (docs/benchmarks.md quotes it)
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLAN = REPO / "plans" / "localhost.json"
OUT = REPO / "bench" / "results" / "run_overhead.json"
HETRL = str(Path(sys.executable).with_name("hetrl"))


# ---- the hand-written loop (runs in its own process: `run_overhead.py --loop`) -----------------------------


def hand_loop(steps: int, work: Path) -> None:
    """The tiny GRPO step of the plan's workload (grpo_loop on the tiny model)."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime.tinymodel import ensure_tiny

    wl = load_artifact(PLAN, Plan).workload
    grpo_loop(wl, ensure_tiny(work / "models", seed=wl.seed), steps)


def grpo_loop(wl, model_dir: Path, steps: int, reuse_old_logprobs: bool = False) -> None:
    """A GRPO step in ~40 lines of plain torch/transformers; prints `step N reward R` per step. The toy task
    (workload `wl`'s prompts, toy reward) on the model in `model_dir`. `reuse_old_logprobs`: the old log-probs are
    the update's own forward, detached (one update per batch), instead of a separate no-grad pass."""
    import torch

    from hetrl_cli.profiling.probe import usable_cores
    from hetrl_cli.runtime import algorithms as alg
    from hetrl_cli.runtime.datasets import load_records, step_records
    from hetrl_cli.runtime.engines import cut_at_eos
    from hetrl_cli.runtime.rewards import char_fraction_reward
    from hetrl_cli.runtime.tinymodel import load_causal_lm, load_tokenizer

    torch.set_num_threads(max(1, int(usable_cores())))  # what the worker of a one-rank run sets
    torch.manual_seed(wl.seed)
    tok = load_tokenizer(model_dir)
    policy, ref = load_causal_lm(model_dir), load_causal_lm(model_dir)
    opt = torch.optim.Adam(policy.parameters(), lr=wl.rl.lr)
    records = load_records(wl.dataset.kind, wl.dataset.path, wl.seed)
    group = wl.responses_per_prompt

    def logprobs(model, ids, attn, positions, response):
        logits = model(input_ids=ids, attention_mask=attn).logits
        at = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        return alg.gather_logprobs(at, response)

    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        batch = step_records(records, step, wl.prompts_per_step, wl.seed)
        encoded = tok([r.prompt for r in batch], add_special_tokens=False)["input_ids"]
        prompts = [ids[-wl.max_prompt_tokens :] for ids in encoded for _ in range(group)]
        width = max(map(len, prompts))
        left = torch.full((len(prompts), width), tok.pad_token_id)
        for i, p in enumerate(prompts):
            left[i, width - len(p) :] = torch.tensor(p)
        with torch.no_grad():
            out = policy.generate(input_ids=left, attention_mask=(left != tok.pad_token_id).long(), do_sample=True,
                                  top_k=0, temperature=wl.rl.temperature, max_new_tokens=wl.max_response_tokens,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
        responses = [cut_at_eos(r, tok.eos_token_id, tok.pad_token_id) or [tok.eos_token_id] for r in
                     out[:, width:].tolist()]  # fmt: skip
        t1 = time.perf_counter()
        texts = tok.batch_decode(responses, skip_special_tokens=True)
        scores = torch.tensor([char_fraction_reward(t, batch[i // group].answer) for i, t in enumerate(texts)])
        n, steps_t = len(prompts), max(map(len, responses))
        full = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
        ids, attn = torch.full((n, full), tok.pad_token_id), torch.zeros((n, full), dtype=torch.long)
        positions, resp = torch.zeros((n, steps_t), dtype=torch.long), torch.full((n, steps_t), tok.pad_token_id)
        mask = torch.zeros((n, steps_t))
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            ids[i, : len(p) + len(r)], attn[i, : len(p) + len(r)] = torch.tensor(p + r), 1
            positions[i] = (torch.arange(steps_t) + len(p) - 1).clamp(max=full - 1)
            resp[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1.0
        with torch.no_grad():
            ref_logp = logprobs(ref, ids, attn, positions, resp)
            t2 = time.perf_counter()
            old_logp = None if reuse_old_logprobs else logprobs(policy, ids, attn, positions, resp)
        adv = alg.grpo_advantages(scores, group).unsqueeze(1) * mask
        logp = logprobs(policy, ids, attn, positions, resp)
        pg, _ = alg.policy_loss(logp, logp.detach() if old_logp is None else old_logp, adv, wl.rl.clip_eps)
        loss = alg.masked_sum(pg + wl.rl.kl_coef * alg.kl_k3(logp, ref_logp), mask) / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), wl.rl.grad_clip)
        opt.step()
        t3 = time.perf_counter()
        phases = {"generation": t1 - t0, "reference": t2 - t1, "actor_train": t3 - t2}  # reward inside reference
        print(f"step {step}/{steps} reward {float(scores.mean()):.3f} tokens {int(mask.sum())} "
              f"phases {json.dumps(phases)}", flush=True)  # fmt: skip


# ---- the driver ------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far (/proc/PID/task/*/schedstat: nanoseconds on a CPU)."""
    total = 0
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():  # the process already ended (a last line read late): no figure for that step
        return math.nan
    for task in tasks.iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def timed_lines(argv: list[str], cwd: Path, marker: str, pid_of) -> tuple[list[float], list[float], str]:
    """Run argv; at every output line containing `marker`, the wall clock and the CPU seconds of the process
    doing the work (`pid_of(proc)`), and the whole output. CPU time shrugs off the other jobs of a shared
    machine, wall time does not; both are reported."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR",)}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stamps, cpu, lines = [], [], []
    assert proc.stdout is not None
    for line in proc.stdout:
        if marker in line:
            stamps.append(time.perf_counter())
            cpu.append(cpu_seconds(pid_of(proc)))
        lines.append(line)
    if proc.wait() != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{''.join(lines[-20:])}")
    return stamps, cpu, "".join(lines)


def periods(stamps: list[float], warmup: int) -> list[float]:
    """Seconds between consecutive step lines, the first `warmup` steps left out (step 1 has no start line)."""
    gaps = [b - a for a, b in itertools.pairwise(stamps)]  # gaps[i] = step i+2
    return gaps[max(0, warmup - 1) :]


def hetrl_round(work: Path, steps: int, warmup: int, index: int) -> dict:
    run_dir = work / f"hetrl-{index}"
    argv = [HETRL, "run", str(PLAN), "--steps", str(steps), "--run-dir", str(run_dir), "--engine", "hf", "--plain"]
    worker = lambda _proc: int((run_dir / "logs" / "rank-0.pid").read_text())  # noqa: E731 (the one rank)
    stamps, cpu, _ = timed_lines(argv, work, "[rank 0] step ", worker)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "period_s": periods(stamps, warmup),
        "cpu_s": periods(cpu, warmup),
        "worker_step_s": [m["step_s"] for m in metrics[warmup:]],
        "phases": [m["seconds"] for m in metrics[warmup:]],
        "tokens": [m["response_tokens"] for m in metrics[warmup:]],
        "tasks": {t["task"]: t for t in summary["tasks"]},
        "iteration": summary["iteration"],
    }


def loop_round(work: Path, steps: int, warmup: int) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--loop", "--steps", str(steps), "--work", str(work)]
    stamps, cpu, output = timed_lines(argv, work, "step ", lambda proc: proc.pid)
    lines = [line.split() for line in output.splitlines() if line.startswith("step ")]
    phases = [json.loads(line.split(" phases ", 1)[1]) for line in output.splitlines() if line.startswith("step ")]
    return {"period_s": periods(stamps, warmup), "cpu_s": periods(cpu, warmup),
            "tokens": [int(w[5]) for w in lines][warmup:], "phases": phases[warmup:]}  # fmt: skip


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        hand_loop(args.steps, args.work)
        return
    hetrl_runs, loop_runs = [], []
    with tempfile.TemporaryDirectory(prefix="hetrl-overhead-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            for side in ("hetrl", "loop") if r % 2 == 0 else ("loop", "hetrl"):
                started = time.monotonic()
                if side == "hetrl":
                    hetrl_runs.append(hetrl_round(work, args.steps, args.warmup, r))
                else:
                    loop_runs.append(loop_round(work, args.steps, args.warmup))
                print(f"round {r + 1} {side}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    write_results(args, hetrl_runs, loop_runs)


def write_results(args: argparse.Namespace, hetrl_runs: list[dict], loop_runs: list[dict]) -> None:
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan

    plan = load_artifact(PLAN, Plan)
    hetrl_period = median([p for r in hetrl_runs for p in r["period_s"]])
    worker_step = median([p for r in hetrl_runs for p in r["worker_step_s"]])
    loop_period = median([p for r in loop_runs for p in r["period_s"]])
    hetrl_cpu = median([p for r in hetrl_runs for p in r["cpu_s"] if math.isfinite(p)])
    loop_cpu = median([p for r in loop_runs for p in r["cpu_s"] if math.isfinite(p)])
    round_ratios = [median(h["period_s"]) / median(lo["period_s"]) for h, lo in zip(hetrl_runs, loop_runs, strict=True)]
    tasks = {}
    for t in plan.tasks:
        measured = [r["tasks"][t.task]["measured_s"] for r in hetrl_runs if t.task in r["tasks"]]
        if measured:
            tasks[t.task] = {"predicted_s": t.predicted.total_s, "measured_s": median(measured)}
    sync = [r["tasks"]["weight_sync"]["measured_s"] for r in hetrl_runs if "weight_sync" in r["tasks"]]
    if sync:
        tasks["weight_sync"] = {"predicted_s": plan.cost.weight_sync_s, "measured_s": median(sync)}
    iteration = median([r["iteration"]["measured_s"] for r in hetrl_runs])
    tasks["iteration"] = {"predicted_s": plan.cost.iteration_s, "measured_s": iteration}
    for row in tasks.values():
        row["error"] = (row["predicted_s"] - row["measured_s"]) / row["measured_s"] if row["measured_s"] else None
    result = {
        "command": "python bench/run_overhead.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "plan": str(PLAN.relative_to(REPO)),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "hetrl_step_s_median": hetrl_period,
        "hetrl_worker_step_s_median": worker_step,
        "loop_step_s_median": loop_period,
        "ratio": hetrl_period / loop_period,
        "ratio_worker_step": worker_step / loop_period,
        "ratio_per_round": round_ratios,
        "ratio_per_round_median": median(round_ratios),
        "hetrl_cpu_s_per_step_median": hetrl_cpu,
        "loop_cpu_s_per_step_median": loop_cpu,
        "ratio_cpu": hetrl_cpu / loop_cpu,
        "tokens_per_step_median": {
            "hetrl": median([t for r in hetrl_runs for t in r["tokens"]]),
            "loop": median([t for r in loop_runs for t in r["tokens"]]),
        },
        "phase_s_median": {
            side: {
                phase: median([ph[phase] for r in runs for ph in r["phases"] if phase in ph])
                for phase in ("generation", "reference", "actor_train")
            }
            for side, runs in (("hetrl", hetrl_runs), ("loop", loop_runs))
        },
        "per_round": {
            "hetrl_step_s": [median(r["period_s"]) for r in hetrl_runs],
            "loop_step_s": [median(r["period_s"]) for r in loop_runs],
        },
        "tasks_measured_vs_predicted": tasks,
    }
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    keys = ("hetrl_step_s_median", "loop_step_s_median", "ratio", "ratio_per_round_median", "ratio_cpu")
    print(json.dumps({k: result[k] for k in keys}, indent=2))


if __name__ == "__main__":
    main()
