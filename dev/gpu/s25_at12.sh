#!/usr/bin/env bash
# s25_at12.sh OUT: issue 12 item 2 (session 24, helper at12), one call, carry .devdeb; about 4-5 minutes on an H100:
#   1. the library for sm_90a in build-a (dev/gpu/att12.sh's build), then in parallel the attention lab (sm_90a,
#      -Xptxas -v: ptxas.txt, att_wq_kernel's registers and spills in ptxas_wq.txt) and tests/test_cuda
#   2. the lab twice with versions 6, 12, 14 and 15 side by side (lab.md; 6 is the backend's default, 14 is 12 with its
#      prologue's latency chain cut: the first K/V copies before the Q tile, the Q loads of a batch in flight
#      together; 15 is 14 with P V on wgmma, V read as a transposed B: its first run on hardware, the lab's check of
#      every row against double precision says whether the MN-major descriptor is read as the emulation reads it),
#      then once with --prof (prof.md: versions 12, 14 and 15 with att_wq_kernel's per-phase clock stamps,
#      timing only: where a block's time goes: prologue, wait + barrier, copies, Q K^T, softmax, P V, store; flash and
#      combine kernels timed apart)
#   3. test_attention for versions 12, 14 and 15 (DG_TEST_CASE, one process each: tests.txt)
# Verdict (docs/cuda.md "Attention at the 26B's decoder shapes", session 24): 14 (15) replaces 12 as the candidate if
# both its decoder rows at P 1024 are below 12's (14's) median by more than the two rows' spread in both runs and
# test_attention passes with it; prof.md says which phase the next version attacks.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: dev/gpu/s25_at12.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
mk() { make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" "$@"; }
mk build-a/libdgemma.a > /tmp/build_a.txt 2>&1 || { tail -30 /tmp/build_a.txt; exit 1; }
echo "== library built $(el)"
nvcc -O2 -std=c++17 $A -Iinclude -Isrc $XC -Xptxas -v dev/cuda/attention.cu build-a/libdgemma.a -L"$CUL" $NXL \
  -lcublas -lcudart -o build-a/attention_lab > "$OUT/ptxas.txt" 2>&1 &
lb=$!
mk build-a/tests/test_cuda > /tmp/build_t.txt 2>&1 &
tb=$!
wait $lb || { tail -20 "$OUT/ptxas.txt"; exit 1; }
echo "== lab built $(el)"
grep -A2 "Compiling entry.*att_wq_kernel" "$OUT/ptxas.txt" | grep -E "entry|registers|spill" > "$OUT/ptxas_wq.txt"
grep -c "0 bytes spill stores" "$OUT/ptxas_wq.txt"
wait $tb; echo "test_cuda build rc $? $(el)"
: > "$OUT/lab.md"
for run in 1 2; do
  timeout 120 build-a/attention_lab --versions 6,12,14,15 --reps 30 > /tmp/lab.md 2>&1
  echo "lab run $run rc $? $(el)"; { echo "## run $run (--versions 6,12,14,15 --reps 30)"; cat /tmp/lab.md; } >> "$OUT/lab.md"
  grep -E "^\| decoder|check" /tmp/lab.md | head -26
done
timeout 120 build-a/attention_lab --versions 12,14,15 --reps 5 --prof > "$OUT/prof.md" 2>&1
echo "lab --prof rc $? $(el)"; sed -n '/--prof/,$p' "$OUT/prof.md"
: > "$OUT/tests.txt"
for k in 12 14 15; do
  DG_TEST_CASE=$k DG_TEST_FILTER=test_attention timeout 120 build-a/tests/test_cuda >> "$OUT/tests.txt" 2>&1
  echo "test_attention case $k rc $? $(el)"
done
grep -E "^# attention|FAIL|ERROR|error" "$OUT/tests.txt" | head -20
echo "== done $(el)"
