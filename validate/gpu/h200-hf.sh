#!/usr/bin/env bash
# validate --impl hf on one H200 (issue 14): transformers' Llama (~1B, seq 2048) and a small
# Mixtral (4 experts, top-2) from validate/models/*/config.json, a few plans each, one rank.
# About 3-4 minutes; every command has its own `timeout`. Run from the repository root:
#   bash validate/gpu/h200-hf.sh                 # records under $OUT/h200x1-hf or validate/records/h200x1-hf
#   DEVICE=cpu SMALL=1 bash validate/gpu/h200-hf.sh   # the same steps on CPU at tiny size (a dry check)
# Then: python validate/hf_report.py validate/records/h200x1-hf --hw hwprofiles/h200x1-calibrated.yaml
# One function per part, so that another issue's GPU script can source this file and call them.
set -euo pipefail

DEVICE="${DEVICE:-cuda}"
SMALL="${SMALL:-0}"
if [ "$DEVICE" = cpu ]; then
    HW="${HW:-hwprofiles/cpu-2core-calibrated.yaml}"
else
    HW="${HW:-hwprofiles/h200x1-calibrated.yaml}"
fi
RECORDS="${RECORDS:-${OUT:+$OUT/h200x1-hf}}"
RECORDS="${RECORDS:-validate/records/h200x1-hf}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's osdp_sim, installed or not
RUN_TIMEOUT_S="${RUN_TIMEOUT_S:-150}"     # per validate command
WARMUP="${WARMUP:-2}"
ITERS="${ITERS:-5}"

hf_setup() {
    python -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    if ! python -c 'import transformers' 2>/dev/null; then
        timeout 180 pip install --quiet 'transformers>=5,<6' safetensors tokenizers
    fi
    python -c 'import transformers; print("transformers", transformers.__version__)'
    if ! python -c 'import osdp_sim' 2>/dev/null; then
        timeout 180 pip install --quiet --no-deps -e .
    fi
    mkdir -p "$RECORDS"
}

# hf_validate MODEL_DIR LABEL ARGS...: one `osdp-sim validate --impl hf` run; a failure is recorded
# by validate itself and does not stop the script.
hf_validate() {
    local model="$1" label="$2"
    shift 2
    local extra=()
    if [ "$SMALL" = 1 ]; then
        extra=(--seq-len 128)
    fi
    echo "== $label"
    timeout --kill-after=15 "$RUN_TIMEOUT_S" python -m osdp_sim.cli.main validate --impl hf \
        --model "$model" --hw "$HW" --device "$DEVICE" --nproc 1 --warmup "$WARMUP" --iters "$ITERS" \
        --timeout "$((RUN_TIMEOUT_S - 10))" --records-dir "$RECORDS" "${extra[@]}" "$@" \
        || echo "   (exit $? for $label; see its record)"
}

hf_llama() {
    local m=validate/models/llama-1b-hf
    [ "$SMALL" = 1 ] && m=validate/models/llama-tiny-hf
    hf_validate "$m" "llama ddp mb1" --strategy ddp --micro-batch 1
    hf_validate "$m" "llama ddp mb2" --strategy ddp --micro-batch 2
    hf_validate "$m" "llama zero3 mb4" --strategy zero3 --micro-batch 4
    hf_validate "$m" "llama zero3 mb4 ckpt" --strategy zero3 --micro-batch 4 --checkpoint
}

hf_mixtral() {
    local m=validate/models/mixtral-small-hf
    [ "$SMALL" = 1 ] && m=validate/models/mixtral-tiny-hf
    hf_validate "$m" "mixtral ddp mb1" --strategy ddp --micro-batch 1
    hf_validate "$m" "mixtral zero3 mb2" --strategy zero3 --micro-batch 2
    hf_validate "$m" "mixtral zero3 mb4 ckpt" --strategy zero3 --micro-batch 4 --checkpoint
}

hf_table() {
    python validate/hf_report.py "$RECORDS" --hw "$HW" | sed -n '/## Runs/,$p' || true
}

hf_main() {
    hf_setup
    hf_llama
    hf_mixtral
    hf_table
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    hf_main
fi
