#!/bin/bash
# Session 28's one combined call (the lead's): the four helpers' scripts back to back on one fresh machine, their
# files packed into one archive (a call returns at most 8 files). Carry `.devdeb .devdata/gemma3`, default kind;
# DG_CALL_S = the call's limit (min(600, budget_left_s - 15)). Order by the developers' guide (the MoE kernels first):
#   0. at once, in the background: the two lab objects (s28_pf11.sh's and s28_lm14.sh's nvcc lines, the same flags
#      and logs, so their scripts run with LAB_PRE=1 and compile nothing), gpu_mkrandom_cpu_bg (/tmp/dg26b), and
#      the library, CLI and tests/test_cuda in build/ (the s27 make line: the sub-scripts' makes are then no-ops);
#   1. dev/gpu/s28_pf11.sh (issue 11: lab 50, 114, 119, 125-127 at uniform M 16, gathered and skewed T 256), <= 45 s;
#   2. the GPU checks of what landed untested there (~30 s, tests.txt): test_weight_block, test_ctx_arena,
#      test_graphs, test_turbo_batch (mem12's one weight block and CUDA limits at 0 under the default paths),
#      test_vocab_chain, test_vocab_modes (cl12: DGEMMA_VOCAB=one deleted), test_gemm_inv under
#      DGEMMA_STACK_DENSE=inv (the SC shape through INV_CFG's sc_soft line, sc_prod's hook out: must say "(table)"
#      and 0 words differ), test_branch with DGEMMA_BRANCH_WS_KIB=4096 (a measurement, not a default);
#   3. mem12's item 1: the 4-bit step protocol at 1K and 8K with DGEMMA_CUDA_MEMLOG=1 (step4.txt; its rule in
#      dev/gpu/s28_mem12.sh's header: the P 8192 row's device GiB against 18);
#   4. dev/gpu/s28_lm14.sh (lab 50, 121, 130-133 at M 16-128 and T 1024 / 2048) only with >= 80 s left;
#   5. dev/gpu/s28_pp12.sh with the rest (the 1024-token prefill's stages).
# (Session 28's first try of this call was taken back by the device service after ~107 s: the budget left, ~497 s,
# holds the build (~290 s fresh) and items 1-3; 4 and 5 go to the next session.)
# Each sub-script's rule is in its own header, written before this call. Files back: log.txt (this script's lines),
# s28.tgz (every sub-script's folder).
# Usage: DG_CALL_S=600 bash dev/gpu/s28_final.sh $OUT
O=${1:?usage: dev/gpu/s28_final.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
W=/tmp/s28out; rm -rf "$W"; mkdir -p "$W"
A="-gencode=arch=compute_90a,code=sm_90a"
END=$(( t0 + ${DG_CALL_S:-600} - 20 )) # the archive is made by then
rest() { echo $(( END - $(date +%s) )); }
sub() { # NAME CAP SCRIPT [ENV...]: SCRIPT $W/NAME with DG_CALL_S = min(CAP, the time left)
  local n=$1 cap=$2 s=$3 l; shift 3; l=$(rest); [ "$l" -gt "$cap" ] && l=$cap
  if [ "$l" -lt 30 ]; then echo "$n skipped: $(rest) s left $(el)" | tee -a "$O/log.txt"; return; fi
  env "$@" DG_CALL_S=$l timeout "$l" bash "$s" "$W/$n" > "$W/$n.out" 2>&1
  echo "$n rc $? (limit $l s) $(el)" | tee -a "$O/log.txt"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
(
  mkdir -p build-pf build-lm; rm -f build-pf/moe_quant* build-lm/moe_quant*
  nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
    -o build-pf/moe_quant.o > /tmp/pf_lab_build.txt 2>&1 &
  nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -DLAB_LM -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
    -o build-lm/moe_quant.o > /tmp/lm_lab_build.txt 2>&1 &
  wait; echo "lab objects: pf $(ls -s build-pf/moe_quant.o 2>/dev/null | cut -d' ' -f1) KiB, lm $(ls -s build-lm/moe_quant.o 2>/dev/null | cut -d' ' -f1) KiB $(el)" >> "$O/log.txt"
) &
lab=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda > /tmp/final_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/final_build.txt >> "$O/log.txt"
wait $lab
sub pf11 45 dev/gpu/s28_pf11.sh LAB_PRE=1
wait $mk
# the GPU checks of what landed on main untested there (cl12's deletions, mem12's cuts: their default paths), ~30 s
for t in test_weight_block test_ctx_arena test_graphs test_turbo_batch test_vocab_chain test_vocab_modes \
         "test_gemm_inv DGEMMA_STACK_DENSE=inv" "test_branch DGEMMA_BRANCH_WS_KIB=4096"; do
  [ "$(rest)" -ge 40 ] || { echo "tests stopped: $(rest) s left" | tee -a "$O/log.txt"; break; }
  set -- $t; f=$1; shift
  { echo "## $f $*"; env "$@" DG_TEST_FILTER=$f timeout 40 build/tests/test_cuda; } >> "$W/tests.txt" 2>&1
  echo "$f ${*:-(default)} rc $? $(el)" | tee -a "$O/log.txt"
done
grep -E '^# (vocabulary|gemm inv shape|bf16|4-bit mixed)' "$W/tests.txt" 2>/dev/null | cut -c1-220 >> "$O/log.txt"
# mem12's item 1: the 4-bit step protocol with the memory log (the 8K line against 18 GiB; steps against s28's au12)
if [ -f /tmp/dg26b.ok ] && [ "$(rest)" -ge 55 ]; then
  l=$(( $(rest) - 5 )); [ "$l" -gt 90 ] && l=90
  DGEMMA_CUDA_MEMLOG=1 timeout $l build/dgemma bench -m /tmp/dg26b --device cuda --protocol step --contexts 1024,8192 \
    --reps 2 -o "$W/step4.jsonl" > "$W/step4.txt" 2>&1
  echo "step4 (DGEMMA_CUDA_MEMLOG=1) rc $? $(el)" | tee -a "$O/log.txt"
  grep -E '^\| [0-9]+ \| [0-9.]+ \|' "$W/step4.txt" | cut -c1-200 >> "$O/log.txt"
fi
sub lm14 80 dev/gpu/s28_lm14.sh LAB_PRE=1
sub pp12 600 dev/gpu/s28_pp12.sh
for n in pf11 lm14 pp12; do
  { echo "== $n"; tail -12 "$W/$n/log.txt" 2>/dev/null; } >> "$O/log.txt"
done
tar czf "$O/s28.tgz" -C "$W" . 2>> "$O/log.txt"
echo "archive $(ls -s "$O/s28.tgz" | cut -d' ' -f1) KiB; done $(el)" | tee -a "$O/log.txt"
