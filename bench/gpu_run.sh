#!/usr/bin/env bash
# The runtime on one GPU (issues 21 and 23; bench/gpu_run.py says what each part does): a random-initialised
# Qwen3-1.7B written to a temp dir, `hetrl profile`, `hetrl plan`, `hetrl run` of GRPO colocated in bf16 over
# NCCL (world size 1, hf engine, 10 steps), then the hf engine alone (sharded load, bounded generation, bucketed
# weight loading), each part under its own `timeout` and run even when an earlier one failed; the whole script
# stays under 8 minutes (the limits below sum to 460 s).
#
#   here, once per checkout:  bash bench/gpu_check.sh fetch-wheels    (pydantic for the GPU image's python)
#   on the device machine:    run(command="bash bench/gpu_run.sh", carry=["build/gpu_wheels"], timeout_s=540)
#   on this CPU (the test):   OUT=/tmp/x bash bench/gpu_run.sh --dry-run
#
# Results come back from $OUT: gpu_run.json, gpu_run.md, part-*.json, profile.json, plan.json, gpu_run.log. The
# model (4 GB) and the run directory live in a temp dir (GPU_RUN_WORK to choose it), never under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
dry=
for arg in "$@"; do
    [ "$arg" = --dry-run ] && dry=--dry-run
done
out="${OUT:-bench/results/gpu_run}"
mkdir -p "$out"
source bench/gpu_env.sh
work="${GPU_RUN_WORK:-$(mktemp -d /tmp/gpu_run.XXXXXX)}"
echo "gpu_run.sh: $py ($("$py" --version 2>&1)), out $out, work $work ${dry:+(dry run on the CPU)}" | tee "$out/gpu_run.log" >&2

part() {  # part NAME LIMIT_S [ARGS]: one part of bench/gpu_run.py under its own limit; a failure is recorded
    local name=$1 limit=$2
    shift 2
    timeout --kill-after=10 "$limit" "$py" bench/gpu_run.py "$name" --out "$out" --work "$work" $dry "$@" 2>&1 \
        | tee -a "$out/gpu_run.log" >&2
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "gpu_run.sh: part $name stopped at its ${limit} s limit" \
        | tee -a "$out/gpu_run.log" >&2
    return 0
}

part model 60
part profile 60 --quick
part plan 40
part run 230 --run-timeout 215
part engine 70
"$py" bench/gpu_run.py report --out "$out" --work "$work" 2>&1 | tee -a "$out/gpu_run.log" >&2
cat "$out/gpu_run.md"
[ -n "${GPU_RUN_WORK:-}" ] || rm -rf "$work"
