#!/bin/bash
# Session 28's one combined call (the lead's): the four helpers' scripts back to back on one fresh machine, their
# files packed into one archive (a call returns at most 8 files). Carry `.devdeb .devdata/gemma3`, default kind;
# DG_CALL_S = the call's limit (min(600, budget_left_s - 15)). Order by the developers' guide (the MoE kernels first):
#   0. at once, in the background: the two lab objects (s28_pf11.sh's and s28_lm14.sh's nvcc lines, the same flags
#      and logs, so their scripts run with LAB_PRE=1 and compile nothing), gpu_mkrandom_cpu_bg (/tmp/dg26b), and
#      the library, CLI and tests/test_cuda in build/ (the s27 make line: the sub-scripts' makes are then no-ops);
#   1. dev/gpu/s28_pf11.sh (issue 11: lab 50, 114, 119, 125-127 at uniform M 16, gathered and skewed T 256), <= 60 s;
#   2. dev/gpu/s28_lm14.sh (issues 14 and 12: lab 50, 121, 130-133 at M 16-128 and T 1024 / 2048), <= 80 s;
#   3. cl12's GPU checks: test_vocab_chain, test_vocab_modes (DGEMMA_VOCAB=one deleted) and test_gemm_inv under
#      DGEMMA_STACK_DENSE=inv (the SC shape through INV_CFG's sc_soft line now that sc_prod's hook is out);
#   4. dev/gpu/s28_mem12.sh, <= 140 s (issue 12's memory lines: one weight block, CUDA limits at 0; its tests; its
#      own guards drop its later items, the 3-bit checkpoint first, when time runs short);
#   5. dev/gpu/s28_pp12.sh with the rest (issue 12: the 1024-token prefill's stages).
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
sub pf11 60 dev/gpu/s28_pf11.sh LAB_PRE=1
sub lm14 80 dev/gpu/s28_lm14.sh LAB_PRE=1
wait $mk
{
  for t in test_vocab_chain test_vocab_modes; do
    [ "$(rest)" -ge 60 ] || break
    DG_TEST_FILTER=$t timeout 40 build/tests/test_cuda >> "$W/cl12_tests.txt" 2>&1; echo "cl12 $t rc $? $(el)"
  done
  if [ "$(rest)" -ge 60 ]; then
    DGEMMA_STACK_DENSE=inv DG_TEST_FILTER=test_gemm_inv timeout 50 build/tests/test_cuda >> "$W/cl12_tests.txt" 2>&1
    echo "cl12 test_gemm_inv (DGEMMA_STACK_DENSE=inv) rc $? $(el)"
  fi
} | tee -a "$O/log.txt"
grep -E '^# (vocabulary|gemm inv shape)' "$W/cl12_tests.txt" 2>/dev/null | cut -c1-200 >> "$O/log.txt"
sub mem12 140 dev/gpu/s28_mem12.sh
sub pp12 600 dev/gpu/s28_pp12.sh
for n in pf11 lm14 pp12 mem12; do
  { echo "== $n"; tail -12 "$W/$n/log.txt" 2>/dev/null; } >> "$O/log.txt"
done
tar czf "$O/s28.tgz" -C "$W" . 2>> "$O/log.txt"
echo "archive $(ls -s "$O/s28.tgz" | cut -d' ' -f1) KiB; done $(el)" | tee -a "$O/log.txt"
