#!/bin/bash
# Issue 16's last sanitizer gaps (one GPU call, carry .devdeb): synccheck over the 21 test items that ran past the
# limit in session 21, and all four tools over the two tests whose cases changed after session 21's sweep
# (test_quant_experts_lab: lab versions 102-106; test_quant_experts_diet: the 4- and 5-tile stacks; review rev16).
# Usage: bash dev/gpu/issue16_last.sh $OUT   (CALL_S: seconds no sanitizer run may pass, default 565)
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
t0=$(date +%s); export SAN_DEADLINE=$(( t0 + ${CALL_S:-565} )); nvidia-smi --query-gpu=name --format=csv,noheader | tee "$O/log.txt"
gpu_build "$O/build.txt" || exit 1; echo "build $(( $(date +%s)-t0 )) s" | tee -a "$O/log.txt"
export SAN_OPTS="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt" SAN_PAR=all SAN_T=${CALL_S:-565}
SAN_TOOLS="memcheck racecheck initcheck synccheck" SAN_FILTER="test_quant_experts_lab test_quant_experts_diet" \
  scripts/sanitize_gpu.sh "$O/q" > "$O/stdout_q.txt" 2>&1 &
SAN_TOOLS=synccheck \
SAN_FILTER="test_replay@0 test_replay@1 test_replay@2 test_replay@3 test_replay@4 test_replay@5 test_sampled@0 test_sampled@2 test_sampled@3 test_sampled@4 test_sampled@5 test_turbo_generate@0 test_turbo_generate@1 test_turbo_generate@2 test_turbo_generate@4 test_golden_logits@1 test_synth_logits@4 test_quant_synth_logits@0 test_quant_synth_logits@1 test_quant_synth_logits@2 test_quant_small_model" \
  scripts/sanitize_gpu.sh "$O/s" > "$O/stdout_s.txt" 2>&1
wait
echo "sanitize done $(( $(date +%s)-t0 )) s" | tee -a "$O/log.txt"
cat "$O"/s/summary_*.txt "$O"/q/summary_*.txt
# few files come back from a call: everything but log.txt in one archive
tar -czf "$O/all.tgz" -C "$O" q s build.txt stdout_q.txt stdout_s.txt && rm -rf "$O/q" "$O/s" "$O/build.txt" "$O"/stdout_*.txt
