#!/usr/bin/env bash
# sanitize_gpu.sh OUT: compute-sanitizer (memcheck, then racecheck) over the quantized-MoE tests of
# tests/test_cuda on the GPU machine (carry .devdeb); logs in OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/sanitize_gpu.sh OUT}
mkdir -p "$OUT"
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
for tool in memcheck racecheck; do
  DG_TEST_FILTER='test_quant_experts' timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/test_cuda \
    > "$OUT/$tool.txt" 2>&1; echo "$tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|OK \]|FAILED" "$OUT/$tool.txt" | tail -4
done
