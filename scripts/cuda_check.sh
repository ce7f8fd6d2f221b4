#!/usr/bin/env bash
# cuda_check.sh: build dgemma with CUDA and give the first verdict on a GPU machine.
#
#   scripts/cuda_check.sh --fetch   (here, with apt) download the .deb files of cJSON and cmocka into
#                                   .devdeb/ (git-ignored), for a GPU machine that lacks them and
#                                   cannot reach a package registry; carry .devdeb with the run
#   scripts/cuda_check.sh [LOG_DIR] (on the GPU machine) build with nvcc, print the GPU, run the smoke
#                                   (one encoder pass and two decoder steps of models/dgemma-small on
#                                   the GPU vs the CPU) and tests/test_cuda; logs go to LOG_DIR if given
#
# Without libcjson/libcmocka headers on the machine, the .deb files in .devdeb/ are unpacked under
# /tmp/dgdeps (never into /) and the build points at them (XCFLAGS/XLDFLAGS, rpath).
# Exit status: nonzero if the build, the smoke or a CUDA test failed.
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--fetch" ]; then
  mkdir -p .devdeb && cd .devdeb && apt-get download libcjson1 libcjson-dev libcmocka0 libcmocka-dev
  exit $?
fi
LOG=${1:-}
[ -n "$LOG" ] && mkdir -p "$LOG"

XC=""; XL=""
probe='#include <stddef.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include <cmocka.h>'
if ! echo "$probe" | cc -E -x c - >/dev/null 2>&1; then
  if ! ls .devdeb/*.deb >/dev/null 2>&1; then
    echo "cuda_check: cJSON/cmocka headers not found and no .devdeb/*.deb to unpack" >&2
    echo "  (run scripts/cuda_check.sh --fetch where apt works, and carry .devdeb)" >&2
    exit 2
  fi
  P=/tmp/dgdeps
  for f in .devdeb/*.deb; do dpkg -x "$f" "$P"; done
  L=$P/usr/lib/x86_64-linux-gnu
  XC="-I$P/usr/include"; XL="-L$L -Wl,-rpath,$L"
  echo "cuda_check: using cJSON/cmocka unpacked under $P"
fi

# cuBLAS: the toolkit's, else the one of the nvidia-cublas Python package (a CUDA image may carry only that)
NV=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_LIB=$(dirname "$NV")/../lib64
if ! ls "$CUDA_LIB"/libcublas.so >/dev/null 2>&1 || ! echo '#include <cublas_v2.h>' | "$NV" -E -x cu - >/dev/null 2>&1; then
  d=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null)
  if [ -n "$d" ] && ls "$d"/lib/libcublas.so.* >/dev/null 2>&1; then
    mkdir -p /tmp/dgcublas
    for l in "$d"/lib/libcublas.so.* "$d"/lib/libcublasLt.so.*; do ln -sf "$l" /tmp/dgcublas/"$(basename "$l" | sed 's/\.so\..*/.so/')"; done
    XC="$XC -I$d/include"; XL="$XL -L/tmp/dgcublas -Wl,-rpath,$d/lib"
    echo "cuda_check: using cuBLAS from $d"
  else
    echo "cuda_check: cuBLAS not found in $CUDA_LIB nor in the nvidia-cublas Python package" >&2
  fi
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
set -o pipefail
run() { if [ -n "$LOG" ]; then "$@" 2>&1 | tee -a "$LOG/$(basename "$1").log"; else "$@"; fi; }
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda 2>&1 | grep -E "error|warning|^make" ; [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "cuda_check: build failed"; exit 1; }
rc=0
echo "== build/dgemma info --device cuda"
if ! run build/dgemma info --device cuda; then
  rc=1
  echo "== again with DGEMMA_CUDA_SYNC=1 (a device fault then names its kernel)"
  DGEMMA_CUDA_SYNC=1 run build/dgemma info --device cuda
fi
echo "== build/tests/test_cuda"
run build/tests/test_cuda || rc=1
echo "cuda_check: $([ $rc -eq 0 ] && echo ok || echo FAILED)"
exit $rc
