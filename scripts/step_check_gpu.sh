#!/usr/bin/env bash
# step_check_gpu.sh OUT: the whole step after a round of kernel changes, in one GPU-machine call (issue 12):
#   1. build with CUDA; the 26B-A4B random checkpoint written meanwhile (dgemma mkrandom)
#   2. the step-kernel lab dev/cuda/step_kernels.cu (step_lab.md) when it exists
#   3. tests/test_cuda (tests.txt)
#   4. dgemma bench --device cuda --protocol vllm --reps 2 --profile (bench_vllm.jsonl, bench_vllm.txt)
#   5. NCU=1: per-kernel GPU time of one mid-request forward (ncu_step.txt)
# Carry .devdeb and .devdata.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/step_check_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
gpu_build /tmp/build.txt || exit 1
echo "== built $(el)"
gpu_mkrandom_bg 8
if [ -f dev/cuda/step_kernels.cu ]; then
  nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/step_kernels.cu build/libdgemma.a \
    -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/step_kernels_lab \
    && { timeout 150 build/step_kernels_lab ${LAB_ARGS:-} > "$OUT/step_lab.md" 2>&1; echo "step lab rc $? $(el)"; cat "$OUT/step_lab.md"; }
fi
timeout 200 build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $? $(el)"
grep -E "^\[  (FAILED|PASSED|  ERROR) |FAIL|ERROR" "$OUT/tests.txt" | head -20
wait $mk; tail -1 /tmp/mkrandom.log
timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile -o "$OUT/bench_vllm.jsonl" \
  > "$OUT/bench_vllm.txt" 2>&1; echo "bench rc $?"; tail -22 "$OUT/bench_vllm.txt"
if [ "${NCU:-0}" = 1 ]; then
  timeout ${NCU_T:-150} ncu --metrics gpu__time_duration.sum --launch-skip ${STEP_SKIP:-3000} --launch-count ${STEP_COUNT:-600} \
    --csv --print-units base build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 1 > /tmp/ncu.csv 2>/tmp/ncu.err
  echo "ncu rc $? $(el)"; python3 scripts/ncu_sum.py /tmp/ncu.csv > "$OUT/ncu_step.txt"; head -32 "$OUT/ncu_step.txt"
fi
echo "== done $(el)"
