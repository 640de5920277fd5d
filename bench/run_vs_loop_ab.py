"""Phase by phase, in one process: hetrl's code for a GRPO step's phases against the hand loop's torch code, on
the same rollouts, alternating call by call, CPU seconds (`time.process_time`, every thread of the process).

Where run_vs_loop.py times whole runs in separate processes (a shared box moves those by 5-10 % between
rounds), this builds a real one-rank hetrl Worker in-process (the run directory `hetrl run --steps 1` made, the
bench's model and plan, one torch thread) and times, on identical inputs:

- generation: `Worker.generate` (prompts, `Generator.generate` through the hf engine: per-sequence seeded Gumbel
  sampling; the engine's wake before and level-2 sleep after, as the worker's phase has them) vs the loop's
  tokenisation + left padding + `generate(do_sample=True, top_k=0)` on the model it trains;
- weight sync: the trainer's weights into the colocated engine (allocated again after its sleep, then copied; the
  loop has none: it samples from the model it trains);
- reference: `Reference.logprobs` (collate, forward, head on the response positions) vs the loop's collation +
  full-logit forward + gather;
- actor_train: `Worker.update` (advantages, `Actor.train_step`: forward, loss, backward, clip, Adam) vs the loop's
  forward + loss + backward + `clip_grad_norm_` + Adam (its reference forward, part of its own step, untimed);
- report: `Worker.report` (gather to rank 0, metrics.jsonl with fsync, TensorBoard, events log, print).

    .venv/bin/python bench/run_vs_loop_ab.py [--reps 15]    # ~2 min on an idle core; medians in ms, JSON on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import run_vs_loop


def build_worker(work: Path):
    """A one-rank Worker on the run directory a one-step `hetrl run` of the bench plan left (in this process)."""
    from hetrl_cli.artifacts.io import load_artifact
    from hetrl_cli.artifacts.plan import Plan
    from hetrl_cli.runtime import comm, worker
    from hetrl_cli.runtime.local import free_port
    from hetrl_cli.runtime.rundir import RunDir

    run_vs_loop.write_plan(run_vs_loop.bench_workload(run_vs_loop.build_model(work / "model")), work / "plan.json")
    run_dir = work / "run"
    argv = [run_vs_loop.HETRL, "run", str(work / "plan.json"), "--steps", "1", "--run-dir", str(run_dir), "--engine",
            "hf", "--plain"]  # fmt: skip
    subprocess.run(argv, cwd=work, check=True, capture_output=True, timeout=600)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))  # fmt: skip
    run = RunDir(str(run_dir))
    manifest = worker.load_artifact_manifest(run)
    comm.init_world(manifest.backend, manifest.collective_timeout_s)
    w = worker.Worker(run, load_artifact(run.plan, Plan), manifest, 0)
    w.tracker = worker.tracking.open_tracker(run.root, manifest.tensorboard, first_step=1)
    w.sync_weights()  # as Worker.run does before its first step
    return w


def loop_side(w):
    """The hand loop's code for each phase (run_overhead.grpo_loop's lines) on its own policy and reference."""
    import torch

    from hetrl_cli.runtime import algorithms as alg
    from hetrl_cli.runtime.datasets import step_records
    from hetrl_cli.runtime.tinymodel import load_causal_lm

    wl, tok = w.workload, w.tokenizer
    policy, ref = load_causal_lm(Path(wl.actor.path)), load_causal_lm(Path(wl.actor.path))
    opt = torch.optim.Adam(policy.parameters(), lr=wl.rl.lr)
    pad, group = tok.pad_token_id, wl.responses_per_prompt

    def generation(step: int) -> None:
        batch = step_records(w.records, step, wl.prompts_per_step, wl.seed)
        encoded = tok([r.prompt for r in batch], add_special_tokens=False)["input_ids"]
        prompts = [ids[-wl.max_prompt_tokens :] for ids in encoded for _ in range(group)]
        width = max(map(len, prompts))
        left = torch.full((len(prompts), width), pad)
        for i, p in enumerate(prompts):
            left[i, width - len(p) :] = torch.tensor(p)
        with torch.no_grad():
            policy.generate(input_ids=left, attention_mask=(left != pad).long(), do_sample=True, top_k=0,
                           temperature=wl.rl.temperature, max_new_tokens=wl.max_response_tokens,
                           eos_token_id=tok.eos_token_id, pad_token_id=pad)  # fmt: skip

    def collate(rollouts):
        prompts, responses = [list(r.prompt_ids) for r in rollouts], [list(r.response_ids) for r in rollouts]
        n, steps = len(prompts), max(map(len, responses))
        full = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
        ids, attn = torch.full((n, full), pad), torch.zeros((n, full), dtype=torch.long)
        positions, resp = torch.zeros((n, steps), dtype=torch.long), torch.full((n, steps), pad)
        mask = torch.zeros((n, steps))
        for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
            ids[i, : len(p) + len(r)], attn[i, : len(p) + len(r)] = torch.tensor(p + r), 1
            positions[i] = (torch.arange(steps) + len(p) - 1).clamp(max=full - 1)
            resp[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1.0
        return ids, attn, positions, resp, mask

    def logprobs(model, ids, attn, positions, response):
        logits = model(input_ids=ids, attention_mask=attn).logits
        at = logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        return alg.gather_logprobs(at, response)

    def reference(rollouts) -> None:
        ids, attn, positions, resp, _ = collate(rollouts)
        with torch.no_grad():
            logprobs(ref, ids, attn, positions, resp)

    def actor_train(rollouts, scores) -> float:
        ids, attn, positions, resp, mask = collate(rollouts)
        with torch.no_grad():
            ref_logp = logprobs(ref, ids, attn, positions, resp)
        started = time.process_time()
        adv = alg.grpo_advantages(torch.tensor(scores), group).unsqueeze(1) * mask
        logp = logprobs(policy, ids, attn, positions, resp)
        pg, _ = alg.policy_loss(logp, logp.detach(), adv, wl.rl.clip_eps)
        loss = alg.masked_sum(pg + wl.rl.kl_coef * alg.kl_k3(logp, ref_logp), mask) / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), wl.rl.grad_clip)
        opt.step()
        return time.process_time() - started

    return generation, reference, actor_train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    import torch

    from hetrl_cli.runtime.worker import Timer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hetrl-run-vs-loop-ab-") as tmp:
        w = build_worker(Path(tmp))
        generation, reference, actor_train = loop_side(w)
        rollouts = w.share_rollouts(w.generate(1))
        exp = w.experience(1, rollouts, Timer())
        report = w.update(rollouts, exp, Timer())
        w.sync_weights()  # the engine slept after generating: every round below starts as a step does

        calls = {
            "generation": (lambda s: w.generate(s), generation),
            "weight_sync": (lambda s: w.sync_weights(), None),  # after generation's sleep, as in a step
            "reference": (lambda s: w.reference.logprobs(rollouts), lambda s: reference(rollouts)),
            "actor_train": (lambda s: w.update(rollouts, exp, Timer()), lambda s: actor_train(rollouts, exp["score"])),
            "report": (lambda s: w.report(1, rollouts, dict(report), Timer(), 0.4), None),
        }
        times: dict[str, dict[str, list[float]]] = {k: {"hetrl": [], "loop": []} for k in calls}
        quiet = contextlib.redirect_stdout(io.StringIO())  # the report's step lines
        for rep in range(args.reps):
            for phase, sides in calls.items():
                for side, fn in zip(("hetrl", "loop"), sides, strict=True):
                    if fn is None:
                        continue
                    started = time.process_time()
                    with quiet:
                        inner = fn(1 + rep % 5)
                    spent = time.process_time() - started
                    times[phase][side].append(inner if isinstance(inner, float) else spent)
    skip = min(2, args.reps - 1)  # the first calls warm caches up
    out = {phase: {side: round(statistics.median(v[skip:]) * 1000, 2) for side, v in sides.items() if v}
           for phase, sides in times.items()}  # fmt: skip
    print(json.dumps({"ms_cpu_median": out, "reps": args.reps, "load_average": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
