#!/bin/bash
# Session 26's call for issue 14 (helper bi14): batch-invariant dense products, so that a stacked batch pass runs each
# dense product once over all its canvases' rows and every canvas still gets its single run's bits
# (DGEMMA_STACK_DENSE=inv, src/cuda/gemm_inv.cu; docs/cuda.md "Session 26 (helper bi14)"). One command, carry
# .devdeb .devdata/gemma3; about 7-8 minutes on an H100 (< 540 s):
#   1. at once, in the background: the lab dev/cuda/gemm_inv.cu (sm_90a, ~30 s to build, then ~1-3 min on the GPU;
#      timeout 240 s), gemm_inv.txt and gemm_inv.jsonl: per product of a 26B pass and row count M in {1 .. 2048}
#      (a) whether cuBLAS's default gives row r at M the same words as at M = 2048, (b) every configuration of the
#      heuristic lists at M = 256 and 2048 run at every M (invariant? ms per M, '*' = not offered at that M), (c) the
#      verdict per product (the fastest invariant configuration, its cost against the default, its table line for
#      src/cuda/gemm_inv.cu INV_CFG). On a fresh machine it runs beside the build (make -j12 of 16 cores; after fgb and
#      vs12 on the warm machine there is nothing to build): GPU event timings, L2 flushed; the CPU load can add launch
#      gaps to the smallest products' times (a few us), not to the large ones;
#   2. in the background: the library, CLI and tests/test_cuda in build/ with the Makefile's default CUDA_ARCH (sm_90a
#      SASS, the same kernels as an sm_90a-only build, + compute_90 PTX) and the same make line as s26_fgb.sh and
#      s26_vs12.sh, so that after them on a warm machine nothing is rebuilt (build-a with CUDA_ARCH=sm_90a alone was a
#      whole second build, ~110-220 s), and the CPU CLI writing the 26B random checkpoint /tmp/dg26b
#      (gpu_mkrandom_cpu_bg, ~280 s; kept from an earlier call: /tmp/dg26b.ok);
#   3. once the lab is done and build/ is there: the GPU tests under the switch (tests.txt):
#      test_gemm_inv (each product of a 26B pass: the first M2 rows of its product over 566 rows equal its product
#      over M2 = 1 and 163 rows, word for word; within 2 gamma_K sum |a b| of the default), test_turbo_batch with
#      DGEMMA_STACK_DENSE=inv (every canvas of a B = 2 batch equals its single run, both under the switch),
#      test_turbo_batch_inv (the same forced in the test), and test_turbo_batch with the default (unchanged);
#   4. the batch bench on the 26B, B = 1, 4, 8, --reps 2, default (bench.txt / .jsonl) and with
#      DGEMMA_STACK_DENSE=inv (bench_inv.txt / .jsonl); each ~70 s.
# The rule, written before any GPU run: DGEMMA_STACK_DENSE=inv becomes the backend's default only if ALL of
#   (i)   test_gemm_inv, test_turbo_batch (under the switch) and test_turbo_batch_inv pass here;
#   (ii)  bench_inv.txt's "same tokens as smaller B" column reads 1/1 and 4/4 (every canvas its own single run);
#   (iii) inv's B = 4 and B = 8 tok/s both exceed the default's of this call (bench.txt) by at least 5 % and by
#         more than the two rows' spreads;
#   (iv)  inv's B = 1 tok/s is within 3 % of the default's B = 1 (the single-canvas path runs the invariant
#         algorithms too: a larger loss there costs every single-canvas protocol);
#   (v)   every product's verdict in gemm_inv.txt is a configuration invariant at every M (no "none"), and the one
#         the backend chose (test_gemm_inv's "config" lines: table or fallback rule) is one the lab found invariant.
# If (v) fails for the fallback rule's choice but the lab names another invariant configuration: paste the lab's
# table lines into src/cuda/gemm_inv.cu INV_CFG and run this again (no default change in between). If (iii) fails
# with (i), (ii) and (v) met: the switch stays off; the lab's per-product costs say which product to replace (a
# product of our own whose k order is fixed, as the experts' kernels are) before trying again.
# Usage: bash dev/gpu/s26_bi14.sh $OUT
O=${1:?usage: dev/gpu/s26_bi14.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
mkdir -p build; rm -f build/gemm_inv # never an earlier call's on a warm machine
( nvcc -O2 -std=c++17 $A dev/cuda/gemm_inv.cu -L"$CUL" -lcublasLt -lcublas -o build/gemm_inv > /tmp/lab_build.txt 2>&1
  echo "lab build rc $? $(el)" >> "$O/log.txt"; tail -5 /tmp/lab_build.txt >> "$O/log.txt"
  timeout 240 build/gemm_inv --reps 7 --json "$O/gemm_inv.jsonl" > "$O/gemm_inv.txt" 2>&1
  echo "lab rc $? $(el)" >> "$O/log.txt" ) &
lp=$!
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda \
    > /tmp/build_a.txt 2>&1; echo "build rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
wait $lp
grep -E '^\(c\)|table line|^per decoder pass' "$O/gemm_inv.txt" | tee -a "$O/log.txt"
wait $bp; tail -3 /tmp/build_a.txt >> "$O/log.txt"
for t in test_gemm_inv test_turbo_batch test_turbo_batch_inv; do
  DGEMMA_STACK_DENSE=inv DG_TEST_FILTER=$t timeout 90 build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "$t (DGEMMA_STACK_DENSE=inv) rc $? $(el)" | tee -a "$O/log.txt"
done
DG_TEST_FILTER=test_turbo_batch timeout 60 build/tests/test_cuda >> "$O/tests.txt" 2>&1
echo "test_turbo_batch (default) rc $? $(el)" | tee -a "$O/log.txt"
grep -E '^# gemm inv' "$O/tests.txt"
# a test that skips exits 0 too ("[  PASSED  ] 0 test(s)"): count the passes
echo "tests: $(grep -c '\[  PASSED  \] 1 test' "$O/tests.txt") of 4 passed, $(grep -c '^\[  SKIPPED \] 1 test' "$O/tests.txt") skipped, $(grep -c '^\[  FAILED  \] 1 test' "$O/tests.txt") failed" | tee -a "$O/log.txt"
wait $mk; tail -2 /tmp/mkrandom.log >> "$O/log.txt"
timeout 120 build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 --reps 2 \
  -o "$O/bench.jsonl" > "$O/bench.txt" 2>&1
echo "batch default rc $? $(el)" | tee -a "$O/log.txt"
DGEMMA_STACK_DENSE=inv timeout 120 build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 \
  --reps 2 -o "$O/bench_inv.jsonl" > "$O/bench_inv.txt" 2>&1
echo "batch DGEMMA_STACK_DENSE=inv rc $? $(el)" | tee -a "$O/log.txt"
grep -E '^\| [148] \|' "$O/bench.txt" "$O/bench_inv.txt"
echo "done $(el)" | tee -a "$O/log.txt"
