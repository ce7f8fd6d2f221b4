#!/usr/bin/env bash
# s25_dn12.sh OUT: issue 12 item 5's dense-product lab (dev/cuda/dense_lab.cu, session 24 helper dn12) on the GPU
# machine, one call (carry .devdeb; about 3-5 minutes on an H100; needs nothing built: the lab is one file, headers
# of src/cuda and cuBLAS only):
#   1. build the lab for sm_90a with ptxas's registers and spills of every kernel (ptxas.txt)
#   2. compute-sanitizer memcheck on four small runs (T 128 mlp_d; T 512 o_s: split-K atomics, two row passes;
#      T 256 mlp_gu with version 5's workspace and counters; T 256 qkv_s with version 6's), one rep each
#      (sanitizer.txt)
#   3. the lab twice (lab.md): the six dense shapes of a 26B pass (q/k/v sliding and full, o-proj sliding and full,
#      dense MLP gate|up and down) at T 128, 256, 512 rows, cuBLAS (version 0, the backend's call) and dn_kernel
#      versions 1-4 in the same run, each checked against double precision on 4,096 sampled outputs and against
#      cuBLAS, then timed (median of 30, L2 flushed before each); and for gate|up, the backend's pair (cuBLAS +
#      geglu4, "0g") against version 5 (GeGLU in the epilogue, h bf16 out), rows "mlp_gu+geglu"; and for the sliding
#      q/k/v, the pair (cuBLAS + qkv_post, "0q") against version 6 (norms, rope and the K/V cache writes in the
#      epilogue), rows "qkv_s+post"
#   4. a split-K sweep of versions 1, 4, 5 and 6 at T 256 (--ks 1, 2, 3, 4, 6, 8; ksweep.md): where the auto rule's choice sits
# Verdict rule (for a later session, not this script): a version goes to the backend for a shape only if it is within
# its bound there and its median is below cuBLAS's by more than the two rows' spread in both runs.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: dev/gpu/s25_dn12.sh OUT}
mkdir -p "$OUT" build-a
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc $XC -Xptxas -v dev/cuda/dense_lab.cu \
  -L"$CUL" $NXL -lcublas -lcudart -o build-a/dense_lab > "$OUT/ptxas.txt" 2>&1 || { tail -30 "$OUT/ptxas.txt"; exit 1; }
echo "== built $(el)"
grep -A2 -E "Compiling entry.*dn_kernel" "$OUT/ptxas.txt" | grep -E "entry|registers|spill|C75"
if command -v compute-sanitizer > /dev/null; then
  { timeout 120 compute-sanitizer --tool memcheck build-a/dense_lab --rows 128 --shapes mlp_d --reps 1 --samples 512
    echo "rc $?"
    timeout 120 compute-sanitizer --tool memcheck build-a/dense_lab --rows 512 --shapes o_s --reps 1 --samples 512
    echo "rc $?"
    timeout 120 compute-sanitizer --tool memcheck build-a/dense_lab --rows 256 --shapes mlp_gu --versions 0,5 --reps 1 --samples 512
    echo "rc $?"
    timeout 120 compute-sanitizer --tool memcheck build-a/dense_lab --rows 256 --shapes qkv_s --versions 0,6 --reps 1 --samples 512
    echo "rc $?"; } > "$OUT/sanitizer.txt" 2>&1
  echo "sanitizer $(el)"; grep -E "ERROR SUMMARY|rc |checks" "$OUT/sanitizer.txt"
fi
: > "$OUT/lab.md"
for run in 1 2; do
  timeout 200 build-a/dense_lab --reps 30 > /tmp/dl.md 2>&1
  echo "lab run $run rc $? $(el)"; { echo "## run $run (--reps 30)"; cat /tmp/dl.md; echo; } >> "$OUT/lab.md"
  grep -E "^# |per decoder pass|FAIL" /tmp/dl.md
  grep -E "^\| [a-z_+]+ \| 256 " /tmp/dl.md
done
: > "$OUT/ksweep.md"
for ks in 1 2 3 4 6 8; do
  timeout 60 build-a/dense_lab --reps 30 --rows 256 --versions 0,1,4,5,6 --ks $ks > /tmp/ks.md 2>&1
  echo "ks $ks rc $? $(el)"; { echo "## --ks $ks (versions 1, 4, 5, 6; version 0 cuBLAS)"; grep -E "^\||^# " /tmp/ks.md; echo; } >> "$OUT/ksweep.md"
done
grep -E "^\| [a-z_+]+ \| 256 \| [0-9]+ \| [0-9]+ \| [1456] " "$OUT/ksweep.md"
echo "== done $(el)"
