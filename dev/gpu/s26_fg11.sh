#!/bin/bash
# Issue 11, lab version 114 (session 26, helper fg11; dev/cuda/qr_diet_lab.cuh qr_fg_kernel: gate/up and down in one
# launch, the blocks taking work tickets in order from a global counter, the gate/up items then the down items in
# version 50's order, each down block waiting only until its expert's gate/up blocks are counted) beside the backend's
# two launches with DGEMMA_DN_FUSE=1 (version 50's "gate_up+down" row) and the tail split 112 (not yet timed), twice in
# one call. Builds on the machine (carry .devdeb only): the library for sm_90a (make -j16, build-fg) and the lab
# narrowed to versions 1-3, 40, 50, 95-114 (-DLAB_ONLY_SK; ~1-2 min), then `moe_quant --bits 4 --versions 50,112,114
# --ms 16 --ts 128,256 --ss 256 --reps 5` twice (--ss 256: a skewed canvas, expert 0 in every token, so that 114's down
# blocks of expert 0 must wait for its 11-pass gate/up blocks: the GPU's test of the wait and of the acquire's
# ordering, by the words against 50's; its times are not part of the rule): 50's and 112's rows per product (112
# checked against the CPU and, within both bounds, against 50: "vs 50: ... (ok)"), then per case the gate_up+down rows
# of 50 (two launches) and 114 (one), both after the L2 flush, each checked against the CPU (h, and y over the
# kernel's own h), 114's h and y word for word against 50's ("ok, = v50" and "words that differ h 0 ..., y 0 ...") and
# its counters after the launches ("counters ok").
# ptxas (-Xptxas -v) of qr_fg_kernel's instances in fg_ptxas.txt.
#
# The rule for adopting (docs/cuda.md "Session 26 (helper fg11)", written before any GPU run): 114 becomes the
# candidate for the backend's gate/up + down at 2-3 n-tiles (with the fused down input) only if, at uniform M 16 and
# gathered T 256, in both runs, its gate_up+down median is more than 3 % under version 50's gate_up+down median of the
# same run, their min-max ranges do not overlap, and every 114 row (the skewed ones too) checks "ok, = v50" with 0
# words different and the counters ok. T 128 (2 n-tiles) is reported beside: a loss there beyond the spread keeps 2
# n-tiles on 50. A tie or a loss says the gate/up tail's empty slots are not recovered by down work or the ticket's
# round trip costs what they give (the next reading is then 114 with version 110's stamps). 112 is judged by session
# 25's rule (sk11).
# LAB_VERSIONS overrides the versions. About 4-5 minutes on an H100 (< 400 s). Usage: bash dev/gpu/s26_fg11.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
V=${LAB_VERSIONS:-50,112,114}
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$O/log.txt"
mkdir -p build-fg
# the lab's object (one nvcc, single-threaded) beside the library's make -j16, then the link
nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_SK -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu -o build-fg/moe_quant.o \
  > "$O/lab_build.txt" 2>&1 &
lp=$!
make -j16 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-fg CUDA_ARCH="$A" build-fg/libdgemma.a > "$O/build.txt" 2>&1
echo "library rc $? $(el)" | tee -a "$O/log.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
nvcc $A build-fg/moe_quant.o build-fg/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-fg/moe_quant \
  >> "$O/lab_build.txt" 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-fg/moe_quant ] || { tail -30 "$O/build.txt" "$O/lab_build.txt"; exit 1; }
grep -A2 -E "Compiling entry.*qr_fg_kernel" "$O/lab_build.txt" | grep -E "Compiling|registers|spill" > "$O/fg_ptxas.txt"
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for run in 1 2; do
  echo "## run $run" >> "$O/lab.txt"
  timeout 170 build-fg/moe_quant --bits 4 --versions $V --ms 16 --ts 128,256 --ss 256 --reps 5 >> "$O/lab.txt" 2>&1
  echo "lab run $run rc $? $(el): $(grep -c '| 114 | .*ok, = v50' "$O/lab.txt") 114 rows ok = v50, $(grep -c 'counters ok' "$O/lab.txt") with counters ok, $(grep -c 'vs 50.*(ok)' "$O/lab.txt") 112 rows ok vs 50, $(grep -c FAIL "$O/lab.txt") FAIL so far" | tee -a "$O/log.txt"
done
grep -E '^## run|\| (50|112|114) \|' "$O/lab.txt" > "$O/rows.txt"
grep -E '^## run|gate_up\+down|version 114' "$O/lab.txt" > "$O/fused.txt"
cat "$O/fused.txt"
