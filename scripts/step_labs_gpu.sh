#!/usr/bin/env bash
# step_labs_gpu.sh OUT: issue 12's decoder-step labs on the GPU machine in one command (after a CUDA build of
# libdgemma.a): the router stage (dev/cuda/step_kernels.cu --router: the chain, route_kernel and the tiles path,
# each checked word for word against the chain) and the attention versions ATT_V (dev/cuda/attention.cu,
# default 2,6; ATT_V=none: the router lab alone). After the labs, TESTS="test_route test_router_route" (for
# example) runs those tests of build/tests/test_cuda (tests.txt). Output: OUT/labs.md (the labs' tables) and the
# log. Carry .devdeb.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/step_labs_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/build_labs.txt 2>&1 \
  || { tail -30 /tmp/build_labs.txt; exit 1; }
echo "== built $(el)"
NV="nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC"
LIBS="build/libdgemma.a -L$CUL $NXL -lcublas -lcudart -lcjson -lgomp"
ATT_V=${ATT_V:-2,6}
: > /tmp/b2.txt
$NV dev/cuda/step_kernels.cu $LIBS -o build/step_kernels_lab > /tmp/b1.txt 2>&1 & p1=$!
p2=
[ "$ATT_V" != none ] && { $NV dev/cuda/attention.cu $LIBS -o build/attention_lab > /tmp/b2.txt 2>&1 & p2=$!; }
wait $p1 $p2 # by pid: a bare wait would also wait for the tee of the exec above, which never ends
tail -3 /tmp/b1.txt /tmp/b2.txt
echo "== labs built $(el)"
: > "$OUT/labs.md"
{ echo "## router stage (build/step_kernels_lab --router ${ROUTER_ARGS:---reps 50})"; timeout 150 build/step_kernels_lab --router ${ROUTER_ARGS:---reps 50} 2>&1; echo "rc $?"; } >> "$OUT/labs.md"
echo "router lab $(el)"
if [ "$ATT_V" != none ]; then
{ echo; echo "## attention (build/attention_lab --versions $ATT_V)"; timeout 150 build/attention_lab --versions "$ATT_V" 2>&1; echo "rc $?"; } >> "$OUT/labs.md"
echo "attention lab $(el)"
fi
grep -E "^\||^##|rc [0-9]|differ|FAIL" "$OUT/labs.md" | head -80
if [ -n "${TESTS:-}" ]; then
  make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/build_tests.txt 2>&1 \
    || tail -30 /tmp/build_tests.txt
  : > "$OUT/tests.txt"
  for t in $TESTS; do DG_TEST_FILTER=$t timeout 120 build/tests/test_cuda >> "$OUT/tests.txt" 2>&1; echo "$t rc $? $(el)"; done
  grep -E "^\[  (FAILED|PASSED|  ERROR) |^# router|FAIL|rror" "$OUT/tests.txt" | head -20
fi
echo "== done $(el)"
