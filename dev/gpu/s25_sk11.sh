#!/bin/bash
# Issue 11, lab version 112 (session 25, helper sk11; dev/cuda/qr_diet_lab.cuh qr_sk_kernel: the items past the last
# whole round of resident blocks split along K in 3 pieces, the last piece of each adding the pieces' fp32 sums in piece
# order) beside the backend (50) and its timeline (110), twice in one call. Builds on the machine (carry .devdeb only):
# the library for sm_90a (make -j16, build-sk) and the lab narrowed to versions 1-3, 40, 50, 95-112 (-DLAB_ONLY_SK;
# ~1-2 min), then `moe_quant --bits 4 --versions 50,110,112,113 --ms 16 --ts 128,256 --reps 5` twice: 110's rows with
# their timelines (the spread of 50 from run to run and the phases again), 112's rows checked against the CPU and,
# within both bounds, against version 50 (its split items' words differ from 50's: "vs 50: ... (ok)" under each 112
# row), 113 (an empty kernel over the same grid, timed the same way: a probe row, no check) for the time outside the
# blocks.
# The rule for adopting (docs/cuda.md "Session 25 (helper sk11)"): 112 is the candidate for the backend's 2-3 n-tile
# launch only if on both products at gathered T 256 and uniform M 16, in both runs, its median is more than 3 % under
# 50's and its min-max range does not overlap 50's, and every 112 row checks ok (CPU and vs 50).
# LAB_VERSIONS overrides the versions. About 3-4 minutes on an H100. Usage: bash dev/gpu/s25_sk11.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
V=${LAB_VERSIONS:-50,110,112,113}
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$O/log.txt"
mkdir -p build-sk
# the lab's object (one nvcc, single-threaded) beside the library's make -j16, then the link
nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_SK -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu -o build-sk/moe_quant.o \
  > "$O/lab_build.txt" 2>&1 &
lp=$!
make -j16 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-sk CUDA_ARCH="$A" build-sk/libdgemma.a > "$O/build.txt" 2>&1
echo "library rc $? $(el)" | tee -a "$O/log.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
nvcc $A build-sk/moe_quant.o build-sk/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-sk/moe_quant \
  >> "$O/lab_build.txt" 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-sk/moe_quant ] || { tail -30 "$O/build.txt" "$O/lab_build.txt"; exit 1; }
grep -A2 -E "Compiling entry.*qr_sk_kernel" "$O/lab_build.txt" | grep -E "Compiling|registers|spill" > "$O/sk_ptxas.txt"
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for run in 1 2; do
  echo "## run $run" >> "$O/lab.txt"
  timeout 150 build-sk/moe_quant --bits 4 --versions $V --ms 16 --ts 128,256 --reps 5 >> "$O/lab.txt" 2>&1
  echo "lab run $run rc $? $(el): $(grep -c 'ok, = v50' "$O/lab.txt") rows = v50, $(grep -c 'vs 50.*(ok)' "$O/lab.txt") 112 rows ok vs 50, $(grep -c FAIL "$O/lab.txt") FAIL so far" | tee -a "$O/log.txt"
done
grep -E '^## run|\| (50|112|113) \|' "$O/lab.txt" > "$O/rows.txt"
grep -E '^## run|\| 110 \||^  timeline|^   (phases|starts|slots|per-SM)' "$O/lab.txt" > "$O/timeline.txt"
cat "$O/rows.txt"
