#!/bin/bash
# (Session 28: rule (a) met, rule (b) not (M 566: version 5 3.913 vs version 6 1.917 ms): the hook, src/cuda/sc_prod.cu and
# test_sc_prod were removed; the lab's header is dev/cuda/sc_prod.cuh, part 1 still runs, part 3's test_sc_prod is gone.)
# Session 27's call for issues 12 and 14 (helper sk12): the batch-invariant self-conditioning product P . E of our own
# (src/cuda/sc_prod.cuh; docs/cuda.md "Session 27 (helper sk12)"). One command, carry .devdeb .devdata/gemma3; < 300 s
# on an H100 (every step under a timeout from one 285 s budget). At most 7 files back.
#   1. at once: the lab dev/cuda/sc_prod.cu (sm_90a, a few s to build; ~1 min to run), sc_prod.txt: per version
#      (0 cuBLAS's default, 1 sc_prod with the backend's tile choice, 2-4 tiles forced to 128 / 64 / 16 rows, 5 the
#      backend's path with 256-row chunks, 7 the 128-row tile with 4 stages (one block an SM), 6 cublasLt's
#      split-K-1 entry, the invariant configuration that DGEMMA_STACK_DENSE=inv ran before this session) and M in {1, 2, 8, 16, 64, 163, 256, 566, 1024, 2048}: ms
#      (median of 7, L2 flushed, [min - max]), GB/s, % of the floor (the compulsory bytes at the read ceiling measured in
#      the same run), the ratio to version 0, rows differing from the version's own M = 2048 output; the fp64 checks;
#   2. in the background from the start: build/ with the Makefile's default CUDA_ARCH and the same make line as
#      s26_bi14.sh (a warm machine after it rebuilds only what changed), and the 26B random checkpoint /tmp/dg26b
#      (gpu_mkrandom_cpu_bg; kept from an earlier call: /tmp/dg26b.ok);
#   3. the GPU tests (tests.txt): test_sc_prod (the 26B shape: the first 1 and 163 rows of the 566-row product equal
#      the 1- and 163-row products word for word, every tile, the chunking and the backend's hook give the same words,
#      256 samples within the fp64 bound), then test_gemm_inv with DGEMMA_STACK_DENSE=inv (the SC shape now through
#      sc_prod: 0 words differ, "config ... (sc_prod.cu, v[3] its runs)");
#   4. if the checkpoint is there and at least 110 s of the budget are left: the batch bench on the 26B, B = 1, 4,
#      --reps 2, default (bench.txt) and DGEMMA_STACK_DENSE=inv (bench_inv.txt), each under a timeout of half the rest.
# The rule, written before any GPU run:
#   (a) sc_prod is batch-invariant on the GPU iff sc_prod.txt's versions 1-5 and 7 show 0 rows differing at every M,
#       their check lines are within the bound and versions 2-5, 7 "all words equal to version 1's" (PASS at the end),
#       and
#       test_sc_prod passes. If not: the hook (src/cuda/gemm_inv.cu lines 231-232, and its free at line 220) comes out again before any commit to
#       main, and DGEMMA_STACK_DENSE=inv keeps cublasLt's split-K-1 product.
#   (b) with (a): under DGEMMA_STACK_DENSE=1 and inv the SC product stays on sc_prod (this commit) if version 5's
#       median is below version 6's at M = 163 and 566 (the B = 1 and B = 4 rows of the stacked pass).
#   (c) with (a): sc_prod becomes the SC product's default everywhere (DGEMMA_STACK_DENSE unset too: a later commit,
#       soft_from and dg_cuda_turbo_sc calling sc_prod_gemm first) iff at M = 163 AND M = 256 (a B = 1 turbo pass and
#       the reference canvas) version 5's median is at least 3 % below version 0's and its max below version 0's
#       min, and at no M <= 256 of the list is version 5's median more than 5 % above version 0's. Otherwise it
#       stays behind the switch (the single-canvas default keeps cuBLAS's faster, not invariant, product).
#   (d) bench_inv.txt's "same tokens as smaller B" column must read 1/1 and 4/4 (and 8/8 in bench mode): every canvas
#       its own run's tokens, the SC product included; its B = 1 / 4 tok/s against this session's earlier inv row
#       (479.0 / 672.8) and the default's of this call: expected + ~5-7 % at B = 1 (the 163-row SC product ~1.37 ->
#       ~0.6 ms in a pass of ~12 ms).
# A fresh machine spends ~110-220 s on build/ (common.cuh and host.cuh changed: every CUDA object) beside mkrandom's
# ~205-280 s, so part 4 will mostly be skipped; then, on the same warm machine (build/ and /tmp/dg26b kept):
#   bash dev/gpu/s27_sk12.sh $OUT bench     (part 4 alone, B = 1, 4, 8, ~4 min; 5 files back; up to ~8 min where
#   the first call ended before mkrandom did and the checkpoint is written again: still under the 600 s limit)
# Usage: bash dev/gpu/s27_sk12.sh $OUT [bench]
O=${1:?usage: dev/gpu/s27_sk12.sh OUT [bench]}; mkdir -p "$O"
. scripts/gpu_env.sh
if [ "$2" = bench ]; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
  git log --oneline -1 | tee -a "$O/log.txt"
  make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all > /tmp/build_a.txt 2>&1; echo "build rc $? $(el)" >> "$O/log.txt"
  gpu_mkrandom_cpu_bg "$O/log.txt"; wait $mk
  # each bench ~100-110 s at B = 1, 4, 8 (session 27's bi14 call: 109 and 98 s); capped at the call's limit
  # (DG_CALL_S: scripts/gpu_env.sh), the second only with >= 100 s of it left
  timeout "$(call_cap 200)" build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 --reps 2 \
    -o "$O/bench.jsonl" > "$O/bench.txt" 2>&1
  echo "batch default rc $? $(el)" | tee -a "$O/log.txt"
  [ "$(call_left)" -ge 100 ] || { echo "batch DGEMMA_STACK_DENSE=inv skipped: $(call_left) s left of the call $(el)" | tee -a "$O/log.txt"; exit 0; }
  DGEMMA_STACK_DENSE=inv timeout "$(call_cap 200)" build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 \
    --reps 2 -o "$O/bench_inv.jsonl" > "$O/bench_inv.txt" 2>&1
  echo "batch DGEMMA_STACK_DENSE=inv rc $? $(el)" | tee -a "$O/log.txt"
  grep -E '^\| [148] \|' "$O/bench.txt" "$O/bench_inv.txt"
  exit 0
fi
BUDGET=$(call_budget 285) # 285 s, or less where DG_CALL_S says the call's limit is less (scripts/gpu_env.sh)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
mkdir -p build; rm -f build/sc_prod_lab # never an earlier call's on a warm machine
( nvcc -O2 -std=c++17 $A -Iinclude -Isrc dev/cuda/sc_prod.cu -L"$CUL" -lcublasLt -lcublas -o build/sc_prod_lab \
    > /tmp/sc_lab_build.txt 2>&1
  echo "lab build rc $? $(el)" >> "$O/log.txt"; tail -5 /tmp/sc_lab_build.txt >> "$O/log.txt"
  timeout "$(call_cap 150)" build/sc_prod_lab --reps 7 > "$O/sc_prod.txt" 2>&1
  echo "lab rc $? $(el)" >> "$O/log.txt" ) &
lp=$!
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda \
    > /tmp/build_a.txt 2>&1; echo "build rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
wait $lp
grep -E '^# |^check|^\| [0-7] \| (1|163|256|566|2048) \||PASS|FAIL' "$O/sc_prod.txt" | tee -a "$O/log.txt"
wait $bp; tail -3 /tmp/build_a.txt >> "$O/log.txt"
DG_TEST_FILTER=test_sc_prod timeout "$(call_cap 60)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
echo "test_sc_prod rc $? $(el)" | tee -a "$O/log.txt"
DGEMMA_STACK_DENSE=inv DG_TEST_FILTER=test_gemm_inv timeout "$(call_cap 60)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
echo "test_gemm_inv (DGEMMA_STACK_DENSE=inv) rc $? $(el)" | tee -a "$O/log.txt"
grep -E '^# (sc_prod|gemm inv shape 7)' "$O/tests.txt" | tee -a "$O/log.txt"
echo "tests: $(grep -c '\[  PASSED  \] 1 test' "$O/tests.txt") of 2 passed, $(grep -c '^\[  SKIPPED \] 1 test' "$O/tests.txt") skipped, $(grep -c '^\[  FAILED  \] 1 test' "$O/tests.txt") failed" | tee -a "$O/log.txt"
if [ -f /tmp/dg26b.ok ] && [ "$(left)" -ge 110 ]; then
  T=$(( $(left) / 2 - 5 ))
  timeout $T build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4 --reps 2 \
    -o "$O/bench.jsonl" > "$O/bench.txt" 2>&1
  echo "batch default rc $? (timeout $T) $(el)" | tee -a "$O/log.txt"
  T=$(( $(left) - 5 ))
  DGEMMA_STACK_DENSE=inv timeout $T build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4 \
    --reps 2 -o "$O/bench_inv.jsonl" > "$O/bench_inv.txt" 2>&1
  echo "batch DGEMMA_STACK_DENSE=inv rc $? (timeout $T) $(el)" | tee -a "$O/log.txt"
  grep -E '^\| [14] \|' "$O/bench.txt" "$O/bench_inv.txt"
else
  echo "bench skipped: checkpoint $( [ -f /tmp/dg26b.ok ] && echo there || echo 'not (yet) there'), $(left) s left $(el)" | tee -a "$O/log.txt"
fi
echo "done $(el)" | tee -a "$O/log.txt"
