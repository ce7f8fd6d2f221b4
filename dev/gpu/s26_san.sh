#!/bin/bash
# Session 26's sanitizer call (issue 16's account, docs/cuda.md): the four tools over what is new since session 24 on
# the default build (sm_90a SASS + compute_90 PTX; build/ is made by dev/gpu/s26_call2.sh on a warm machine, else here
# by scripts/sanitize_gpu.sh): test_attention case 15 (the passes' default on Hopper since session 25),
# test_attention_choice, test_quant_experts_sk (lab version 112), test_profile_batch and test_turbo_batch. cuBLAS's
# kernels left out for memcheck, initcheck and synccheck (session 21's control), in for racecheck (session 20).
# Carry .devdeb; ~3-5 min. Usage: bash dev/gpu/s26_san.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
F="test_attention@15 test_attention_choice test_quant_experts_sk test_profile_batch test_turbo_batch"
git log --oneline -1 | tee "$O/log.txt"; nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$O/log.txt"
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > "$O/build.txt" 2>&1 || { tail -30 "$O/build.txt"; exit 1; }
echo "build $(el)" | tee -a "$O/log.txt"
DGEMMA_INITCHECK=1 SAN_OPTS="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt" SAN_PAR=all SAN_T=400 \
  SAN_DEADLINE=$(( $(date +%s) + 480 )) SAN_TOOLS="memcheck initcheck synccheck" SAN_FILTER="$F" scripts/sanitize_gpu.sh "$O/a" > "$O/stdout_a.txt" 2>&1 &
ba=$!
SAN_PAR=all SAN_T=400 SAN_DEADLINE=$(( $(date +%s) + 480 )) SAN_TOOLS=racecheck SAN_FILTER="$F" scripts/sanitize_gpu.sh "$O/b" > "$O/stdout_b.txt" 2>&1
wait $ba
echo "done $(el)" | tee -a "$O/log.txt"
cat "$O"/a/summary_*.txt "$O"/b/summary_*.txt 2>/dev/null | tee -a "$O/log.txt"
