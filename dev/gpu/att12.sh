#!/usr/bin/env bash
# att12.sh OUT: issue 12's attention lab versions 12 and 13 (dev/cuda/attention_lab.cuh: Q K^T on wgmma, whole rows
# per warp; session 23, helper att12) on the GPU machine, one call (carry .devdeb; about 6-9 minutes on an H100):
#   1. the library and tests/test_cuda for sm_90a in build-a (versions 12, 13 need wgmma; the default compute_90 build
#      skips them), then test_attention there: versions 1-13 within the derived bound (tests.txt)
#   2. the attention lab against build-a/libdgemma.a, sm_90a, with ptxas's registers and spills of every kernel
#      (ptxas.txt), run twice with versions 6, 12 and 13 side by side (lab.md: 26B decoder sliding / full at P 1024,
#      2048, 4096 and the encoder rows; each row checked against double precision, then timed, L2 flushed)
# The verdict rule (docs/cuda.md "Attention at the 26B's decoder shapes"): version 12 or 13 goes to the backend (behind
# DGEMMA_ATTN first) only if test_attention passes with it and each of its decoder rows at P 1024 (sliding and
# full) is below version 6's median by more than the two rows' spread in both runs.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: dev/gpu/att12.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
# TESTS=0: the library only (no test_cuda build and run: the lab alone, if the whole call would pass 600 s)
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" build-a/libdgemma.a \
  $([ "${TESTS:-1}" = 0 ] || echo build-a/tests/test_cuda) > /tmp/build_a.txt 2>&1 || { tail -30 /tmp/build_a.txt; exit 1; }
echo "== built $(el)"
nvcc -O2 -std=c++17 $A -Iinclude -Isrc $XC -Xptxas -v dev/cuda/attention.cu build-a/libdgemma.a -L"$CUL" $NXL \
  -lcublas -lcudart -o build-a/attention_lab > "$OUT/ptxas.txt" 2>&1 &
lb=$!
if [ "${TESTS:-1}" != 0 ]; then
  DG_TEST_FILTER=test_attention timeout 240 build-a/tests/test_cuda > "$OUT/tests.txt" 2>&1
  echo "test_attention rc $? $(el)"; grep -E "^# attention|FAIL|ERROR|error" "$OUT/tests.txt" | head -20
fi
wait $lb || { tail -20 "$OUT/ptxas.txt"; exit 1; }
grep -A1 -E "Compiling entry.*(att_wq_kernel|flash_pair_kernel)" "$OUT/ptxas.txt" | grep -E "registers|spill" | head -20
: > "$OUT/lab.md"
for run in 1 2; do
  timeout 150 build-a/attention_lab --versions 6,12,13 --reps 30 > /tmp/lab.md 2>&1
  echo "lab run $run rc $? $(el)"; { echo "## run $run (--versions 6,12,13 --reps 30)"; cat /tmp/lab.md; } >> "$OUT/lab.md"
  grep -E "^\||check" /tmp/lab.md | head -24
done
echo "== done $(el)"
