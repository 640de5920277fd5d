# Sourced by bench/gpu_check.sh and bench/gpu_run.sh (from the repo root): picks the interpreter ($py) and puts
# what the GPU image lacks (pydantic and its parts, carried as wheels in build/gpu_wheels) and src/ on PYTHONPATH.
WHEELS=build/gpu_wheels
# 1) the interpreter: one whose torch sees a GPU (a carried .venv first, then the image's python3), else any
#    with torch (a CPU host), else python3 (the scripts then report that torch is missing)
py=
for want in 'torch.cuda.is_available()' 'True'; do
    for cand in .venv/bin/python python3; do
        if [ -z "$py" ] && "$cand" -c "import sys, torch; sys.exit(0 if $want else 1)" 2>/dev/null; then
            py=$cand
        fi
    done
done
py=${py:-python3}
# 2) what the image lacks, from the carried wheels (into a private folder: the image's packages stay as they are)
if ! "$py" -c 'import pydantic' 2>/dev/null; then
    if ls "$WHEELS"/*.whl >/dev/null 2>&1 && "$py" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/gpu_check_site "$WHEELS"/*.whl; then
        export PYTHONPATH="/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "$(basename "$0"): no pydantic and no wheels in $WHEELS: measuring only (predict later)" >&2
    fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1
