#!/bin/bash
# Session 27's call for issue 14 (helper sc14): the turbo engine's exact self-conditioning probabilities in three
# launches over a table of canvases instead of one 512-thread block per row (k_turbo_sc_probs_tab, src/cuda/turbo.cu;
# the same words: the row kernel's order of its double sum is kept), and a batched pass's top-K and SC rows as one
# backend call each over its canvases (head_topk_batch / sc_rows_batch: one top-K launch and one probabilities
# launch on the work stream instead of B of each on B streams, the exact SC products made on the GPU while the host
# runs the canvases' steps; under DGEMMA_STACK_DENSE 1 / inv also one P . E product over the canvases' rows side by
# side). docs/cuda.md "Session 27 (helper sc14)". One command, carry
# .devdeb .devdata/gemma3; ~9 minutes on a fresh H100 (the guards plan in 580 s, or DG_CALL_S - 20 where the lead
# passes a call limit below 600; each test and bench under a timeout capped at the call's limit; less on a warm machine
# whose build/ is there):
#   1. in the background: the library, CLI and tests/test_cuda in build/ (the Makefile's default CUDA_ARCH and the
#      same make line as s26_bi14.sh / s26_fgb.sh / s26_vs12.sh: on a warm machine only the changed files build), and
#      the 26B random checkpoint /tmp/dg26b (gpu_mkrandom_cpu_bg; kept from an earlier call: /tmp/dg26b.ok);
#   2. the GPU tests (tests.txt): test_turbo_sc_probs (the table launches against the row kernel at V 333, 1,100
#      and 262,144: every bf16 word and every row's softmax sum bit for bit), test_turbo_topk (the rewritten device
#      top-K: one warp a chunk, shared-memory sorts; against the CPU's dg_topk_hier bit for bit, also at V 262,144),
#      test_turbo_sc (the device SC rows against the CPU's within the derived bound), test_turbo_generate (the
#      single-canvas turbo path against the CPU's), test_turbo_batch (B = 3 stacked: every canvas equals its own run,
#      tokens and step traces) by default, with DGEMMA_TURBO_BATCH=0 (the per-canvas path of session 26) and with
#      DGEMMA_STACK_DENSE=inv, test_turbo_batch_inv, test_turbo_batch9 with DGEMMA_ENC_CHUNK=64 (9 canvases: two
#      table launches, two stacks, under inv SC rows made at the scatter past the work context's 128 rows),
#      test_turbo_continuous (dg_batch_step), test_profile_batch;
#   3. `dgemma bench --protocol batch --device cuda --reps 2 --profile` on the 26B: default B = 1, 4, 8 (bench.txt);
#      the session-26 path DGEMMA_TURBO_BATCH=0 DGEMMA_SC_PROBS=row B = 1, 4 (bench_base.txt: the same tokens, the
#      baseline of this call; the top-K's rewrite has no switch, so it runs in both: its own effect shows against
#      session 26's "sampler statistics" rows, 0.521 ms a B = 1 pass, docs/results/h100-s26/bp14/bench.txt);
#      DGEMMA_STACK_DENSE=inv B = 1, 4, 8 (bench_inv.txt; only with >= 135 s left: ~120 s with the profile run; bench_base
#      only with >= 85 s left: B = 1, 4 ~75 s). The three runs' JSON rows in
#      bench.jsonl, each run's after a {"kind": "run", ...} line.
# The rules, written before any GPU run:
#   (A) the table probabilities stay the default (DGEMMA_SC_PROBS unset) only if test_turbo_sc_probs and
#       test_turbo_sc pass here AND bench.txt's B = 1 profile shows "self-conditioning" ms per pass below
#       bench_base.txt's B = 1 (expected ~1.38 -> ~0.9 ms). Otherwise the default goes back to the row kernel
#       (sc_probs_env in src/cuda/turbo_host.cu returns 0 unless DGEMMA_SC_PROBS=tab): the words are the same either way.
#   (B) the batched pass's one-call top-K and SC (DGEMMA_TURBO_BATCH unset) stay the default only if
#       test_turbo_batch (default, =0 and inv), test_turbo_continuous and test_profile_batch pass, bench.txt's "same
#       tokens as smaller B" reads 1/1 and 4/4, AND bench.txt's B = 4 tok/s exceeds bench_base.txt's B = 4 by more
#       than the two rows' spreads (expected ~+10-15 %: docs/cuda.md). Otherwise the default goes back to one canvas
#       after another (src/sample/turbo.c seqs_after_forward: env = v && !strcmp(v, "1")).
#   (C) the top-K's rewrite (one warp a chunk, the shared-memory sorts; exact by construction, no switch) stays only
#       if test_turbo_topk passes here (its V 262,144 cases included); otherwise revert the commit that made it.
#   (D) DGEMMA_STACK_DENSE=inv stays a switch here whatever its rows (s26_bi14.sh's rule decides it; this call adds
#       its rows with the stacked SC product and the batched vocabulary work).
# Usage: bash dev/gpu/s27_sc14.sh $OUT
O=${1:?usage: dev/gpu/s27_sc14.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda \
    > /tmp/build_a.txt 2>&1; echo "build rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
wait $bp; tail -3 /tmp/build_a.txt >> "$O/log.txt"
tst() { # NAME ENV...: one test under the given environment, its rc in log.txt
  local t=$1; shift
  env "$@" DG_TEST_FILTER=$t timeout "$(call_cap 90)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "$t ${*:-(default)} rc $? $(el)" | tee -a "$O/log.txt"
}
tst test_turbo_sc_probs
tst test_turbo_topk
tst test_turbo_sc
tst test_turbo_generate
tst test_turbo_batch
tst test_turbo_batch DGEMMA_TURBO_BATCH=0
tst test_turbo_batch DGEMMA_STACK_DENSE=inv
tst test_turbo_batch_inv
tst test_turbo_batch9 DGEMMA_ENC_CHUNK=64
tst test_turbo_continuous
tst test_profile_batch
grep -E '^# turbo SC probabilities|^# cuda batch|^# emulation' "$O/tests.txt"
# a test that skips exits 0 too ("[  PASSED  ] 0 test(s)"): count the passes
echo "tests: $(grep -c '\[  PASSED  \] 1 test' "$O/tests.txt") of 11 passed, $(grep -c '^\[  SKIPPED \] 1 test' "$O/tests.txt") skipped, $(grep -c '^\[  FAILED  \] 1 test' "$O/tests.txt") failed" | tee -a "$O/log.txt"
wait $mk; tail -2 /tmp/mkrandom.log >> "$O/log.txt"
# the guards plan in 580 s of the call (less where DG_CALL_S says the call's limit is less: scripts/gpu_env.sh); each
# bench's timeout is capped by the call's real limit (call_cap), so no bench runs past it
left() { echo $(( $(call_budget 580) - ($(date +%s) - t0) )); }
bench() { # NAME CANVASES ENV...
  local nm=$1 cv=$2; shift 2
  rm -f /tmp/b_$nm.jsonl # (an earlier call's on a warm machine)
  echo "{\"kind\": \"run\", \"name\": \"$nm\", \"env\": \"$*\"}" >> "$O/bench.jsonl"
  env "$@" timeout "$(call_cap 180)" build/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases $cv --reps 2 \
    --profile -o /tmp/b_$nm.jsonl > "$O/$nm.txt" 2>&1
  echo "$nm ($cv${*:+, $*}) rc $? $(el)" | tee -a "$O/log.txt"
  cat /tmp/b_$nm.jsonl >> "$O/bench.jsonl" 2>/dev/null
}
bench bench 1,4,8
if [ "$(left)" -ge 85 ]; then bench bench_base 1,4 DGEMMA_TURBO_BATCH=0 DGEMMA_SC_PROBS=row
else echo "bench_base skipped: $(left) s left" | tee -a "$O/log.txt"; fi
if [ "$(left)" -ge 135 ]; then bench bench_inv 1,4,8 DGEMMA_STACK_DENSE=inv
else echo "bench_inv skipped: $(left) s left" | tee -a "$O/log.txt"; fi
grep -E '^\| [148] \|' "$O"/bench*.txt
grep -E '^\| (self-conditioning|sampler statistics|host and launch gaps) \||^per batched pass' "$O"/bench*.txt
echo "done $(el)" | tee -a "$O/log.txt"
