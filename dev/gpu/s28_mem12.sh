#!/bin/bash
# Session 28's call for issue 12's memory lines (helper mem12; docs/cuda.md "What the context allocates on CUDA at the
# 26B shapes", its "Session 28 (helper mem12)" part). Rule, written before any GPU run: one command, carry
# `.devdeb .devdata/gemma3`, default kind (H100), DG_CALL_S = the call's limit (600 if unset); < 200 s on a warm
# machine that has /tmp/dg26b (/tmp/dg26b.ok) and a built tree; <= 6 files back. Every item after the build runs
# under a guard of the time left and its own timeout; in order of value:
#   0. build/dgemma and build/libdgemma_cuda.so with s27_au12.sh's make line (a warm machine rebuilds nothing new),
#      then build/tests/test_cuda; beside it gpu_mkrandom_cpu_bg writes /tmp/dg26b (4-bit g64 experts) unless kept;
#   1. the 4-bit step protocol with the memory log: DGEMMA_CUDA_MEMLOG=1 `build/dgemma bench -m /tmp/dg26b --device
#      cuda --protocol step --contexts 1024,8192 --reps 2`: the P 8192 row's "device GiB (context held)" against
#      18 (s28 H100 before this branch: 18.29, before the context 17.18), and the log's lines (stderr, in step.txt):
#      used memory after the CUDA context, after the limits (stack 0, printf FIFO 0, malloc heap 0), after the
#      weights (one block), before/after each context's block, after its handles and graph cache, at its free;
#   2. the same command, --contexts 8192 --reps 1 --warmup 0, with DGEMMA_CUDA_LIMITS=0 DGEMMA_WEIGHT_BLOCK=0: the
#      code before this branch on the same machine (the baseline: both cuts off), then with DGEMMA_CUDA_LIMITS=0
#      alone (the weight block's share apart from the limits');
#   3. tests: test_weight_block (new: one block and one cudaMalloc per matrix give the same logits, word for word),
#      test_ctx_arena, test_branch, test_graphs, test_golden_logits, test_turbo_batch, test_quant_synth_logits
#      (the limits and the block under the whole decoder and turbo paths), then test_branch under
#      DGEMMA_BRANCH_WS_KIB=4096 (the dense branch's second cuBLAS workspace at 4 MiB instead of 32: passes only if
#      cuBLAS picks algorithms giving the one-stream order's words; a measurement, not a default);
#   4. with >= 150 s left: /tmp/dg26b3 (`--recipe all=bf16,experts=3`, CUDA CLI, -t 16, ~75 s) and item 1 on it
#      (--contexts 8192 --reps 1 --warmup 0): the 3-bit line against 15 (s28 H100: 15.54).
# Files back: log.txt, build_tail.txt, tests.txt, step.txt (every bench's whole output with its memory log),
# bench.jsonl (every JSON row, each run's after a {"kind": "run"} line), summary.md (the rows and the log lines).
# Usage: DG_CALL_S=600 bash dev/gpu/s28_mem12.sh $OUT
O=${1:?usage: dev/gpu/s28_mem12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=$(call_budget 560)
TP=/tmp/m12_ # left, guard, lim, bench (its files /tmp/m12_NAME.txt, .jsonl) and one: scripts/gpu_env.sh
rm -f /tmp/m12_*.txt /tmp/m12_*.jsonl
: > "$O/step.txt"; : > "$O/tests.txt"; : > "$O/bench.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset (the runtime default: lazy since CUDA 12.2)}" | tee -a "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so > /tmp/m12_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/m12_build_t.txt 2>&1
  echo "test build rc $? $(el)" >> "$O/log.txt" ) &
tb=$!
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt"
# 1. 4-bit, the branch's defaults, with the memory log
if [ -f /tmp/dg26b.ok ] && guard 60 "step 4-bit"; then
  ENVS="DGEMMA_CUDA_MEMLOG=1" DGEMMA_CUDA_MEMLOG=1 bench step4 "$(lim 120)" -m /tmp/dg26b --device cuda --protocol step \
    --contexts 1024,8192 --reps 2
fi
# 2. the baseline (both cuts off), then the limits off alone
if [ -f /tmp/dg26b.ok ] && guard 45 "step 4-bit, both cuts off"; then
  ENVS="DGEMMA_CUDA_MEMLOG=1 DGEMMA_CUDA_LIMITS=0 DGEMMA_WEIGHT_BLOCK=0" DGEMMA_CUDA_MEMLOG=1 DGEMMA_CUDA_LIMITS=0 \
    DGEMMA_WEIGHT_BLOCK=0 bench step4_off "$(lim 90)" -m /tmp/dg26b --device cuda --protocol step --contexts 8192 \
    --reps 1 --warmup 0
fi
if [ -f /tmp/dg26b.ok ] && guard 45 "step 4-bit, limits off"; then
  ENVS="DGEMMA_CUDA_MEMLOG=1 DGEMMA_CUDA_LIMITS=0" DGEMMA_CUDA_MEMLOG=1 DGEMMA_CUDA_LIMITS=0 \
    bench step4_nolim "$(lim 90)" -m /tmp/dg26b --device cuda --protocol step --contexts 8192 --reps 1 --warmup 0
fi
# 3. tests
wait $tb; tail -3 /tmp/m12_build_t.txt >> "$O/log.txt"
{ tail -3 /tmp/m12_build.txt; echo; tail -3 /tmp/m12_build_t.txt; } > "$O/build_tail.txt"
if [ -x build/tests/test_cuda ]; then
  one weight_block test_weight_block
  one ctx_arena test_ctx_arena
  one branch test_branch
  one graphs test_graphs
  one golden test_golden_logits
  one turbo_batch test_turbo_batch
  one quant_synth test_quant_synth_logits
  one branch_ws4096 test_branch DGEMMA_BRANCH_WS_KIB=4096
fi
# 4. 3-bit experts, with time left
if guard 150 "3-bit checkpoint and step"; then
  if [ ! -f /tmp/dg26b3.ok ] || [ ! -f /tmp/dg26b3/config.json ]; then
    rm -f /tmp/dg26b3.ok
    timeout "$(lim 120)" build/dgemma mkrandom /tmp/dg26b3 --source .cache/gemma3 --recipe all=bf16,experts=3 -t 16 \
      > /tmp/m12_mkrandom3.log 2>&1 && touch /tmp/dg26b3.ok
    echo "mkrandom 3-bit rc $? $(el)" | tee -a "$O/log.txt"
  fi
  [ -f /tmp/dg26b3.ok ] && guard 35 "step 3-bit" && ENVS="DGEMMA_CUDA_MEMLOG=1" DGEMMA_CUDA_MEMLOG=1 \
    bench step3 "$(lim 80)" -m /tmp/dg26b3 --device cuda --protocol step --contexts 8192 --reps 1 --warmup 0
fi
# summary: each run's rows and memory-log lines; the tests' verdicts
{
  echo "| run | P | step median ms | device GiB (context held) | before the context GiB |"; echo "|---|---|---|---|---|"
  for r in step4 step4_off step4_nolim step3; do
    awk -F'|' -v r=$r '/^\| [0-9]+ \| [0-9.]+ \|/ { printf "| %s | %s | %s | %s | %s |\n", r, $2, $7, $13, $14 }' \
      /tmp/m12_$r.txt 2>/dev/null
  done
  echo
  for r in step4 step4_off step4_nolim step3; do
    [ -f /tmp/m12_$r.txt ] && { echo "### $r"; grep "^dgemma cuda mem:" /tmp/m12_$r.txt | head -20; }
  done
  echo
  echo "tests: $(grep -c '^\[  PASSED  \]' "$O/tests.txt") passed lines, $(grep -c '^\[  FAILED  \]' "$O/tests.txt") failed lines"
  grep -E '^# (bf16|4-bit mixed)|^#   logits|^\[  (FAILED|PASSED)  \]|^## ' "$O/tests.txt" | head -40
} > "$O/summary.md"
cat "$O/summary.md" | tee -a "$O/log.txt" > /dev/null
echo "done $(el)" | tee -a "$O/log.txt"
