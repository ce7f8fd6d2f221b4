#!/usr/bin/env bash
# step_kernels_lab_gpu.sh OUT: issue 12's small decoder-step kernels on the GPU machine in one command:
#   1. build with CUDA (libdgemma.a, tests/test_cuda)
#   2. the lab dev/cuda/step_kernels.cu: the sampler statistics, the self-conditioning probabilities and the
#      row kernels (rmsnorm, attn_residual, ffn_combine, geglu, qkv_post), the earlier version and the
#      backend's, each checked and timed against the read bandwidth (lab.md)
#   3. tests/test_cuda (test_step_stats and every other CUDA test: tests.txt)
# Carry .devdeb (cJSON/cmocka for machines without them). LAB_ARGS: extra lab arguments (e.g. --reps 50; --vocab:
# only the sampler statistics, sc probs and the vocab chain rows). TESTS=0: no tests; TEST_FILTERS="a b ...": only
# those tests of test_cuda (one process each, e.g. "test_vocab_chain test_step_stats test_sampled").
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/step_kernels_lab_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a build/tests/test_cuda > /tmp/build.txt 2>&1 \
  || { tail -30 /tmp/build.txt; exit 1; }
echo "== built $(el)"
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/step_kernels.cu build/libdgemma.a \
  -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/step_kernels_lab || exit 1
timeout 300 build/step_kernels_lab ${LAB_ARGS:-} > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"; cat "$OUT/lab.md"
if [ "${TESTS:-1}" = 1 ]; then
if [ -n "${TEST_FILTERS:-}" ]; then
  : > "$OUT/tests.txt"
  for t in $TEST_FILTERS; do
    DG_TEST_FILTER=$t timeout 300 build/tests/test_cuda >> "$OUT/tests.txt" 2>&1; echo "test_cuda $t rc $? $(el)"
  done
else
  timeout 300 build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $? $(el)"
fi
grep -E "^\[  (FAILED|PASSED|  ERROR) |^# step statistics|^# vocabulary chain|FAIL|error" "$OUT/tests.txt" | head -20
fi
echo "== done $(el)"
