#!/usr/bin/env bash
# attention_gpu.sh OUT: issue 12's attention on the GPU machine in one command:
#   1. build with CUDA; the 26B-A4B random checkpoint written meanwhile (dgemma mkrandom)
#   2. the attention lab dev/cuda/attention.cu (every version, checked and timed: lab.md)
#   3. tests/test_cuda (test_attention's derived bound and every other CUDA test: tests.txt)
#   4. dgemma bench --device cuda --protocol vllm --profile on the checkpoint (bench_vllm.jsonl, bench_vllm.txt:
#      the stage split)
#   5. per-kernel GPU time of one mid-request forward (scripts/step_kernels_gpu.sh's ncu pass: ncu_step.txt)
# Carry .devdeb and .devdata.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/attention_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
gpu_build /tmp/build.txt || exit 1
echo "== built $(el)"
gpu_mkrandom_bg 12
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/attention.cu build/libdgemma.a \
  -L"$CUL" $NXL -lcublas -lcudart -o build/attention_lab || exit 1
timeout 120 build/attention_lab ${LAB_ARGS:-} > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"; cat "$OUT/lab.md"
timeout 200 build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $? $(el)"
grep -E "^\[  (FAILED|PASSED|  ERROR) |^# attention|FAIL|error" "$OUT/tests.txt" | head -20
wait $mk; tail -1 /tmp/mkrandom.log
timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile -o "$OUT/bench_vllm.jsonl" \
  > "$OUT/bench_vllm.txt" 2>&1; echo "bench rc $?"; tail -22 "$OUT/bench_vllm.txt"
echo "== bench $(el)"
if [ "${NCU:-1}" = 1 ]; then
timeout ${NCU_T:-200} ncu --metrics gpu__time_duration.sum --launch-skip ${STEP_SKIP:-3000} --launch-count ${STEP_COUNT:-600} \
  --csv --print-units base build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 1 > /tmp/ncu.csv 2>/tmp/ncu.err
echo "ncu rc $? $(el)"
python3 scripts/ncu_sum.py /tmp/ncu.csv > "$OUT/ncu_step.txt"; head -30 "$OUT/ncu_step.txt"
fi
echo "== done $(el)"
