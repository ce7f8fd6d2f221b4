#!/bin/bash
# Issue 11, lab version 109 (session 23, helper moe11: the first weight stage loaded before the row table,
# dev/cuda/qr_diet_lab.cuh qr_early_kernel) beside the backend (50) and the diet (95), twice in one call for the
# spread between runs; every output of 95 and 109 compared with version 50's bit for bit ("= v50" in the check
# column). Needs the LAB_LEAN lab rebuilt at or after the commit that added 109 (.devbin/moe_quant.xz, .devbin/README)
# and carried with .devdeb. About 20 s of GPU time. Usage: bash dev/gpu/lab109.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
lab_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$O/lab.txt"
for run in 1 2; do
  t0=$(date +%s)
  /tmp/mq --bits 4 --versions 50,95,109 --ms 16 --ts 128,256 --reps 5 >> "$O/lab.txt" 2>&1
  echo "lab run $run rc $? $(( $(date +%s)-t0 )) s: $(grep -c 'ok, = v50' "$O/lab.txt") rows = v50 so far" | tee -a "$O/log.txt"
done
