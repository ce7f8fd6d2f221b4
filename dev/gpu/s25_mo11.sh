#!/bin/bash
# Issue 11, lab versions 110 and 111 (session 24, helper mo11, dev/cuda/qr_diet_lab.cuh: 110 = version 50's kernel with a
# per-block timeline, qr_tl_kernel; 111 = the down product's blocks two slabs each with one pipeline across them,
# qr_pair_kernel) beside the backend (50) and the diet (95), twice in one call for the spread between runs; every output
# of 95, 110 and 111 compared with version 50's bit for bit ("= v50" in the check column), and under each 110 row its
# timeline (moe_quant.cu print_timeline: each phase's median and p10/p90 over the blocks, the blocks' starts against
# the first, the rounds of resident blocks and the tail, the per-SM busy fraction); the timeline lines also gathered
# in timeline.txt. LAB_VERSIONS overrides the versions (default 50,95,110,111). Needs the
# LAB_LEAN lab rebuilt at or after the commit that added 110-111 (.devbin/moe_quant.xz, .devbin/README) and carried with
# .devdeb. About 1-3 minutes of GPU time. Usage: bash dev/gpu/s25_mo11.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
lab_unpack
V=${LAB_VERSIONS:-50,95,110,111}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$O/lab.txt"
for run in 1 2; do
  echo "## run $run" >> "$O/lab.txt"
  timeout 240 /tmp/mq --bits 4 --versions $V --ms 16 --ts 128,256 --reps 5 >> "$O/lab.txt" 2>&1
  echo "lab run $run rc $? $(el): $(grep -c 'ok, = v50' "$O/lab.txt") rows = v50 so far, $(grep -c FAIL "$O/lab.txt") FAIL" | tee -a "$O/log.txt"
done
grep -E '^## run|\| 11[01] \||^  timeline|^   (phases|starts|slots|per-SM)|version 11[01]' "$O/lab.txt" > "$O/timeline.txt"
cat "$O/timeline.txt"
