#!/bin/bash
# The next session's kernel call (issues 11, 12, 14), one command, carry .devdeb .devbin; about 7-9 minutes on an H100:
#   1. the LAB_LEAN expert lab of .devbin/moe_quant.xz (rebuilt at session 23's end: versions 50, 95-109, 120-122):
#      version 109 (moe11: the first weight stage before the row table) beside 50 and 95, twice (lab109.txt); the
#      large-M wgmma versions 120-122 (wg14) beside 50 at 64-256 rows per expert (lab_wl.txt);
#   2. in the background: the library and tests/test_cuda for sm_90a in build-a (dev/gpu/att12.sh's build), while
#      synccheck and racecheck run versions 109 and 120-122 with cuBLAS's kernels left out (san_*.txt);
#   3. test_quant_experts_wgmma, test_bulk_copy and test_attention on the sm_90a build (tests.txt);
#   4. the attention lab (att12: versions 6, 12, 13) twice (att_lab.md), as dev/gpu/att12.sh does.
# Verdict rules: docs/cuda.md "The next GPU calls". Usage: bash dev/gpu/s24_lab.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
lab_unpack
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$O/log.txt"
for run in 1 2; do
  timeout 120 /tmp/mq --bits 4 --versions 50,95,109 --ms 16 --ts 128,256 --reps 5 >> "$O/lab109.txt" 2>&1
  echo "lab109 run $run rc $? $(el): $(grep -c 'ok, = v50' "$O/lab109.txt") rows = v50 so far, $(grep -c FAIL "$O/lab109.txt") FAIL" | tee -a "$O/log.txt"
done
timeout 200 /tmp/mq --bits 4 --versions 50,120,121,122 --ms 64,128,256 --ts 1024,2048 --reps 10 > "$O/lab_wl.txt" 2>&1
echo "lab_wl rc $? $(el): $(grep -c FAIL "$O/lab_wl.txt") FAIL" | tee -a "$O/log.txt"
A="-gencode=arch=compute_90a,code=sm_90a"
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" build-a/libdgemma.a build-a/tests/test_cuda > /tmp/build_a.txt 2>&1
  echo "build_a rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
for tool in synccheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt /tmp/mq --bits 4 --versions 109,120,122 --ms 16,128 --ts none --reps 1 > "$O/san_$tool.txt" 2>&1
  echo "$tool rc $? $(el): $(grep -c 'ok' "$O/san_$tool.txt") rows ok; $(grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "$O/san_$tool.txt" | tr '\n' ' ')" | tee -a "$O/log.txt"
done
wait $bp; tail -5 /tmp/build_a.txt > "$O/build_tail.txt"
nvcc -O2 -std=c++17 $A -Iinclude -Isrc $XC -Xptxas -v dev/cuda/attention.cu build-a/libdgemma.a -L"$CUL" $NXL \
  -lcublas -lcudart -o build-a/attention_lab > /tmp/ptxas.txt 2>&1 &
lb=$!
for f in test_quant_experts_wgmma test_bulk_copy test_attention; do
  DG_TEST_FILTER=$f timeout 240 build-a/tests/test_cuda >> "$O/tests.txt" 2>&1; echo "$f rc $? $(el)" | tee -a "$O/log.txt"
done
wait $lb; echo "attention lab build rc $? $(el)" | tee -a "$O/log.txt"
grep -A1 -E "Compiling entry.*(att_wq_kernel|flash_pair_kernel)" /tmp/ptxas.txt | grep -E "registers|spill" > "$O/att_ptxas.txt"
for run in 1 2; do
  timeout 100 build-a/attention_lab --versions 6,12,13 --reps 30 > /tmp/lab.md 2>&1
  echo "attention lab run $run rc $? $(el)" | tee -a "$O/log.txt"; { echo "## run $run (--versions 6,12,13 --reps 30)"; cat /tmp/lab.md; } >> "$O/att_lab.md"
done
echo "done $(el)" | tee -a "$O/log.txt"
