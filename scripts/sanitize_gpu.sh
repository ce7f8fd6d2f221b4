#!/usr/bin/env bash
# sanitize_gpu.sh OUT: compute-sanitizer (memcheck, then racecheck) over tests of tests/test_cuda on the GPU
# machine (carry .devdeb); logs in OUT. SAN_FILTER: the DG_TEST_FILTER pattern (default: the quantized MoE), a space-separated list;
# SAN_TOOLS: the tools (default "memcheck racecheck"; also initcheck, synccheck); SAN_T: seconds per run (default 120).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/sanitize_gpu.sh OUT}
mkdir -p "$OUT"
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/san_build.txt 2>&1 || { tail -20 /tmp/san_build.txt; exit 1; }
for f in ${SAN_FILTER:-test_quant_experts}; do
for tool in ${SAN_TOOLS:-memcheck racecheck}; do
  log="$OUT/${tool}_$(echo "$f" | tr -c "A-Za-z0-9_\n" x).txt" # no * in a file name (they do not come back)
  DG_TEST_FILTER="$f" timeout ${SAN_T:-120} compute-sanitizer --tool $tool --error-exitcode 9 build/tests/test_cuda \
    > "$log" 2>&1; echo "$f $tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY|INITCHECK SUMMARY|OK \]|FAILED" "$log" | tail -4
done
done
