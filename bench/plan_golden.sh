#!/usr/bin/env bash
# Plans whose predictions a no-behaviour-change refactor must keep to the last digit (issue 20):
# ILP, hybrid (--max-evals, so seeded and machine-independent), the verl and StreamRL baselines, PPO-async
# hybrid and ILP, and a 14B GRPO zero3 async ILP and auto, on the four shipped paper profiles.
# Usage: bench/plan_golden.sh OUTDIR [SRC]   (SRC: another checkout's src/ to run instead of this one)
# Compare two OUTDIRs: the summary lines (plan, iteration_s, status, objective) and each plan's cost/tasks.
set -u
out=$1; mkdir -p "$out"
cd "$(dirname "$0")/.."
[ -n "${2:-}" ] && export PYTHONPATH=$2
hetrl=.venv/bin/hetrl
printf "algorithm: ppo\nmode: async\nactor: {arch: qwen3-8b}\ncritic: {arch: qwen3-8b}\nreward: {arch: qwen3-8b}\n" > "$out/ppo-async.yaml"
printf "algorithm: grpo\nmode: async\nactor: {arch: qwen3-14b}\nprecision: bf16\nsharding: zero3\n" > "$out/grpo14.yaml"
for p in paper-single-region paper-multi-region-hybrid paper-multi-country paper-multi-continent; do
  $hetrl plan profiles/$p.json --solver ilp --budget 120s -o "$out/$p-ilp.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json --solver hybrid --max-evals 3000 --budget 600s -o "$out/$p-hyb.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json --solver verl -o "$out/$p-verl.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json --solver streamrl -o "$out/$p-srl.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json -w "$out/ppo-async.yaml" --solver hybrid --max-evals 2000 --budget 600s \
    -o "$out/$p-ppo-hyb.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json -w "$out/ppo-async.yaml" --solver ilp --budget 120s -o "$out/$p-ppo-ilp.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json -w "$out/grpo14.yaml" --solver ilp --budget 120s -o "$out/$p-g14-ilp.json" 2>>"$out/log"
  $hetrl plan profiles/$p.json -w "$out/grpo14.yaml" --solver auto --budget 20s -o "$out/$p-g14-auto.json" 2>>"$out/log"
done
.venv/bin/python - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    print(f.split("/")[-1], repr(d["cost"]["iteration_s"]), d["solver"]["status"], d["solver"].get("objective"))
PY
