#!/usr/bin/env bash
# The GPU check of issue 5 (bench/gpu_check.py) as one command for the device machine.
#
# 1) Here, once per checkout (~3 MB: pydantic and its parts for the GPU image's Python 3.12, which lacks them;
#    build/ is git-ignored):
#        bash bench/gpu_check.sh fetch-wheels
# 2) Through the device tool, from the repo root:
#        run(command="bash bench/gpu_check.sh", carry=["build/gpu_wheels"], timeout_s=540)
#    Extra arguments go to gpu_check.py, e.g. `bash bench/gpu_check.sh --arch qwen3-1.7b` or `--quick`.
#    `bash bench/gpu_check.sh suite PROFILE.json` runs qwen3-0.6b, qwen3-1.7b, qwen3-0.6b at micro-batch 32 and
#    qwen3-4b against that profile in one call (about 7 minutes on an H200) and returns $OUT/suite.tgz.
#    The results come back from $OUT: gpu_check.json, gpu_check.md, profile.json (or probe.json), gpu_check.log.
#    Without the wheels the measurements still run; then predict here with
#        .venv/bin/python bench/gpu_check.py --predict-from FILES_AT_DIR
#
# The project's .venv (CPU torch, ~1.3 GB) is far over the tool's 64 MiB and is not carried: the image's own
# python3 (CUDA torch, transformers) runs the script, with src/ on PYTHONPATH instead of an install.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=build/gpu_wheels

if [ "${1:-}" = fetch-wheels ]; then
    mkdir -p "$WHEELS"
    exec .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" \
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
        typing-extensions==4.16.0
fi

if [ "${1:-}" = suite ]; then
    # Several configurations in one device call, each under its own limit, given an earlier run's profile
    # (the same GPU: no probe per run); every finished run is packed into $OUT/suite.tgz at once, so a call
    # stopped at its limit still brings back the runs done (the tool returns at most 8 files).
    shift
    profile=${1:?usage: gpu_check.sh suite PROFILE.json}
    final=${OUT:?OUT must be set}
    work=$(mktemp -d)
    # each: output folder, architecture, limit in seconds, more arguments
    for spec in "qwen3-0.6b qwen3-0.6b 150" "qwen3-1.7b qwen3-1.7b 130" \
        "qwen3-0.6b-mb32 qwen3-0.6b 60 --micro-batch 32 --only inference training" "qwen3-4b qwen3-4b 140"; do
        set -- $spec
        name=$1 arch=$2 limit=$3
        shift 3
        OUT=$work/$name GPU_CHECK_TIMEOUT=$limit bash "$0" --arch "$arch" --profile "$profile" "$@"
        tar czf "$final/suite.tgz.part" -C "$work" . && mv "$final/suite.tgz.part" "$final/suite.tgz"
    done
    exit 0
fi

out="${OUT:-bench/results/gpu_check}"
mkdir -p "$out"
# 1) the interpreter and 2) what the image lacks (bench/gpu_env.sh, shared with bench/gpu_run.sh)
source bench/gpu_env.sh
# 3) the check, offline, under a hard limit inside the tool's 600 s (GPU_CHECK_TIMEOUT seconds, default 480:
#    lower it to run several checks in one call)
echo "gpu_check.sh: $py ($("$py" --version 2>&1)), out $out" >&2
timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-480}" "$py" bench/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
