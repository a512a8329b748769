#!/usr/bin/env bash
# The one prepared call for a lent H200 (15 minutes of device time for everything, start-up
# included): every open issue's GPU check in one script, each part under its own `timeout`, the
# whole under TOTAL_S. Records go under $OUT (the device tool brings them back); commit them
# under validate/records/ and regenerate the reports named below.
#
#   issue 14 (validate on transformers' implementation): validate/gpu/h200-hf.sh's parts, HF
#     Llama ~1B and a small Mixtral, one rank           -> python validate/hf_report.py ...
#   issue 16 (GPU step time): host-bound small micro-batches (gpt2-124m, ddp, mb 1 / 4 / 16),
#     attention-heavy long sequences and an 8-GPU plan of a Llama-3-8B-shaped model as one rank
#     of 8 (--fake-world 8: memory of the 8-GPU job, compute for real, no communication)
#                                                       -> osdp-sim calibrate ... (docs/accuracy-h200x1.md)
#   Not here: selective activation checkpointing (not built yet).
#
# From the repository root:   OUT=/tmp/out bash validate/gpu/h200-round.sh
# Dry check on CPU at tiny size: DEVICE=cpu SMALL=1 OUT=/tmp/out bash validate/gpu/h200-round.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-validate/records}"
TOTAL_S="${TOTAL_S:-540}"
T0=$(date +%s)
RECORDS="$OUT/h200x1-hf"
source validate/gpu/h200-hf.sh          # functions only (hf_setup, hf_llama, hf_mixtral, hf_table)

left_s() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }

# run LABEL ARGS...: one validate (own timeout, capped by what the whole script has left)
run() {
    local label="$1"
    shift
    local t=$(( $(left_s) < RUN_TIMEOUT_S ? $(left_s) : RUN_TIMEOUT_S ))
    if [ "$t" -lt 30 ]; then
        echo "== $label: skipped, $(left_s) s left of TOTAL_S=$TOTAL_S"
        return 0
    fi
    echo "== $label ($(left_s) s left)"
    timeout --kill-after=15 "$t" python -m osdp_sim.cli.main validate --hw "$HW" --device "$DEVICE" \
        --warmup "$WARMUP" --iters "$ITERS" --timeout "$((t - 10))" "$@" \
        || echo "   (exit $? for $label; see its record)"
}

time_host_bound() {   # small micro-batches: the host issues kernels slower than the GPU runs them
    local m=gpt2-124m seq=()
    [ "$SMALL" = 1 ] && m=gpt2-tiny
    for mb in 1 4 16; do
        run "host-bound $m ddp mb$mb" --model "$m" --strategy ddp --micro-batch "$mb" --nproc 1 \
            --records-dir "$OUT/h200x1-time/n1"
    done
}

time_fake_world() {   # one rank of an 8-GPU plan: Llama-3-8B-shaped (llama-8b, seq 8192)
    local m=llama-8b
    local long=(--seq-len 8192) short=(--seq-len 2048)
    if [ "$SMALL" = 1 ]; then m=llama-tiny; long=(--seq-len 128); short=(--seq-len 64); fi
    run "$m x8 fake zero3 mb1 ckpt seq8192" --model "$m" "${long[@]}" --strategy zero3 --micro-batch 1 \
        --checkpoint --fake-world 8 --records-dir "$OUT/h200x1-fake8/n8"
    run "$m x8 fake zero3 mb2 ckpt seq8192" --model "$m" "${long[@]}" --strategy zero3 --micro-batch 2 \
        --checkpoint --fake-world 8 --records-dir "$OUT/h200x1-fake8/n8"
    run "$m x8 fake zero3 mb1 seq2048" --model "$m" "${short[@]}" --strategy zero3 --micro-batch 1 \
        --fake-world 8 --records-dir "$OUT/h200x1-fake8/n8"
}

main() {
    hf_setup
    nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv || true
    time_host_bound
    time_fake_world
    hf_llama
    hf_mixtral
    hf_table
    echo "done in $(( $(date +%s) - T0 )) s"
}

main
